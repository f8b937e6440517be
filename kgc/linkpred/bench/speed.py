"""Link prediction's model-speed benchmarks (``kgc bench inference / train / loss``), each run as ratios inside one
process; :mod:`kgc.bench` finds them through ``LinkPredTask.bench_commands``, which reads their command-line
descriptions in :mod:`kgc.linkpred.bench.commands`. The others measure elsewhere: a step's host share
(:mod:`~kgc.linkpred.bench.steps`), the index types (:mod:`~kgc.linkpred.bench.retrieval`), rules and PyKEEN
(:mod:`~kgc.linkpred.bench.structure`), fp32 against bf16 (:mod:`~kgc.linkpred.bench.precision`), the whole path
at growing sizes (:mod:`~kgc.linkpred.bench.scale`), GraIL's splits (:mod:`~kgc.linkpred.bench.grail`).

``kgc bench inference``: answer every test query of a dataset in both directions with each
conditioner on the same backbone, entity embeddings already cached (computed once and shared). Each
conditioner then pays only what its design requires: the bi-encoder a full encoder pass per query; the
router its per-entity layer-t states (reported as one-time preparation) and the top k layers per
query; the tri-encoders and Hyper-CL one pass per relation and a composition per query.

``kgc bench train``: training triples/s of a recipe with full fine-tuning against
``encoder.trainable_layers = n``, on the same fixed batches. The partial run first fills its layer
cache with one untimed pass over those batches, so the figure is the steady state of epoch ≥ 2 (or
of any run after the first that uses the same backbone).

``kgc bench loss``: the recipe's SimKGC objective alone (forward and backward) on batches of the recipe's graph, random
unit vectors in place of the towers: the false-negative masks by binary search in the sorted train keys (what
training runs) against the same masks by ``torch.isin`` (the reference they replaced), equal losses checked, s/step
of each and their ratio.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch

from kgc.data.formats import load_graph
from kgc.encoding.backbone import resolve_backbone
from kgc.errors import KGCError
from kgc.linkpred.model import QueryEngine, build_model
from kgc.profiling import collect, section
from kgc.recipe import load_recipe
from kgc.registry import CONDITIONERS
from kgc.training.common import make_optimizer, seed_everything
from kgc.training.task import task_class


@torch.no_grad()
def bench_inference(*, dataset: str = "wn18rr", conditioners=None,
                    limit: int | None = None, batch_size: int = 256, overrides: list[str] | None = None,
                    echo=print, progress: bool = True) -> dict:
    base = [f"data.dataset={dataset}", "model.shared_towers=true", *(overrides or [])]
    recipe = load_recipe(None, base)
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    triples = graph.splits["test"][:limit]
    queries = np.concatenate([triples, graph.inverse_queries(triples)])
    folder = resolve_backbone(recipe.model.backbone)
    seed_everything(0)
    table, table_seconds, rows = None, 0.0, []
    for name in conditioners or list(CONDITIONERS):  # "router" or, with model options, "router:cross_attend=top,router_layers=2"
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
    base = next((r["_seconds"] for r in rows if r["conditioner"] == CONDITIONERS.default), None)
    for row in rows:
        exact = row.pop("_seconds")
        row[f"speedup_vs_{CONDITIONERS.default}"] = None if base is None else round(base / exact, 1)
    return {"dataset": graph.source, "backbone": recipe.model.backbone, "entities": graph.num_entities,
            "entity_table_seconds": round(table_seconds, 2), "threads": torch.get_num_threads(), "rows": rows}


def _timed_steps(task, model, criterion, optimizer, batches) -> float:
    """Seconds for full optimisation steps (forward, loss, backward, AdamW) over ``batches``."""
    start = time.perf_counter()
    for batch in batches:
        with section("step"):
            loss = task.batch_loss(model, criterion, batch)
            optimizer.zero_grad(set_to_none=True)
            with section("backward (trained towers, loss)"):
                loss.backward()
            with section("optimiser (AdamW)"):
                optimizer.step()
    return time.perf_counter() - start


def bench_train(recipe_path: Path, *, trainable_layers: int = 2, steps: int = 5, batch_size: int = 32,
                overrides: list[str] | None = None, full: bool = True, echo=print) -> dict:
    """``full=False``: the partial row alone (its pace, e.g. one row of a conditioner table), no speed-up."""
    rows, graph = [], None
    for layers in (("all",) if full else ()) + (trainable_layers,):
        recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}", f"encoder.trainable_layers={layers}",
                                           *(overrides or [])])
        if graph is None:  # both modes read the same data section
            graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
        task = task_class(recipe.task).training(recipe, graph=graph)  # its model (a tail tower that does not train is frozen),
        # objective
        seed_everything(recipe.train.seed)
        rng = np.random.default_rng(recipe.train.seed)
        batches = [task.examples[rng.choice(len(task.examples), batch_size, replace=False)] for _ in range(steps)]
        model, _ = task.build_model(resolve_backbone(recipe.model.backbone))
        model.attach_layer_cache(recipe)
        criterion = task.make_loss(torch.device("cpu"))
        optimizer = make_optimizer([model, criterion], recipe.train.lr, recipe.train.weight_decay)
        model.train()
        start = time.perf_counter()
        task.before_step(model, criterion, 0)  # loss.table_negatives: the entity table, as training's first step
        table_seconds = time.perf_counter() - start

        warm = batches if model.layer_cache is not None else batches[:1]  # fill the cache / warm allocations
        warm_seconds = _timed_steps(task, model, criterion, optimizer, warm)
        with collect() as parts:  # where a steady-state step's time goes (kgc.profiling sections)
            seconds = _timed_steps(task, model, criterion, optimizer, batches)
        rate = steps * batch_size / seconds
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows.append({"trainable_layers": layers, "triples_per_s": round(rate, 2), "seconds": round(seconds, 2),
                     "warmup_seconds": round(warm_seconds, 2), "trainable_params": trainable,
                     "entity_table_seconds": round(table_seconds, 2) if criterion.table is not None else None,
                     "cache_layer": None if model.layer_cache is None else model.layer_cache.layer,
                     "seconds_per_step": {k: round(v / steps, 4) for k, v in parts.items()}})
        echo(f"trainable_layers={layers}: {rate:.1f} triples/s over {steps} steps of {batch_size} "
             f"(warm-up {warm_seconds:.1f}s" + (f"; entity table {table_seconds:.1f}s, once per refresh)"
                                                 if criterion.table is not None else ")"))
        step = parts.get("step", seconds) / steps
        for name, total in sorted(parts.items(), key=lambda kv: -kv[1]):
            if name != "step":
                echo(f"    {name:<40} {total / steps:8.3f} s/step  {100 * total / steps / step:5.1f} %")
        model.save_cache()
    ratio = rows[-1]["triples_per_s"] / rows[0]["triples_per_s"] if full else None
    if full:
        echo(f"speed-up of trainable_layers={trainable_layers} over full fine-tuning: {ratio:.2f}x")
    return {"recipe": str(recipe_path), "rows": rows, "speedup": None if ratio is None else round(ratio, 2),
            "threads": torch.get_num_threads()}


# ---------------------------------------------------------------- kgc bench loss


@contextlib.contextmanager
def _isin_masks():
    """A context in which the loss builds its masks with ``torch.isin`` over every (query, candidate) key, the
    reference :func:`kgc.linkpred.loss.is_known` and :func:`~kgc.linkpred.loss.false_negative_mask_all` replaced."""
    from kgc.linkpred import loss

    saved = loss.is_known, loss.false_negative_mask_all
    loss.is_known = lambda keys, train_keys: torch.isin(keys, train_keys)
    loss.false_negative_mask_all = lambda hr, gold, train_keys, n: loss.false_negative_mask(
        hr, gold, torch.arange(n, device=hr.device), train_keys, n)
    try:
        yield
    finally:
        loss.is_known, loss.false_negative_mask_all = saved


def bench_loss(recipe_path: Path, *, steps: int = 20, batch_size: int | None = None,
               overrides: list[str] | None = None, echo=print) -> dict:
    recipe = load_recipe(recipe_path, overrides or [])
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    task = task_class(recipe.task).training(recipe, graph=graph)  # its objective, as training makes it
    b = batch_size or recipe.train.batch_size
    keys = torch.as_tensor(graph.train_keys)
    r2, n, dim = 2 * graph.num_relations, graph.num_entities, 384
    gen = torch.Generator().manual_seed(recipe.train.seed)
    rows = keys[torch.randint(0, keys.numel(), (steps, b), generator=gen)]
    batches = [(k // n // r2, k // n % r2, k % n) for k in rows]  # (heads, rels, tails) of real train triples
    unit = lambda *shape: torch.nn.functional.normalize(torch.randn(*shape, dim, generator=gen), dim=-1)
    table = unit(n) if recipe.loss.table_negatives else None
    vectors = [(unit(b), unit(b), unit(b)) for _ in range(steps)]
    figures, losses = {}, {}
    for name, context in (("binary search", contextlib.nullcontext), ("torch.isin", _isin_masks)):
        criterion = task.make_loss(torch.device("cpu"))
        criterion.set_table(table)
        out = []
        with context():
            start = time.perf_counter()
            for (heads, rels, tails), (q, t, h) in zip(batches, vectors):
                q = q.clone().requires_grad_(True)
                tail, head = (None, None) if criterion.table_tails else (t, h)
                loss = criterion(q, tail, head, heads=heads, rels=rels, tails=tails, train_keys=keys,
                                 num_entities=n, num_relations2=r2)
                loss.backward()
                out.append(float(loss.detach()))
            figures[name] = (time.perf_counter() - start) / steps
        losses[name] = out
    if losses["binary search"] != losses["torch.isin"]:
        raise KGCError("kgc bench loss: the two masks gave different losses (a bug in kgc.linkpred.loss)")
    ratio = figures["torch.isin"] / figures["binary search"]
    for name, sec in figures.items():
        echo(f"{name:<14} {1000 * sec:9.2f} ms/step (batch {b}, {n:,} entities, {keys.numel():,} train keys"
             + (", the entity-table block" if table is not None else "") + ")")
    echo(f"binary search over torch.isin: {ratio:.1f}x faster; losses equal over {steps} steps")
    return {"recipe": str(recipe_path), "batch_size": b, "entities": n, "train_keys": int(keys.numel()),
            "table": table is not None, "ms_per_step": {k: round(1000 * v, 3) for k, v in figures.items()},
            "speedup": round(ratio, 2), "threads": torch.get_num_threads()}
