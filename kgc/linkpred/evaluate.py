"""Filtered link-prediction evaluation in PyKEEN's layout.

Every entity is embedded once; queries are encoded in batches and scored against the entity table in
blocks of at most ``eval.max_score_bytes`` (whole rows for WN18RR-sized graphs, entity blocks for millions
of entities). Both directions: tail prediction ``(h, r, ?)`` and head prediction as ``(t, inverse r, ?)``.
The filtered setting removes every known true answer from train + dev + test except the gold (read per
block from the sparse filter index). Each block is folded into pykeen's rank counts
(:class:`pykeen.evaluation.ranks.Ranks`: optimistic, pessimistic, realistic) and the ranks go to pykeen's
``RankBasedEvaluator`` — the metrics (realistic ranks with ties, MRR, Hits@k, …) are pykeen's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
import torch
from pykeen.evaluation import RankBasedEvaluator
from pykeen.evaluation.ranks import Ranks

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.linkpred.model import LinkPredictor, QueryEngine



@dataclass
class Evaluation:
    results: dict  # RankBasedMetricResults.to_dict() + extras
    ranks: list[dict]  # one row per query
    seconds: float

    def metric(self, side: str = "both", rank_type: str = "realistic", key: str = "inverse_harmonic_mean_rank"):
        return float(self.results[side][rank_type][key])


def n_hop_neighbours(graph: KnowledgeGraph, heads: np.ndarray, n_hop: int) -> dict[int, np.ndarray]:
    """Entities within ``n_hop`` of each head on the undirected train graph (the head itself included)."""
    g = nx.Graph()
    g.add_nodes_from(range(graph.num_entities))
    g.add_edges_from(graph.splits["train"][:, [0, 2]].tolist())
    return {int(h): np.fromiter(nx.single_source_shortest_path_length(g, int(h), cutoff=n_hop), dtype=np.int64)
            for h in np.unique(heads)}


DEFAULT_MAX_SCORE_BYTES = 256 * 2**20


def query_directions(graph: KnowledgeGraph, triples: np.ndarray) -> dict[str, np.ndarray]:
    """The two queries of each triple (h, r, t): tail prediction (h, r, ?) and head prediction (t, r + R, ?)."""
    r = graph.num_relations
    return {"tail": triples, "head": np.stack([triples[:, 2], triples[:, 1] + r, triples[:, 0]], axis=1)}


def mask_known_(scores: torch.Tensor, known: sp.spmatrix, answers: np.ndarray, offset: int = 0) -> torch.Tensor:
    """NaN (ignored by pykeen's ranks) at every known answer except the gold, in place.

    scores (rows, cols) cover entities ``offset ..``; ``known`` (rows, cols) sparse, the same block of the filter
    index; ``answers`` (rows,) the gold entity ids."""
    sub = known.tocoo()
    not_gold = sub.col + offset != answers[sub.row]
    scores[torch.as_tensor(sub.row[not_gold]), torch.as_tensor(sub.col[not_gold])] = float("nan")
    return scores


def rank_rows(evaluator: RankBasedEvaluator, directions: dict[str, np.ndarray], graph: KnowledgeGraph) -> list[dict]:
    """ranks.tsv: one row per query of ``directions``, in order, with the ranks ``evaluator`` recorded for it."""
    rows = []
    for target, queries in directions.items():
        ranks = {t: np.concatenate(evaluator.ranks[(target, t)]) for t in ("realistic", "optimistic", "pessimistic")}
        for i, (h, rel, a) in enumerate(queries):
            rows.append({"side": target, "head": graph.entities[h], "relation": graph.relation_label(int(rel)),
                         "answer": graph.entities[a], "rank": float(ranks["realistic"][i]),
                         "optimistic": float(ranks["optimistic"][i]), "pessimistic": float(ranks["pessimistic"][i])})
    return rows


def score_blocks(n_queries: int, n_entities: int, max_score_bytes: int) -> tuple[int, int]:
    """(queries, entities) per dense score block: whole rows while a row fits the budget; else one query at a
    time against entity blocks of half the budget (the gold's block is kept beside the current one)."""
    per_row = 4 * n_entities
    if per_row <= max_score_bytes:
        return max(1, min(n_queries, max_score_bytes // per_row)), n_entities
    return 1, max(1, min(n_entities, max_score_bytes // 8))


def rank_queries(query_vectors: torch.Tensor, entity_table: torch.Tensor, queries: np.ndarray, known: sp.csr_matrix,
                 *, max_score_bytes: int = DEFAULT_MAX_SCORE_BYTES, boost: dict[int, np.ndarray] | None = None,
                 boost_weight: float = 0.0, counts: dict[str, int] | None = None) -> Ranks:
    """Filtered ranks of ``queries`` (batch, 3) = (head, relation, answer), in pykeen's rank types.

    query_vectors (batch, dim); entity_table (entities, dim); ``known`` (batch, entities) sparse: the true
    answers to filter (the gold among them is kept). Scores are computed in blocks of queries × entities
    (:func:`score_blocks`, at most ``max_score_bytes`` of float32 alive at once); each block is filtered
    from ``known``'s rows and folded into pykeen's counts (scores above the gold, not below it, finite), so
    no (batch, entities) matrix is formed. The gold's score is read from its own block (the same kernel that
    scores its rivals, so an entity with an identical vector ties exactly). The ranks equal
    ``pykeen.evaluation.ranks.Ranks.from_scores`` on the dense filtered matrix.
    """
    n, n_entities = len(queries), entity_table.size(0)
    answers, heads = queries[:, 2], queries[:, 0]
    q_all = query_vectors.float().to(entity_table.device)
    larger, not_smaller, finite = (torch.zeros(n, dtype=torch.long) for _ in range(3))
    head_above = 0
    known = known.tocsr()
    rows_per, cols_per = score_blocks(n, n_entities, max_score_bytes)

    def block(r0: int, r1: int, c0: int) -> torch.Tensor:
        """(rows, cols) boosted, filtered scores; the gold stays."""
        c1 = min(n_entities, c0 + cols_per)
        out = (q_all[r0:r1] @ entity_table[c0:c1].t()).cpu()
        if boost:
            for i in range(r0, r1):
                near = boost[int(heads[i])]
                near = near[(near >= c0) & (near < c1)]
                out[i - r0, torch.as_tensor(near - c0)] += boost_weight
        return mask_known_(out, known[r0:r1, c0:c1], answers[r0:r1], offset=c0)

    for r0 in range(0, n, rows_per):
        r1 = min(n, r0 + rows_per)
        first = (answers[r0] // cols_per) * cols_per  # rows_per > 1 only when one block spans every entity
        kept = block(r0, r1, first)
        true = kept[torch.arange(r1 - r0), torch.as_tensor(answers[r0:r1] - first)].unsqueeze(1)  # (rows, 1)
        for c0 in range(0, n_entities, cols_per):
            scores = kept if c0 == first else block(r0, r1, c0)
            larger[r0:r1] += (scores > true).sum(1)
            not_smaller[r0:r1] += (scores >= true).sum(1)
            finite[r0:r1] += torch.isfinite(scores).sum(1)
            if counts is not None:
                h = heads[r0:r1]
                own = np.flatnonzero((h >= c0) & (h < c0 + cols_per) & (h != answers[r0:r1]))
                score = scores[torch.as_tensor(own), torch.as_tensor(h[own] - c0)]  # NaN: the head is an answer
                head_above += int((score > true[torch.as_tensor(own), 0]).sum())
    if counts is not None:
        counts["head_above_gold"] = counts.get("head_above_gold", 0) + head_above
    optimistic, pessimistic = larger + 1, not_smaller
    return Ranks(optimistic=optimistic, pessimistic=pessimistic, realistic=(optimistic + pessimistic).float() * 0.5,
                 number_of_options=finite)


def rank_retrieved(query_vectors: torch.Tensor, entity_table: torch.Tensor, queries: np.ndarray,
                   known: sp.csr_matrix, retrieved: np.ndarray, counts: dict[str, int] | None = None) -> Ranks:
    """Filtered ranks as a FAISS index would give them: among the ``retrieved`` candidates (batch, K) of an
    approximate index (ids ``-1`` or beyond the table ignored), re-scored exactly from ``entity_table``.

    The gold is scored in the same batched product as its rivals. A gold the index did not retrieve ranks
    right after every unfiltered candidate it did (``counts["gold_missed"]`` counts those queries): Hits@k for
    k ≤ K are what a deployed search returns; for an exact index they equal the exhaustive ones, and MRR
    differs from the exhaustive MRR only through golds ranked below K."""
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


def record_ranks(evaluator: RankBasedEvaluator, target: str, ranks: Ranks, num_entities: int) -> None:
    """What ``RankBasedEvaluator.process_scores_`` stores after ``Ranks.from_scores`` (pykeen 1.11): the
    metrics then come from pykeen's own ``finalize``."""
    evaluator.num_entities = num_entities
    for rank_type, v in ranks.items():
        evaluator.ranks[target, rank_type].append(v.detach().cpu().numpy())
    evaluator.num_candidates[target].append(ranks.number_of_options.detach().cpu().numpy())


def score_and_rank(query_vectors: torch.Tensor, entity_table: torch.Tensor, graph: KnowledgeGraph,
                   queries: np.ndarray, *, evaluator: RankBasedEvaluator, target: str,
                   boost: dict[int, np.ndarray] | None = None, boost_weight: float = 0.0,
                   counts: dict[str, int] | None = None, max_score_bytes: int = DEFAULT_MAX_SCORE_BYTES,
                   search=None) -> None:
    """queries (batch, 3) = (query head, relation id in 0..2R-1, answer); feeds pykeen's evaluator.

    ``search``: ``(faiss index, K)`` — rank within the index's top K (plus the filtered answers) instead of
    against every entity (:func:`rank_retrieved`).

    ``counts["head_above_gold"]`` adds the queries whose own head entity outscores the gold answer (a text
    model's first failure: "head under relation" starts out closest to the head's own text)."""
    known = graph.all_answers[graph.hr_keys(queries[:, 0], queries[:, 1])]  # (batch, entities) sparse
    if search is not None:
        from kgc.linkpred.index import search_index

        index, top_k = search
        # neither the filtered answers nor entities added with `kgc index --add` (not ranked here) eat the top K
        k = top_k + int(np.diff(known.indptr).max(initial=0)) + max(0, index.ntotal - graph.num_entities)
        _, retrieved = search_index(index, query_vectors.float().cpu().numpy(), k)
        record_ranks(evaluator, target, rank_retrieved(query_vectors, entity_table, queries, known, retrieved,
                                                       counts), graph.num_entities)
        return
    ranks = rank_queries(query_vectors, entity_table, queries, known, max_score_bytes=max_score_bytes, boost=boost,
                         boost_weight=boost_weight, counts=counts)
    record_ranks(evaluator, target, ranks, graph.num_entities)


@torch.no_grad()
def evaluate(model: LinkPredictor, graph: KnowledgeGraph, split: str = "test", *, batch_size: int = 256,
             max_triples: int | None = None, seed: int = 0, rerank: dict | None = None,
             progress: bool = False, entity_table: torch.Tensor | None = None,
             max_score_bytes: int = DEFAULT_MAX_SCORE_BYTES, search=None) -> Evaluation:
    """Filtered ranks for every triple of ``split`` in both directions (or a fixed sample of them).

    Queries are encoded ``batch_size`` at a time and scored in blocks of at most ``max_score_bytes``
    (:func:`rank_queries`), so memory stays bounded however many entities there are."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    model.eval()
    triples = graph.splits[split]
    if max_triples is not None and max_triples < len(triples):
        pick = np.sort(np.random.default_rng(seed).choice(len(triples), size=max_triples, replace=False))
        triples = triples[pick]
    engine = QueryEngine(model, batch_size=batch_size, progress=progress, entity_table=entity_table)
    state_seconds = time.perf_counter() - start  # every relation's and (layer/pooled) every entity's state, once
    entity_source = "index" if entity_table is not None else "computed"
    if entity_table is None and engine.entity_table is not None:
        entity_table, entity_source = engine.entity_table, "sentence states (shared towers)"
    table_start = time.perf_counter()
    if entity_table is None:
        entity_table = model.entity_table(batch_size, progress=progress)
        engine.passes["entities"] = graph.num_entities
    table_seconds = time.perf_counter() - table_start
    table = entity_table.to(model.device)  # (entities, dim), scored on the model's device
    evaluator = RankBasedEvaluator(filtered=True, clear_on_finalize=False)
    directions = query_directions(graph, triples)
    rerank = rerank or {}
    boost = None
    if search is not None and rerank.get("enabled"):
        raise KGCError("graph re-ranking adds to every entity's score; it cannot run over an index's top K. "
                       "Evaluate with the index and --no-rerank, or exactly (without --use-index)")
    if rerank.get("enabled"):
        boost = n_hop_neighbours(graph, np.concatenate([q[:, 0] for q in directions.values()]), rerank["n_hop"])
    passes = len(directions) * len(triples)
    bar = tqdm(total=passes, desc=f"evaluate {split}", disable=not progress, leave=False)
    query_seconds, counts = 0.0, {}
    for target, queries in directions.items():
        for s in range(0, len(queries), batch_size):
            chunk = queries[s: s + batch_size]
            tick = time.perf_counter()
            q = engine(chunk[:, 0], chunk[:, 1])
            query_seconds += time.perf_counter() - tick
            score_and_rank(q, table, graph, chunk, evaluator=evaluator, target=target, boost=boost,
                           boost_weight=rerank.get("weight", 0.0), counts=counts, max_score_bytes=max_score_bytes,
                           search=search)
            bar.update(len(chunk))
    bar.close()
    results = evaluator.finalize().to_dict()
    rows = rank_rows(evaluator, directions, graph)
    seconds = time.perf_counter() - start
    results["kgc"] = {"split": split, "triples": int(len(triples)), "queries": int(2 * len(triples)),
                      "entities": graph.num_entities, "dataset": graph.source,
                      "evaluation_seconds": round(seconds, 3),
                      # where it went: states computed once (relations; entities up to the condition's layer),
                      # the entity table (tail tower), and the query vectors alone (entity states cached)
                      "state_seconds": round(state_seconds, 3), "entity_table_seconds": round(table_seconds, 3),
                      "query_encoding_seconds": round(query_seconds, 3),
                      "head_above_gold": (None if search is not None else
                                          round(counts.get("head_above_gold", 0) / max(1, passes), 4)),
                      "encoder_passes": int(sum(engine.passes.values())),
                      "encoder_passes_by_kind": dict(engine.passes),
                      "condition_enters_at_layer": model.conditioner.entry_layer,
                      "encoder_layers_per_query": (model.conditioner.encoder.num_layers
                                                   - model.conditioner.entry_layer),
                      "entity_embeddings": entity_source,
                      "cache_bytes": int(table.numel() * table.element_size() + engine.state_bytes
                                         + (model.layer_cache.nbytes if model.layer_cache is not None else 0)),
                      "rerank": rerank if rerank.get("enabled") else None,
                      "max_score_bytes": int(max_score_bytes),
                      # ranks within an approximate index's top K (None: against every entity, exact)
                      "search": None if search is None else {
                          "top_k": int(search[1]), "gold_missed": round(counts.get("gold_missed", 0) / max(1, passes), 4)},
                      "score_block": list(score_blocks(batch_size, graph.num_entities, max_score_bytes)),
                      "sampled": max_triples is not None and max_triples < len(graph.splits[split])}
    return Evaluation(results=results, ranks=rows, seconds=seconds)


def format_table(results: dict) -> str:
    keys = [("MRR", "inverse_harmonic_mean_rank"), ("H@1", "hits_at_1"), ("H@3", "hits_at_3"),
            ("H@10", "hits_at_10"), ("MR", "arithmetic_mean_rank")]
    lines = ["side   " + "".join(f"{name:>9}" for name, _ in keys)]
    for side in ("tail", "head", "both"):
        vals = results[side]["realistic"]
        lines.append(f"{side:<7}" + "".join(f"{vals[k]:>9.4f}" if k != "arithmetic_mean_rank" else f"{vals[k]:>9.2f}"
                                            for _, k in keys))
    return "\n".join(lines)


def evaluate_run(run, split: str = "test", *, device="cpu", batch_size: int | None = None,
                 rerank: bool | None = None, progress: bool = False, use_index: bool = False,
                 top_k: int = 100) -> Evaluation:
    """Evaluate a run directory and write ``results[.split].json`` and ``ranks[.split].tsv`` into it.

    Entity embeddings come from the run's index when it is fresh (a stale one is an error). ``use_index``:
    rank within the top ``top_k`` of the run's FAISS index (its type: flat, ivf, hnsw, ivfpq), re-scored
    exactly — what a deployed approximate search gives; results.json records the index and the share of
    golds it missed.
    """
    from kgc.fileio import write_json, write_tsv
    from kgc.linkpred.index import index_params, load_embeddings, load_index
    from kgc.linkpred.structure import evaluate_run_fused, has_structure

    if has_structure(run):  # text and a PyKEEN model fused (kgc.linkpred.structure): every entity scored densely
        if use_index or rerank:
            raise KGCError(f"{run.path} has a structural model: its evaluation fuses text and structure over every "
                           "entity; drop --use-index / --rerank (or remove its structure/ folder)")
        return evaluate_run_fused(run, split, device=device, batch_size=batch_size, progress=progress)
    model, graph = run.load(device)
    rr = run.recipe.eval.rerank.model_dump()
    if rerank is not None:
        rr["enabled"] = rerank
    cached = load_embeddings(run, model)
    search = None
    if use_index:
        if top_k < 1:
            raise KGCError(f"--top-k {top_k}: rank within at least 1 retrieved entity")
        search = (load_index(run, model, faiss_device="cpu"), top_k)  # a missing index: the message says build it
    ev = evaluate(model, graph, split, batch_size=batch_size or run.recipe.eval.batch_size, rerank=rr,
                  progress=progress, entity_table=None if cached is None else torch.from_numpy(cached),
                  max_score_bytes=run.recipe.eval.max_score_bytes, search=search)
    if use_index:
        ev.results["kgc"]["search"]["index"] = index_params(run, model)
    suffix = "" if split == "test" else f".{split}"
    write_json(run.path / f"results{suffix}.json", ev.results)
    write_tsv(run.path / f"ranks{suffix}.tsv", ev.ranks)
    return ev
