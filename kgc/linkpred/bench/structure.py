"""The structural side's benchmarks: ``kgc bench rules`` (the rules mined on the recipe's graph, scored in blocks
against one query at a time, :func:`bench_rules`) and ``kgc bench structure`` (PyKEEN alone on its own bundled copy
of the recipe's dataset, :func:`bench_structure`, beside the run's own figures in :func:`structure_table`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from kgc.data.formats import load_graph
from kgc.errors import KGCError
from kgc.recipe import load_recipe


def bench_rules(recipe_path: Path, *, split: str = "test", batch_size: int = 64, overrides: list[str] | None = None,
                echo=print) -> dict:
    """Mined rules scoring a split's queries (both directions, in batches as evaluation asks): a small graph's
    per-relation tables (``RuleModel.tables``, every head's row computed at a relation's first query and kept)
    against rows computed for each batch's heads alone, on the same rules; the scores must be equal."""
    from kgc.linkpred.structure.rules import RuleModel, RulesOptions, mine_graph

    recipe = load_recipe(recipe_path, ["structure.model=rules", *(overrides or [])])
    config = recipe.structure
    if not isinstance(config, RulesOptions):  # the override above makes it one; a recipe cannot say otherwise
        raise KGCError(f"{recipe_path}: kgc bench rules needs structure.model=rules")
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    r2 = 2 * graph.num_relations
    start = time.perf_counter()
    rules, edges = mine_graph(config, graph)
    mined = time.perf_counter() - start
    if split not in graph.splits:
        raise KGCError(f"--split {split}: choose one of {', '.join(graph.splits)}")
    queries = graph.both_directions(split)  # (head, r, ?) then (tail, r + R, ?)
    heads, rels = queries[:, 0], queries[:, 1]
    seconds, scored = {}, {}
    for name in ("tables", "rows"):
        model = RuleModel(rules, edges, graph.num_entities, r2, config.rule_aggregation)
        if name == "rows":
            model.tables = None
        elif model.tables is None:
            raise KGCError(f"{graph.num_entities:,} entities × {r2} relations: the tables would pass TABLE_BYTES "
                           "(kgc.linkpred.structure.rules); this graph is scored by rows only")
        start = time.perf_counter()
        scored[name] = torch.cat([model.scores(heads[i: i + batch_size], rels[i: i + batch_size])
                                  for i in range(0, len(heads), batch_size)])
        seconds[name] = time.perf_counter() - start
    if not torch.equal(scored["tables"], scored["rows"]):
        raise KGCError("kgc bench rules: the tables gave other scores than the rows (a bug in kgc.linkpred.structure.rules)")
    ratio = seconds["rows"] / seconds["tables"]
    echo(f"{len(rules):,} rules mined in {mined:.1f} s ({graph.num_entities:,} entities, {r2} relations with the "
         f"inverses); {len(heads):,} {split} queries in batches of {batch_size}")
    for name, sec in seconds.items():
        echo(f"{name:<7} {sec:8.2f} s  ({len(heads) / sec:,.0f} queries/s)")
    echo(f"tables over rows: {ratio:.1f}x faster; the scores equal")
    return {"recipe": str(recipe_path), "split": split, "queries": len(heads), "batch_size": batch_size,
            "rules": len(rules), "mine_seconds": round(mined, 2),
            "seconds": {k: round(v, 3) for k, v in seconds.items()}, "speedup": round(ratio, 2)}


# datasets PyKEEN ships inside its wheel (no download): kgc's catalog name -> PyKEEN's dataset name
PYKEEN_BUNDLED = {"umls": "UMLS", "kinships": "Kinships", "nations": "Nations"}
STRUCTURE_METRICS = {"mrr": "inverse_harmonic_mean_rank", "hits_at_1": "hits_at_1", "hits_at_3": "hits_at_3",
                     "hits_at_10": "hits_at_10"}


