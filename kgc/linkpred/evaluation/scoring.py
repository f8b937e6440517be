"""Filtered link-prediction evaluation of a model over a graph: query vectors at each conditioner's own cost,
ranked through the one ranking protocol (:mod:`kgc.linkpred.evaluation.ranking`), results in PyKEEN's layout.

Every entity is embedded once (or read from the run's index); every relation's state and, for conditioners
that meet the relation after the input, every entity's sentence state are computed once
(:class:`~kgc.linkpred.model.QueryEngine`); queries are encoded ``batch_size`` at a time and handed, with a
*scorer* that turns them into block functions, to :func:`~kgc.linkpred.evaluation.ranking.rank_queries`. The scorer is
:class:`TextScores` (cosines, optionally SimKGC's graph re-ranking) or a fused text + structure scorer
(:mod:`kgc.linkpred.structure.pykeen`); every evaluation writes the same results layout.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.linkpred.model import LinkPredictor, QueryEngine
from kgc.linkpred.evaluation.ranking import (DEFAULT_MAX_SCORE_BYTES, BlockScores, Evaluation, cosine_blocks,
                                  n_hop_neighbours, new_evaluator, query_directions, rank_queries, rank_retrieved,
                                  rank_rows, record_ranks, score_blocks)


class Scorer(Protocol):
    """Turns a chunk of query vectors into block functions, one per score variant (the fused α grid)."""

    variants: list  # the first is the main result

    def blocks(self, query_vectors: torch.Tensor, queries: np.ndarray) -> dict[Any, BlockScores]: ...

    def max_rows(self, n_entities: int, max_score_bytes: int) -> int | None:
        """The largest chunk of queries the scorer may hold densely (None: it scores in blocks)."""


class TextScores:
    """Cosine of query and entity vectors, plus SimKGC's re-ranking boost where ``boost`` is given."""

    variants = [None]

    def __init__(self, table: torch.Tensor, *, boost: dict[int, np.ndarray] | None = None,
                 boost_weight: float = 0.0) -> None:
        self.table, self.boost, self.boost_weight = table, boost, boost_weight

    def blocks(self, query_vectors, queries):
        return {None: cosine_blocks(query_vectors, self.table, queries[:, 0], boost=self.boost,
                                    boost_weight=self.boost_weight)}

    def max_rows(self, n_entities, max_score_bytes):
        return None


def sample_triples(graph: KnowledgeGraph, split: str, max_triples: int | None, seed: int) -> np.ndarray:
    """The triples of ``split``, or a fixed sample of ``max_triples`` of them (the same for the same seed)."""
    triples = graph.splits[split]
    if max_triples is not None and max_triples < len(triples):
        pick = np.sort(np.random.default_rng(seed).choice(len(triples), size=max_triples, replace=False))
        triples = triples[pick]
    return triples


def entity_states(model: LinkPredictor, *, batch_size: int = 256, progress: bool = False,
                  entity_table: torch.Tensor | None = None, engine: QueryEngine | None = None,
                  heads: np.ndarray | None = None):
    """(engine, entity table (entities, dim), where the table came from, seconds for states, seconds for the
    table): what every evaluation computes once before its queries. ``heads``: the entities the queries start
    from; only their states are computed (an engine passed in computes those it lacks), None: every entity's."""
    start = time.perf_counter()
    if engine is None:
        engine = QueryEngine(model, batch_size=batch_size, progress=progress, entity_table=entity_table, heads=heads)
    elif heads is not None:
        engine.ensure(heads)
    state_seconds = time.perf_counter() - start  # every relation's state and (layer/pooled) the heads', once
    source = "index" if entity_table is not None else "computed"
    if entity_table is None and engine.entity_table is not None:
        entity_table, source = engine.entity_table, "sentence states (shared towers)"
    start = time.perf_counter()
    if entity_table is None:
        entity_table = model.entity_table(batch_size, progress=progress)
        engine.passes["entities"] = model.bank.graph.num_entities
    return engine, entity_table, source, state_seconds, time.perf_counter() - start


