"""Top-k answers to (head, relation, ?) from a run's FAISS index."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.linkpred.model import LinkPredictor


@dataclass
class Prediction:
    rank: int
    entity: str
    text: str
    score: float


@torch.no_grad()
def predict(model: LinkPredictor, graph: KnowledgeGraph, index, *, head: str, relation: str, top_k: int = 10,
            inverse: bool = False, filter_known: bool = False) -> tuple[int, int, list[Prediction]]:
    """Resolve ``head``/``relation`` by id or text and return (head id, relation id, predictions)."""
    h = graph.find_entity(head)
    r = graph.find_relation(relation) + (graph.num_relations if inverse else 0)
    q = model.encode_queries([h], [r]).float().cpu().numpy().astype(np.float32)  # (1, dim)
    known = set()
    if filter_known:
        known = set(graph.all_answers[graph.hr_keys(np.array([h]), np.array([r]))].indices.tolist())
    k = min(graph.num_entities, top_k + len(known))
    scores, ids = index.search(q, k)
    out = []
    for s, e in zip(scores[0], ids[0]):
        if e < 0 or int(e) in known:
            continue
        out.append(Prediction(len(out) + 1, graph.entities[e], graph.full_texts[e], float(s)))
        if len(out) == top_k:
            break
    return h, r, out


def answer(run, model: LinkPredictor, graph: KnowledgeGraph, index, **query) -> tuple[int, int, list[Prediction]]:
    """``kgc predict``'s answers (the CLI and ``kgc.Run.predict``): the fused text + structure score over every
    entity when the run has a structural model (:func:`kgc.linkpred.structure.predict_fused`), else the FAISS
    index's top k. ``query``: head, relation, top_k, inverse, filter_known."""
    from kgc.linkpred.structure import has_structure, predict_fused

    if has_structure(run):
        h, r, preds, _ = predict_fused(run, model, graph, **query)
        return h, r, preds
    return predict(model, graph, index, **query)
