"""GraIL's inductive protocol: each test triple ranked against sampled corrupted triples, not against every entity.

GraIL (Teru et al. 2020, ``test_ranking.py``'s ``get_neg_samples_replacing_head_tail``) and the papers that report
on its splits beside it (NBFNet, RED-GNN) give Hits@10 "against 50 negatives". What GraIL's code does, and what is
done here:

* for each test triple (h, r, t) of the inference graph, two lists of 50 candidates: the triple itself and 49
  triples with the tail replaced (h, r, t'), and the triple and 49 with the head replaced (h', r, t);
* t' (h') drawn uniformly, with replacement, from the inference graph's entities — those of its ``train.txt`` (the
  known graph) and ``test.txt`` (GraIL's ``entity2id`` is built from those two files) — and kept unless it equals
  the other end (no self-loop) or the corrupted triple is in the known graph (``adj_list``: ``train.txt`` only,
  so a draw that is another *test* answer, or t itself, is kept, as GraIL keeps it);
* the rank of the true triple among its 50 (here PyKEEN's realistic rank: a tie counts half; GraIL sorts, so a
  tie falls either way), both lists pooled: Hits@10 over 2 × (test triples) ranks. MRR and Hits@1/3 are
  reported too (RED-GNN's tables quote them on this protocol).

kgc scores (h, r, t') as the cosine of the query tower's (h | r) and the tail tower's t' — the same scores as its
full ranking — and a replaced head through the inverse query (t | inverse r) against h'. The draws come from a
``numpy`` generator seeded by ``seed`` (GraIL's come from numpy's global state): the same distribution, not the
same draws. Every query's 49 negatives are written with its ranks (the ``negatives`` column of ``ranks.tsv``), so
any figure can be recomputed from the file.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.linkpred.evaluation.ranking import Evaluation, new_evaluator, query_directions, rank_dense, record_ranks

NEGATIVES = 50  # candidates per list, the true triple included (GraIL's num_samples)


def sample_negatives(graph: KnowledgeGraph, queries: np.ndarray, pool: np.ndarray, count: int,
                     rng: np.random.Generator) -> np.ndarray:
    """(queries, count) entity ids: for each query (e, r, answer) — a forward or inverse relation id — ``count``
    draws from ``pool`` (uniform, with replacement) that are not ``e`` and whose triple (e, r, draw) is not in the
    graph's ``train`` split (read in both directions, so an inverse query rejects the replaced-head triples)."""
    known = graph.both_directions("train")
    n_rel, n_ent = 2 * graph.num_relations, graph.num_entities
    keys = np.unique((known[:, 0] * n_rel + known[:, 1]) * n_ent + known[:, 2])
    out = np.empty((len(queries), count), dtype=np.int64)
    for i, (e, r, _) in enumerate(queries):
        got: list[np.ndarray] = []
        need = count
        base = (int(e) * n_rel + int(r)) * n_ent
        while need > 0:
            draws = pool[rng.integers(0, len(pool), size=2 * need + 8)]
            at = np.searchsorted(keys, base + draws).clip(max=max(len(keys) - 1, 0))
            known_triple = (keys[at] == base + draws) if len(keys) else np.zeros(len(draws), dtype=bool)
            kept = draws[(draws != e) & ~known_triple][:need]
            got.append(kept)
            need -= len(kept)
        out[i] = np.concatenate(got)
    return out


Scores = Callable[[np.ndarray, np.ndarray], torch.Tensor]  # (queries (b, 3), candidates (b, k)) -> (b, k) scores


@torch.no_grad()
def sampled_evaluate(model, graph: KnowledgeGraph, split: str = "test", *, negatives: int = NEGATIVES,
                     seed: int = 0, batch_size: int = 256, progress: bool = False) -> Evaluation:
    """GraIL's protocol (module docstring) over ``graph`` — an inference graph whose ``train`` split is the graph
    known at test time — for the triples of ``split``, scored by ``model``'s towers; ``negatives`` candidates per
    list, the true one included. Ranks in PyKEEN's layout (``number_of_options`` = ``negatives``), each query's
    negatives in its row."""
    from kgc.linkpred.evaluation.scoring import entity_states

    start = time.perf_counter()
    model.eval()
    directions = query_directions(graph, graph.splits[split])
    heads = np.unique(np.concatenate([q[:, 0] for q in directions.values()]))
    engine, table, source, _, _ = entity_states(model, batch_size=batch_size, progress=progress, heads=heads)
    table = table.to(model.device)
    spent = [0.0]

    def scores(queries: np.ndarray, candidates: np.ndarray) -> torch.Tensor:
        tick = time.perf_counter()
        q = engine(queries[:, 0], queries[:, 1]).float().to(table.device)  # (b, dim)
        spent[0] += time.perf_counter() - tick
        cand = torch.as_tensor(candidates, device=table.device)
        return torch.einsum("bd,bkd->bk", q, table[cand].float()).cpu()

    ev = sampled_ranks(graph, split, scores, negatives=negatives, seed=seed, batch_size=batch_size)
    ev.seconds = time.perf_counter() - start
    ev.results["kgc"].update({"evaluation_seconds": round(ev.seconds, 3), "precision": model.precision,
                              "query_encoding_seconds": round(spent[0], 3), "entity_embeddings": source})
    return ev


