"""Filtered link-prediction evaluation in PyKEEN's layout.

Every entity is embedded once; queries are scored in chunks against the whole table. Both directions:
tail prediction ``(h, r, ?)`` and head prediction as ``(t, inverse r, ?)``. The filtered setting
removes every known true answer from train + dev + test except the gold (set to NaN, which pykeen's
rank computation ignores). The scores then go to pykeen's own ``RankBasedEvaluator.process_scores_``
— the metrics (realistic ranks with ties, MRR, Hits@k, …) are pykeen's, not re-derived here.
(pykeen 1.11.1's ``filtered=False`` path is broken, hence the filtering is done before.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
import torch
from pykeen.evaluation import RankBasedEvaluator

from kgc.data.graph import KnowledgeGraph
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


def filter_scores_(scores: torch.Tensor, graph: KnowledgeGraph, heads: np.ndarray, rels: np.ndarray,
                   answers: np.ndarray) -> torch.Tensor:
    """Set every known answer except the gold to NaN, in place. scores (batch, entities)."""
    rows = graph.all_answers[graph.hr_keys(heads, rels)].tocoo()  # (batch, entities) sparse
    keep_gold = rows.col != answers[rows.row]
    scores[torch.as_tensor(rows.row[keep_gold]), torch.as_tensor(rows.col[keep_gold])] = float("nan")
    return scores


def score_and_rank(query_vectors: torch.Tensor, entity_table: torch.Tensor, graph: KnowledgeGraph,
                   queries: np.ndarray, *, evaluator: RankBasedEvaluator, target: str,
                   boost: dict[int, np.ndarray] | None = None, boost_weight: float = 0.0,
                   counts: dict[str, int] | None = None) -> None:
    """queries (batch, 3) = (query head, relation id in 0..2R-1, answer); feeds pykeen's evaluator.

    ``counts["head_above_gold"]`` adds the queries whose own head entity outscores the gold answer (a text
    model's first failure: "head under relation" starts out closest to the head's own text)."""
    scores = (query_vectors.float() @ entity_table.t()).cpu()  # (batch, entities)
    if boost:
        for i, h in enumerate(queries[:, 0]):
            scores[i, torch.as_tensor(boost[int(h)])] += boost_weight
    answers = queries[:, 2]
    true = scores[torch.arange(len(queries)), torch.as_tensor(answers)].unsqueeze(1).clone()  # (batch, 1)
    filter_scores_(scores, graph, queries[:, 0], queries[:, 1], answers)
    if counts is not None:
        own = scores[torch.arange(len(queries)), torch.as_tensor(queries[:, 0])]  # NaN where the head is an answer
        counts["head_above_gold"] = counts.get("head_above_gold", 0) + int((own > true[:, 0]).sum())
    r = graph.num_relations
    if target == "tail":
        hrt = queries.copy()
    else:  # (t, r + R, h) is the head-prediction query of the original triple (h, r, t)
        hrt = np.stack([answers, queries[:, 1] - r, queries[:, 0]], axis=1)
    evaluator.process_scores_(torch.as_tensor(hrt), target, scores, true_scores=true)


@torch.no_grad()
def evaluate(model: LinkPredictor, graph: KnowledgeGraph, split: str = "test", *, batch_size: int = 256,
             max_triples: int | None = None, seed: int = 0, rerank: dict | None = None,
             progress: bool = False, entity_table: torch.Tensor | None = None) -> Evaluation:
    """Filtered ranks for every triple of ``split`` in both directions (or a fixed sample of them)."""
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
    r = graph.num_relations
    directions = {
        "tail": triples,
        "head": np.stack([triples[:, 2], triples[:, 1] + r, triples[:, 0]], axis=1),
    }
    rerank = rerank or {}
    boost = None
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
                           boost_weight=rerank.get("weight", 0.0), counts=counts)
            bar.update(len(chunk))
    bar.close()
    results = evaluator.finalize().to_dict()
    rows = []
    for target, queries in directions.items():
        ranks = {t: np.concatenate(evaluator.ranks[(target, t)]) for t in ("realistic", "optimistic", "pessimistic")}
        for i, (h, rel, a) in enumerate(queries):
            rows.append({"side": target, "head": graph.entities[h], "relation": graph.relation_label(int(rel)),
                         "answer": graph.entities[a], "rank": float(ranks["realistic"][i]),
                         "optimistic": float(ranks["optimistic"][i]), "pessimistic": float(ranks["pessimistic"][i])})
    seconds = time.perf_counter() - start
    results["kgc"] = {"split": split, "triples": int(len(triples)), "queries": int(2 * len(triples)),
                      "entities": graph.num_entities, "dataset": graph.source,
                      "evaluation_seconds": round(seconds, 3),
                      # where it went: states computed once (relations; entities up to the condition's layer),
                      # the entity table (tail tower), and the query vectors alone (entity states cached)
                      "state_seconds": round(state_seconds, 3), "entity_table_seconds": round(table_seconds, 3),
                      "query_encoding_seconds": round(query_seconds, 3),
                      "head_above_gold": round(counts.get("head_above_gold", 0) / max(1, passes), 4),
                      "encoder_passes": int(sum(engine.passes.values())),
                      "encoder_passes_by_kind": dict(engine.passes),
                      "condition_enters_at_layer": model.conditioner.entry_layer,
                      "encoder_layers_per_query": (model.conditioner.encoder.num_layers
                                                   - model.conditioner.entry_layer),
                      "entity_embeddings": entity_source,
                      "cache_bytes": int(table.numel() * table.element_size() + engine.state_bytes
                                         + (model.layer_cache.nbytes if model.layer_cache is not None else 0)),
                      "rerank": rerank if rerank.get("enabled") else None,
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
                 rerank: bool | None = None, progress: bool = False) -> Evaluation:
    """Evaluate a run directory and write ``results[.split].json`` and ``ranks[.split].tsv`` into it.

    Entity embeddings come from the run's index when it is fresh (a stale one is an error).
    """
    from kgc.fileio import write_json, write_tsv
    from kgc.linkpred.index import load_embeddings

    model, graph = run.load(device)
    rr = run.recipe.eval.rerank.model_dump()
    if rerank is not None:
        rr["enabled"] = rerank
    cached = load_embeddings(run, model)
    ev = evaluate(model, graph, split, batch_size=batch_size or run.recipe.eval.batch_size, rerank=rr,
                  progress=progress, entity_table=None if cached is None else torch.from_numpy(cached))
    suffix = "" if split == "test" else f".{split}"
    write_json(run.path / f"results{suffix}.json", ev.results)
    write_tsv(run.path / f"ranks{suffix}.tsv", ev.ranks)
    return ev
