"""Top-k answers to (head, relation, ?): by cosine from a run's FAISS index, or by the fused text + structure
score over every entity (:func:`kgc.linkpred.structure.predict_fused`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Prediction:
    rank: int
    entity: str
    text: str
    score: float


PREDICTION_COLUMNS = ["rank", "entity", "text", "score"]


@dataclass
class Answers:
    """:meth:`LinkPredRun.answer`: the query as it was resolved and its ranked answers (what ``kgc predict``
    prints)."""
    run: Path
    head: str                # entity id (the text given was resolved to it)
    relation: str            # relation label; ``inverse`` answers (?, relation, head)
    head_text: str           # the head's full text
    relation_text: str       # the relation's text, "inverse …" for the inverse direction
    predictions: list        # Prediction: rank, entity, text, score
    seconds: float           # answering, index loading excluded

    def frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame([{c: getattr(p, c) for c in PREDICTION_COLUMNS} for p in self.predictions],
                            columns=PREDICTION_COLUMNS)


def known_answers(graph: KnowledgeGraph, head: int, relation: int) -> np.ndarray:
    """Entity ids already known as answers of (head, relation) in train + dev + test (none for an added head)."""
    if head >= graph.num_entities:
        return np.empty(0, dtype=np.int64)
    return graph.all_answers[graph.hr_keys(np.array([head]), np.array([relation]))].indices


@torch.no_grad()
def search_answers(query_vector: np.ndarray, index, graph: KnowledgeGraph, *, top_k: int = 10,
                   exclude: set[int] = frozenset()) -> list[Prediction]:
    """The index's top ``top_k`` entities for one query vector (1, dim), leaving out the ids in ``exclude``.
    ``graph`` names the index's rows (the run's graph with its added entities)."""
    from kgc.linkpred.index_types import search_index

    k = min(index.ntotal, top_k + len(exclude))
    scores, ids = search_index(index, query_vector, k)
    out = []
    for s, e in zip(scores[0], ids[0]):
        if e < 0 or int(e) in exclude:
            continue
        out.append(Prediction(len(out) + 1, graph.entities[e], graph.full_texts[e], float(s)))
        if len(out) == top_k:
            break
    return out


def rank_scores(scores: torch.Tensor, graph: KnowledgeGraph, *, top_k: int = 10,
                exclude: set[int] = frozenset()) -> list[Prediction]:
    """The top ``top_k`` of dense (entities,) scores (fused), leaving out ``exclude``."""
    scores = scores.clone()
    if exclude:
        scores[torch.as_tensor(sorted(exclude))] = float("-inf")
    order = torch.argsort(scores, descending=True)[:top_k]
    return [Prediction(i + 1, graph.entities[e], graph.full_texts[e], float(scores[e]))
            for i, e in enumerate(order.tolist()) if torch.isfinite(scores[e])]