def bench_structure(recipe_path: Path, *, overrides: list[str] | None = None, seeds=(0,), progress: bool = True,
                    echo=print) -> dict:
    """``kgc bench structure``: PyKEEN alone, as a PyKEEN user runs it — ``pipeline(dataset=<its own bundled
    copy>, …)`` with the recipe's ``structure:`` settings and inverse triples, evaluated by PyKEEN on test
    (filtered, both directions, realistic ranks) — the reference for the structure-only row of ``kgc evaluate``
    on a run of the same recipe (kgc trains the same pipeline on its own ids)."""
    import pykeen
    from pykeen.pipeline import pipeline

    from kgc.linkpred.structure.pykeen import pipeline_kwargs
    from kgc.training.common import pick_device

    recipe = load_recipe(recipe_path, overrides)
    config = recipe.structure
    if config is None:
        raise KGCError(f"{recipe_path}: no `structure:` section to run with PyKEEN alone (see recipes/*_fused.yaml)")
    if config.is_rules:
        raise KGCError(f"{recipe_path}: structure.model=rules is not a PyKEEN model; `kgc structure RUN` mines the "
                       "rules in seconds and prints their dev MRR alone")
    name = PYKEEN_BUNDLED.get(recipe.data.dataset) if recipe.data.path is None else None
    if name is None:
        raise KGCError(f"{recipe_path}: data.dataset={recipe.data.dataset!r} is not one PyKEEN ships in its wheel "
                       f"({', '.join(PYKEEN_BUNDLED)}); PyKEEN would download it, and this benchmark runs offline")
    device = pick_device(config.device or recipe.train.device)
    rows = []
    for seed in seeds:
        echo(f"PyKEEN pipeline: {config.model} on PyKEEN's {name}, seed {seed}")
        result = pipeline(dataset=name, dataset_kwargs={"create_inverse_triples": True},
                          **pipeline_kwargs(config, seed=seed, device=device, progress=progress))
        mr = result.metric_results
        row = {"seed": seed, "train_seconds": round(result.train_seconds, 1)}
        row.update({k: round(float(mr.get_metric(f"both.realistic.{m}")), 4) for k, m in STRUCTURE_METRICS.items()})
        rows.append(row)
        echo("  " + "  ".join(f"{k} {v}" for k, v in row.items()))
    mean = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ["train_seconds", *STRUCTURE_METRICS]}
    return {"recipe": str(recipe_path), "dataset": name, "model": config.model,
            "params": config.model_dump(mode="json"), "create_inverse_triples": True, "rows": rows, "mean": mean,
            "pykeen_version": pykeen.get_version(), "device": str(device)}


def structure_table(result: dict, run_results: dict | None = None) -> str:
    """Markdown: PyKEEN alone (mean over seeds), and kgc's structure-only and fused rows of a run's results.json."""
    head = "| | MRR | H@1 | H@3 | H@10 |\n|---|---|---|---|---|\n"
    fmt = lambda name, m: f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in STRUCTURE_METRICS) + " |\n"  # noqa: E731
    seeds = len(result["rows"])
    out = head + fmt(f"PyKEEN alone: pipeline on its {result['dataset']} ({seeds} seed{'s' * (seeds > 1)})",
                     result["mean"])
    if run_results:
        def pick(block):
            return {k: float(block["both"]["realistic"][m]) for k, m in STRUCTURE_METRICS.items()}
        comps = run_results.get("kgc", {}).get("components")
        if comps:
            out += fmt("kgc: text only", pick(comps["text"]))
            fused = run_results["kgc"]["structure"]
            alpha = "alpha per relation" if fused.get("per_relation") else f"alpha {fused['alpha']}"
            out += fmt(f"kgc: structure only ({fused.get('model', result['model'])})", pick(comps["structure"]))
            out += fmt(f"kgc: fused ({alpha})", pick(run_results))
        else:
            out += fmt("kgc run", pick(run_results))
    return out.rstrip("\n")