def sampled_ranks(graph: KnowledgeGraph, split: str, scores: Scores, *, negatives: int = NEGATIVES, seed: int = 0,
                  batch_size: int = 256) -> Evaluation:
    """The ranks of GraIL's protocol for any scorer: ``scores(queries, candidates)`` the (b, k) scores of each
    query (e, r, answer) against its candidates (the answer first). The draws depend on ``graph``, ``split`` and
    ``seed`` only, so two scorers with the same seed are ranked against the same negatives."""
    from pykeen.evaluation.ranks import Ranks

    from kgc.errors import KGCError

    if negatives < 2:
        raise KGCError(f"--negatives {negatives}: give at least 2 candidates (the true triple and one negative)")
    triples = graph.splits[split]
    directions = query_directions(graph, triples)
    pool = np.unique(np.concatenate([graph.splits["train"][:, [0, 2]].ravel(), triples[:, [0, 2]].ravel()]))
    rng = np.random.default_rng(seed)
    evaluator = new_evaluator()
    rows = []
    for target, queries in directions.items():
        drawn = sample_negatives(graph, queries, pool, negatives - 1, rng)
        candidates = np.concatenate([queries[:, 2:3], drawn], axis=1)  # (n, negatives): the true answer first
        got: dict[str, list[np.ndarray]] = {"realistic": [], "optimistic": [], "pessimistic": []}
        for s in range(0, len(queries), batch_size):
            block = scores(queries[s: s + batch_size], candidates[s: s + batch_size]).float()
            ranks = Ranks.from_scores(true_score=block[:, :1], all_scores=block)
            record_ranks(evaluator, target, ranks, negatives)
            for kind in got:
                got[kind].append(ranks.to_type_dict()[kind].float().numpy())
        realistic, optimistic, pessimistic = (np.concatenate(got[k]) for k in ("realistic", "optimistic",
                                                                               "pessimistic"))
        for i, (h, rel, a) in enumerate(queries):
            rows.append({"side": target, "head": graph.entities[h], "relation": graph.relation_label(int(rel)),
                         "answer": graph.entities[a], "rank": float(realistic[i]),
                         "optimistic": float(optimistic[i]), "pessimistic": float(pessimistic[i]),
                         "negatives": ",".join(graph.entities[e] for e in drawn[i])})
    results = dict(evaluator.finalize().to_dict())
    results["kgc"] = {"split": split, "triples": int(len(triples)), "queries": int(2 * len(triples)),
                      "entities": graph.num_entities, "dataset": graph.source,
                      "protocol": {"name": "grail-sampled", "candidates": negatives, "negatives": negatives - 1,
                                   "seed": seed, "pool": int(len(pool)),
                                   "pool_from": "the inference graph's train (known) and evaluated triples",
                                   "rejected": "the other end (a self-loop) and known-graph triples",
                                   "ties": "realistic (half)", "source": "GraIL test_ranking.py"},
                      "search": None, "rerank": None, "head_above_gold": None, "sampled": False,
                      "inductive": None, "structure": None, "components": None}
    return Evaluation(results=results, ranks=rows, seconds=0.0, variants={"text": results},
                      variant_ranks={"text": np.array([r["rank"] for r in rows])},
                      query_relations=np.concatenate([q[:, 1] for q in directions.values()]))


def filtered_ranks(graph: KnowledgeGraph, split: str, scores: Callable[[np.ndarray], torch.Tensor], *,
                   batch_size: int = 256) -> Evaluation:
    """The full filtered ranking of ``split`` for any scorer over every entity
    (:func:`~kgc.linkpred.evaluation.ranking.rank_dense`: the PageRank floor, rules, text + rules), as an
    :class:`Evaluation` with PyKEEN's metrics."""
    triples = graph.splits[split]
    results = dict(rank_dense(graph, triples, scores, batch_size=batch_size).finalize().to_dict())
    results["kgc"] = {"split": split, "triples": int(len(triples)), "queries": int(2 * len(triples)),
                      "entities": graph.num_entities, "dataset": graph.source}
    return Evaluation(results=results, ranks=[], seconds=0.0)
