"""Graph formats, a family: each reads one folder layout into a :class:`~kgc.data.graph.KnowledgeGraph`
(:class:`~kgc.data.formats.base.GraphFormat`, registered in :data:`kgc.registry.GRAPH_FORMATS`).

Built-in: ``kgbert`` (:mod:`kgc.data.formats.kgbert`: triples with ``entity2text.txt`` and ``relation2text.txt``)
and ``label_tsv`` (:mod:`kgc.data.formats.label_tsv`: PyKEEN's label TSV, triples alone); the GraIL inductive
splits are derived into KG-BERT folders (:mod:`kgc.data.grail`). A parquet or OGB reader is one module with a
``GraphFormat`` — its ``markers``, ``recognises``, ``read`` — registered by its import (or by a package's
``kgc.graph_formats`` entry point): :func:`read_graph` then reads the folders it recognises, the dataset finder and
the catalog know them by its markers, and ``kgc data check`` names its layout.

Relation ids ``0..R-1`` are the forward relations, ``R..2R-1`` their inverses (text ``inverse <r>``).
"""

from __future__ import annotations

from pathlib import Path

from kgc.data.formats.base import GraphFormat
from kgc.data.formats.kgbert import KGBERT
from kgc.data.formats.label_tsv import LABEL_TSV
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.registry import GRAPH_FORMATS

GRAPH_FORMATS.register(KGBERT)
GRAPH_FORMATS.register(LABEL_TSV)


def markers() -> tuple[str, ...]:
    """The files any registered format's folder holds one of (what makes a folder a graph dataset)."""
    return tuple(dict.fromkeys(m for name in GRAPH_FORMATS for m in GRAPH_FORMATS[name].markers))


def detect(folder: Path) -> GraphFormat:
    """The registered format that reads ``folder``: the one of lowest rank that recognises it."""
    members = sorted((GRAPH_FORMATS[name] for name in GRAPH_FORMATS), key=lambda f: (f.rank, f.name))
    return next(f for f in members if f.recognises(folder))


def read_graph(folder: Path, *, long_text: bool = False, optional_splits: tuple[str, ...] = ()) -> KnowledgeGraph:
    """The graph of a dataset folder, read by its format (:func:`detect`); ``optional_splits`` may be absent (read
    as empty): an inductive test folder needs no train split. Every fallback taken is listed in ``graph.notes``
    (``kgc data check`` and ``kgc train`` print them); a folder that looks half KG-BERT (texts for relations but not
    for entities) is an error, not a fallback. A graph of 100,000 entities or more is kept in the graph cache
    (:mod:`kgc.data.graph_cache`) and read from there while the folder's files stay as they are; the word index of
    its names ("did you mean") is written beside the cache when the cache is."""
    from kgc.data import graph_cache

    folder = Path(folder)
    if not folder.is_dir():
        raise KGCError(f"{folder}: not a folder. A dataset is a folder of train/dev/test triples and texts "
                       "(docs/own-graph.md).")
    fmt = detect(folder)
    options = {"long_text": long_text, "optional_splits": sorted(optional_splits), "format": fmt.name}
    if (cached := graph_cache.load(folder, options)) is not None:
        return KnowledgeGraph(**cached)
    graph = fmt.read(folder, long_text=long_text, optional_splits=tuple(optional_splits))
    if graph_cache.store(graph, folder, options) is not None:
        graph._name_index  # noqa: B018 — "did you mean" kept beside the new cache: a served graph has it at start
    return graph


def load_graph(dataset: str, *, path: str | None = None, long_text: bool = False) -> KnowledgeGraph:
    """The graph of a catalog dataset (or of ``path``), as :func:`read_graph` reads it."""
    from kgc.data.catalog import find_dataset

    folder, _ = find_dataset(dataset, path)
    return read_graph(folder, long_text=long_text)
