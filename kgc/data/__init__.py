"""Datasets: catalog lookup, readers (KG-BERT folder, PyKEEN label TSV), entity/relation texts."""

from kgc.data.catalog import CATALOG, find_dataset, list_datasets
from kgc.data.formats import load_graph
from kgc.data.graph import KnowledgeGraph

__all__ = ["CATALOG", "KnowledgeGraph", "find_dataset", "list_datasets", "load_graph"]
