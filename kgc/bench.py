"""Benchmarks behind the performance claims, each run as ratios inside one process.

``kgc bench inference``: answer every test query of a dataset in both directions with each
conditioner on the same backbone, entity embeddings already cached (computed once and shared). Each
conditioner then pays only what its design requires: the bi-encoder a full encoder pass per query; the
router its per-entity layer-t states (reported as one-time preparation) and the top k layers per
query; the tri-encoders and Hyper-CL one pass per relation and a composition per query.

``kgc bench train``: training triples/s of a recipe with full fine-tuning against
``encoder.trainable_layers = n``, on the same fixed batches. The partial run first fills its layer
cache with one untimed pass over those batches, so the figure is the steady state of epoch ≥ 2 (or
of any run after the first that uses the same backbone).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from kgc.data.graph import load_graph
from kgc.encoding.backbone import resolve_backbone
from kgc.linkpred.model import QueryEngine, build_model
from kgc.linkpred.train import batch_loss, make_loss
from kgc.recipe import load_recipe
from kgc.training.common import make_optimizer, seed_everything


@torch.no_grad()
def bench_inference(*, dataset: str = "wn18rr", conditioners=("biencoder", "hadamard", "hypernet", "router"),
                    limit: int | None = None, batch_size: int = 256, overrides: list[str] | None = None,
                    echo=print, progress: bool = True) -> dict:
    base = [f"data.dataset={dataset}", "model.shared_towers=true", *(overrides or [])]
    recipe = load_recipe(None, base)
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    triples = graph.splits["test"][:limit]
    r = graph.num_relations
    queries = np.concatenate([triples, np.stack([triples[:, 2], triples[:, 1] + r, triples[:, 0]], 1)])
    folder = resolve_backbone(recipe.model.backbone)
    seed_everything(0)
    table, table_seconds, rows = None, 0.0, []
    for name in conditioners:  # "router" or, with model options, "router:cross_attend=top,router_layers=2"
        kind, _, opts = name.partition(":")
        extra = [f"model.{kv.strip()}" for kv in opts.split(",") if kv.strip()]
        model, _ = build_model(load_recipe(None, base + [f"model.conditioner={kind}", *extra]), graph, folder)
        model.eval()
        if table is None:  # the cached entity embeddings, shared by every conditioner (same tail tower)
            start = time.perf_counter()
            table = model.entity_table(batch_size, progress=progress)
            table_seconds = time.perf_counter() - start
            echo(f"entity embeddings: {graph.num_entities} entities in {table_seconds:.1f}s (computed once, shared)")
        start = time.perf_counter()
        engine = QueryEngine(model, batch_size=batch_size, progress=progress, entity_table=table)
        prep = time.perf_counter() - start
        start = time.perf_counter()
        for s in range(0, len(queries), batch_size):
            chunk = queries[s: s + batch_size]
            scores = engine(chunk[:, 0], chunk[:, 1]) @ table.t()  # (batch, entities)
            scores.topk(10, dim=1)
        seconds = time.perf_counter() - start
        rows.append({"conditioner": name, "prepare_seconds": round(prep, 2), "query_seconds": round(seconds, 3),
                     "_seconds": max(seconds, 1e-9),
                     "queries": int(len(queries)), "queries_per_s": round(len(queries) / seconds, 1),
                     "passes": dict(engine.passes)})
        echo(f"{name:<10} prepare {prep:8.2f}s   answer {len(queries)} queries {seconds:8.2f}s")
    base = next((r["_seconds"] for r in rows if r["conditioner"] == "biencoder"), None)
    for row in rows:
        exact = row.pop("_seconds")
        row["speedup_vs_biencoder"] = None if base is None else round(base / exact, 1)
    return {"dataset": graph.source, "backbone": recipe.model.backbone, "entities": graph.num_entities,
            "entity_table_seconds": round(table_seconds, 2), "threads": torch.get_num_threads(), "rows": rows}


def _timed_steps(model, criterion, optimizer, batches, train_keys) -> float:
    """Seconds for full optimisation steps (forward, loss, backward, AdamW) over ``batches``."""
    start = time.perf_counter()
    for batch in batches:
        loss = batch_loss(model, criterion, batch, train_keys)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def bench_train(recipe_path: Path, *, trainable_layers: int = 2, steps: int = 5, batch_size: int = 32,
                overrides: list[str] | None = None, echo=print) -> dict:
    rows, graph = [], None
    for layers in ("all", trainable_layers):
        recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}", f"encoder.trainable_layers={layers}",
                                           *(overrides or [])])
        if graph is None:  # both modes read the same data section
            graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
        seed_everything(recipe.train.seed)
        examples = graph.both_directions("train")
        rng = np.random.default_rng(recipe.train.seed)
        batches = [examples[rng.choice(len(examples), batch_size, replace=False)] for _ in range(steps)]
        model, _ = build_model(recipe, graph, resolve_backbone(recipe.model.backbone))
        model.attach_layer_cache(recipe)
        criterion = make_loss(recipe)
        optimizer = make_optimizer([model, criterion], recipe.train.lr, recipe.train.weight_decay)
        train_keys = torch.as_tensor(graph.train_keys)
        model.train()

        warm = batches if model.layer_cache is not None else batches[:1]  # fill the cache / warm allocations
        warm_seconds = _timed_steps(model, criterion, optimizer, warm, train_keys)
        seconds = _timed_steps(model, criterion, optimizer, batches, train_keys)
        rate = steps * batch_size / seconds
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows.append({"trainable_layers": layers, "triples_per_s": round(rate, 2), "seconds": round(seconds, 2),
                     "warmup_seconds": round(warm_seconds, 2), "trainable_params": trainable,
                     "cache_layer": None if model.layer_cache is None else model.layer_cache.layer})
        echo(f"trainable_layers={layers}: {rate:.1f} triples/s over {steps} steps of {batch_size} "
             f"(warm-up {warm_seconds:.1f}s)")
        model.save_cache()
    ratio = rows[1]["triples_per_s"] / rows[0]["triples_per_s"]
    echo(f"speed-up of trainable_layers={trainable_layers} over full fine-tuning: {ratio:.2f}x")
    return {"recipe": str(recipe_path), "rows": rows, "speedup": round(ratio, 2), "threads": torch.get_num_threads()}