@torch.no_grad()
def evaluate(model: LinkPredictor, graph: KnowledgeGraph, split: str = "test", *, batch_size: int = 256,
             max_triples: int | None = None, seed: int = 0, rerank: dict | None = None,
             progress: bool = False, entity_table: torch.Tensor | None = None,
             max_score_bytes: int = DEFAULT_MAX_SCORE_BYTES, search=None, scorer=None,
             engine: QueryEngine | None = None) -> Evaluation:
    """Filtered ranks for every triple of ``split`` in both directions (or a fixed sample of them).

    ``scorer``: a factory ``scorer(entity_table) -> Scorer`` (default :class:`TextScores`, with ``rerank``'s boost);
    ``search``: ``(faiss index, K)`` ranks within the index's top K instead of against every entity
    (:func:`~kgc.linkpred.evaluation.ranking.rank_retrieved`); ``engine``: a QueryEngine to reuse (its states are computed
    once, for dev and test alike). Queries are encoded ``batch_size`` at a time and scored in blocks of at most
    ``max_score_bytes``, so memory stays bounded however many entities there are."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    model.eval()
    triples = sample_triples(graph, split, max_triples, seed)
    directions = query_directions(graph, triples)
    heads = np.unique(np.concatenate([q[:, 0] for q in directions.values()]))  # the states the queries need
    engine, entity_table, entity_source, state_seconds, table_seconds = entity_states(
        model, batch_size=batch_size, progress=progress, entity_table=entity_table, engine=engine, heads=heads)
    table = entity_table.to(model.device)  # (entities, dim), scored on the model's device
    rerank = rerank or {}
    if (search is not None or scorer is not None) and rerank.get("enabled"):
        raise KGCError("graph re-ranking adds to every entity's score of the text model; it runs neither over an "
                       "index's top K nor on fused scores. Evaluate with --no-rerank (or exactly, without "
                       "--use-index)")
    if scorer is not None:
        scores = scorer(table)
    else:
        boost = None
        if rerank.get("enabled"):
            boost = n_hop_neighbours(graph, np.concatenate([q[:, 0] for q in directions.values()]), rerank["n_hop"])
        scores = TextScores(table, boost=boost, boost_weight=rerank.get("weight", 0.0))
    evaluators = {v: new_evaluator() for v in scores.variants}
    main = scores.variants[0]
    chunk_rows = min(batch_size, scores.max_rows(graph.num_entities, max_score_bytes) or batch_size)
    passes = len(directions) * len(triples)
    bar = tqdm(total=passes, desc=f"evaluate {split}", disable=not progress, leave=False)
    query_seconds, counts = 0.0, {}
    for target, queries in directions.items():
        for s in range(0, len(queries), chunk_rows):
            chunk = queries[s: s + chunk_rows]
            tick = time.perf_counter()
            q = engine(chunk[:, 0], chunk[:, 1])
            query_seconds += time.perf_counter() - tick
            known = graph.all_answers[graph.hr_keys(chunk[:, 0], chunk[:, 1])]  # (batch, entities) sparse
            if search is not None:
                ranks = _search_ranks(q, table, graph, chunk, known, search, counts)
                record_ranks(evaluators[main], target, ranks, graph.num_entities)
            else:
                for variant, block in scores.blocks(q, chunk).items():
                    ranks = rank_queries(block, chunk, known, graph.num_entities, max_score_bytes=max_score_bytes,
                                         counts=counts if variant == main else None)
                    record_ranks(evaluators[variant], target, ranks, graph.num_entities)
            bar.update(len(chunk))
    bar.close()
    variants = {v: ev.finalize().to_dict() for v, ev in evaluators.items()}
    results = dict(variants[main])
    rows = rank_rows(evaluators[main], directions, graph)
    seconds = time.perf_counter() - start
    results["kgc"] = {"split": split, "triples": int(len(triples)), "queries": int(2 * len(triples)),
                      "entities": graph.num_entities, "dataset": graph.source,
                      "evaluation_seconds": round(seconds, 3), "precision": model.precision,
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
                      "score_block": list(score_blocks(chunk_rows, graph.num_entities, max_score_bytes)),
                      "sampled": max_triples is not None and max_triples < len(graph.splits[split]),
                      "inductive": None, "structure": None, "components": None}
    variant_ranks = {v: np.concatenate([np.concatenate(ev.ranks[(t, "realistic")]) for t in directions])
                     for v, ev in evaluators.items()}
    return Evaluation(results=results, ranks=rows, seconds=seconds, variants=variants, variant_ranks=variant_ranks,
                      query_relations=np.concatenate([q[:, 1] for q in directions.values()]))


def _search_ranks(query_vectors, table, graph: KnowledgeGraph, queries: np.ndarray, known, search, counts):
    """Ranks within the top K of a FAISS index (``search`` = (index, K)), re-scored exactly."""
    from kgc.linkpred.index.types import search_index

    index, top_k = search
    # neither the filtered answers nor entities added with `kgc index --add` (not ranked here) eat the top K
    k = top_k + int(np.diff(known.indptr).max(initial=0)) + max(0, index.ntotal - graph.num_entities)
    _, retrieved = search_index(index, query_vectors.float().cpu().numpy(), k)
    return rank_retrieved(query_vectors, table, queries, known, retrieved, counts)
