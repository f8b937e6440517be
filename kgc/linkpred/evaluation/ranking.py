"""The filtered link-prediction ranking protocol, alone: blocked and budgeted, fed to PyKEEN's evaluator.

Both directions: tail prediction ``(h, r, ?)`` and head prediction as ``(t, inverse r, ?)``. The filtered
setting removes every known true answer from train + dev + test except the gold (read per block from the
sparse filter index). Scores come from a *block function* ``scores(r0, r1, c0, c1)`` — the unfiltered
(rows, entities) block of queries ``r0:r1`` against entities ``c0:c1`` — so text cosines, cosines with SimKGC's
re-ranking boost and fused text + structure scores all rank through :func:`rank_queries`, in blocks of at most
``max_score_bytes``. Each block is folded into pykeen's rank counts (:class:`pykeen.evaluation.ranks.Ranks`:
optimistic, pessimistic, realistic) and the ranks go to pykeen's ``RankBasedEvaluator``, whose ``finalize``
computes the metrics (realistic ranks with ties, MRR, Hits@k, …).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import scipy.sparse as sp
import torch

from kgc.data.graph import KnowledgeGraph

if TYPE_CHECKING:  # pykeen loads when something is ranked
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.evaluation.ranks import Ranks

DEFAULT_MAX_SCORE_BYTES = 256 * 2**20
BlockScores = Callable[[int, int, int, int], torch.Tensor]  # (r0, r1, c0, c1) -> (r1 - r0, c1 - c0) float32, CPU


@dataclass
class Evaluation:
    """One evaluation: ``results`` (PyKEEN's ``RankBasedMetricResults.to_dict()`` + a ``"kgc"`` block), ``ranks``
    (one row per query, ranks.tsv), ``seconds``; ``variants``: the results of every score variant ranked in the
    same pass (the fused α grid), keyed by variant."""
    results: dict
    ranks: list[dict]
    seconds: float
    variants: dict = field(default_factory=dict)
    variant_ranks: dict = field(default_factory=dict)  # variant -> (queries,) realistic ranks, in ``ranks``' order
    query_relations: np.ndarray | None = None  # (queries,) each query's relation id (0..2R-1), in that order

    def metric(self, side: str = "both", rank_type: str = "realistic", key: str = "inverse_harmonic_mean_rank"):
        return float(self.results[side][rank_type][key])


def new_evaluator() -> "RankBasedEvaluator":
    from pykeen.evaluation import RankBasedEvaluator

    return RankBasedEvaluator(filtered=True, clear_on_finalize=False)


def query_directions(graph: KnowledgeGraph, triples: np.ndarray) -> dict[str, np.ndarray]:
    """The two queries of each triple (h, r, t): tail prediction (h, r, ?) and head prediction (t, r + R, ?)."""
    return {"tail": triples, "head": graph.inverse_queries(triples)}


def n_hop_neighbours(graph: KnowledgeGraph, heads: np.ndarray, n_hop: int) -> dict[int, np.ndarray]:
    """Entities within ``n_hop`` of each head on the undirected train graph (the head itself included)."""
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(graph.num_entities))
    g.add_edges_from(graph.splits["train"][:, [0, 2]].tolist())
    return {int(h): np.fromiter(nx.single_source_shortest_path_length(g, int(h), cutoff=n_hop), dtype=np.int64)
            for h in np.unique(heads)}


def mask_known_(scores: torch.Tensor, known: sp.spmatrix, answers: np.ndarray, offset: int = 0) -> torch.Tensor:
    """NaN (ignored by pykeen's ranks) at every known answer except the gold, in place.

    scores (rows, cols) cover entities ``offset ..``; ``known`` (rows, cols) sparse, the same block of the filter
    index; ``answers`` (rows,) the gold entity ids."""
    sub = known.tocoo()
    not_gold = sub.col + offset != answers[sub.row]
    scores[torch.as_tensor(sub.row[not_gold]), torch.as_tensor(sub.col[not_gold])] = float("nan")
    return scores


def score_blocks(n_queries: int, n_entities: int, max_score_bytes: int) -> tuple[int, int]:
    """(queries, entities) per dense score block: whole rows while a row fits the budget; else one query at a
    time against entity blocks of half the budget (the gold's block is kept beside the current one)."""
    per_row = 4 * n_entities
    if per_row <= max_score_bytes:
        return max(1, min(n_queries, max_score_bytes // per_row)), n_entities
    return 1, max(1, min(n_entities, max_score_bytes // 8))


def cosine_blocks(query_vectors: torch.Tensor, entity_table: torch.Tensor, heads: np.ndarray, *,
                  boost: dict[int, np.ndarray] | None = None, boost_weight: float = 0.0) -> BlockScores:
    """The block function of cosine scores: ``query_vectors`` (batch, dim) against ``entity_table`` (entities,
    dim), on the table's device; ``boost``: SimKGC's re-ranking, ``boost_weight`` added to the entities within n
    hops of each query's head (``heads`` (batch,))."""
    q_all = query_vectors.float().to(entity_table.device)

    def block(r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        out = (q_all[r0:r1] @ entity_table[c0:c1].t()).cpu()
        if boost:
            for i in range(r0, r1):
                near = boost[int(heads[i])]
                near = near[(near >= c0) & (near < c1)]
                out[i - r0, torch.as_tensor(near - c0)] += boost_weight
        return out

    return block


def rank_queries(scores: BlockScores, queries: np.ndarray, known: sp.csr_matrix, n_entities: int, *,
                 max_score_bytes: int = DEFAULT_MAX_SCORE_BYTES, counts: dict[str, int] | None = None) -> "Ranks":
    """Filtered ranks of ``queries`` (batch, 3) = (head, relation, answer), in pykeen's rank types.

    ``scores(r0, r1, c0, c1)``: the block function; ``known`` (batch, entities) sparse: the true answers to
    filter (the gold among them is kept). Blocks of queries × entities (:func:`score_blocks`, at most
    ``max_score_bytes`` of float32 alive at once) are filtered from ``known``'s rows and folded into pykeen's
    counts (scores above the gold, not below it, finite), so no (batch, entities) matrix is formed. The gold's
    score is read from its own block (the same kernel that scores its rivals, so an entity with an identical
    vector ties exactly). The ranks equal ``pykeen.evaluation.ranks.Ranks.from_scores`` on the dense filtered
    matrix. ``counts["head_above_gold"]`` adds the queries whose own head outscores the gold."""
    from pykeen.evaluation.ranks import Ranks

    n = len(queries)
    answers, heads = queries[:, 2], queries[:, 0]
    larger, not_smaller, finite = (torch.zeros(n, dtype=torch.long) for _ in range(3))
    head_above = 0
    known = known.tocsr()
    rows_per, cols_per = score_blocks(n, n_entities, max_score_bytes)

    def block(r0: int, r1: int, c0: int) -> torch.Tensor:
        """(rows, cols) filtered scores; the gold stays."""
        c1 = min(n_entities, c0 + cols_per)
        return mask_known_(scores(r0, r1, c0, c1), known[r0:r1, c0:c1], answers[r0:r1], offset=c0)

    for r0 in range(0, n, rows_per):
        r1 = min(n, r0 + rows_per)
        first = (answers[r0] // cols_per) * cols_per  # rows_per > 1 only when one block spans every entity
        kept = block(r0, r1, first)
        true = kept[torch.arange(r1 - r0), torch.as_tensor(answers[r0:r1] - first)].unsqueeze(1)  # (rows, 1)
        for c0 in range(0, n_entities, cols_per):
            block_scores = kept if c0 == first else block(r0, r1, c0)
            larger[r0:r1] += (block_scores > true).sum(1)
            not_smaller[r0:r1] += (block_scores >= true).sum(1)
            finite[r0:r1] += torch.isfinite(block_scores).sum(1)
            if counts is not None:
                h = heads[r0:r1]
                own = np.flatnonzero((h >= c0) & (h < c0 + cols_per) & (h != answers[r0:r1]))
                score = block_scores[torch.as_tensor(own), torch.as_tensor(h[own] - c0)]  # NaN: head is an answer
                head_above += int((score > true[torch.as_tensor(own), 0]).sum())
    if counts is not None:
        counts["head_above_gold"] = counts.get("head_above_gold", 0) + head_above
    optimistic, pessimistic = larger + 1, not_smaller
    return Ranks(optimistic=optimistic, pessimistic=pessimistic, realistic=(optimistic + pessimistic).float() * 0.5,
                 number_of_options=finite)


def rank_retrieved(query_vectors: torch.Tensor, entity_table: torch.Tensor, queries: np.ndarray,
                   known: sp.csr_matrix, retrieved: np.ndarray, counts: dict[str, int] | None = None) -> "Ranks":
    """Filtered ranks as a FAISS index would give them: among the ``retrieved`` candidates (batch, K) of an
    approximate index (ids ``-1`` or beyond the table ignored), re-scored exactly from ``entity_table``.

    The gold is scored in the same batched product as its rivals. A gold the index did not retrieve ranks
    right after every unfiltered candidate it did (``counts["gold_missed"]`` counts those queries): Hits@k for
    k ≤ K are what a deployed search returns; for an exact index they equal the exhaustive ones, and MRR
    differs from the exhaustive MRR only through golds ranked below K."""
    from pykeen.evaluation.ranks import Ranks

    n, n_entities = len(queries), entity_table.size(0)
    answers = queries[:, 2]
    known = known.tocsr()
    ids = np.where((retrieved >= 0) & (retrieved < n_entities), retrieved, -1)
    found = (ids == answers[:, None]).any(1)
    cands = np.concatenate([answers[:, None], np.where(ids == answers[:, None], -1, ids)], axis=1)  # gold first
    valid = cands >= 0
    vectors = entity_table[torch.as_tensor(np.where(valid, cands, 0))]  # (batch, 1 + K, dim)
    scores = torch.einsum("bd,bkd->bk", query_vectors.float().to(entity_table.device), vectors).cpu()
    is_known = np.zeros(cands.shape, dtype=bool)
    for i in range(n):
        row = known.indices[known.indptr[i]: known.indptr[i + 1]]
        is_known[i, 1:] = np.isin(cands[i, 1:], row)
    scores[torch.as_tensor(~valid | is_known)] = float("nan")
    true, rivals = scores[:, :1], scores[:, 1:]
    larger = torch.where(torch.as_tensor(found), (rivals > true).sum(1), torch.isfinite(rivals).sum(1))
    not_smaller = torch.where(torch.as_tensor(found), (rivals >= true).sum(1), larger) + 1
    options = torch.as_tensor(n_entities - np.diff(known.indptr) + np.asarray(known[np.arange(n), answers]).ravel())
    if counts is not None:
        counts["gold_missed"] = counts.get("gold_missed", 0) + int((~found).sum())
    optimistic = larger + 1
    return Ranks(optimistic=optimistic, pessimistic=not_smaller, realistic=(optimistic + not_smaller).float() * 0.5,
                 number_of_options=options.long())


def record_ranks(evaluator: "RankBasedEvaluator", target: str, ranks: "Ranks", num_entities: int) -> None:
    """What ``RankBasedEvaluator.process_scores_`` stores after ``Ranks.from_scores`` (pykeen 1.11): the
    metrics then come from pykeen's own ``finalize``."""
    evaluator.num_entities = num_entities
    for rank_type, v in ranks.items():
        evaluator.ranks[target, rank_type].append(v.detach().cpu().numpy())
    evaluator.num_candidates[target].append(ranks.number_of_options.detach().cpu().numpy())


def rank_dense(graph: KnowledgeGraph, triples: np.ndarray, scores: Callable[[np.ndarray], torch.Tensor], *,
               batch_size: int = 256) -> "RankBasedEvaluator":
    """Every query of ``triples`` (both directions) ranked against every entity by a scorer without towers:
    ``scores(queries)`` the (b, entities) scores of each query (e, r, answer); every other known answer (train +
    dev + test of ``graph``) left out, ties realistic, as :func:`rank_queries` ranks the text model's. The rules,
    a PyKEEN model, the PageRank floor and text + rules are all ranked here; PyKEEN's ``finalize`` of the
    returned evaluator gives the metrics."""
    evaluator = new_evaluator()
    for target, queries in query_directions(graph, triples).items():
        for s in range(0, len(queries), batch_size):
            chunk = queries[s: s + batch_size]
            dense = scores(chunk).float()
            known = graph.all_answers[graph.hr_keys(chunk[:, 0], chunk[:, 1])]
            ranks = rank_queries(lambda r0, r1, c0, c1: dense[r0:r1, c0:c1].clone(), chunk, known,
                                 graph.num_entities)
            record_ranks(evaluator, target, ranks, graph.num_entities)
    evaluator.num_entities = graph.num_entities
    return evaluator


def rank_rows(evaluator: "RankBasedEvaluator", directions: dict[str, np.ndarray], graph: KnowledgeGraph) -> list[dict]:
    """ranks.tsv: one row per query of ``directions``, in order, with the ranks ``evaluator`` recorded for it."""
    rows = []
    for target, queries in directions.items():
        ranks = {t: np.concatenate(evaluator.ranks[(target, t)]) for t in ("realistic", "optimistic", "pessimistic")}
        for i, (h, rel, a) in enumerate(queries):
            rows.append({"side": target, "head": graph.entities[h], "relation": graph.relation_label(int(rel)),
                         "answer": graph.entities[a], "rank": float(ranks["realistic"][i]),
                         "optimistic": float(ranks["optimistic"][i]), "pessimistic": float(ranks["pessimistic"][i])})
    return rows
