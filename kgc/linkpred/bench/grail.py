"""``kgc bench grail RECIPE``: GraIL's inductive splits, each trained on its training graph and evaluated on its
inference graph, both protocols, beside the structural rows the same inference graph gives without training.

For each split (default: the four of the recipe's graph, e.g. ``grail-wn18rr-v1`` … ``v4`` for
``recipes/grail_wn18rr.yaml``; ``make bench-grail`` runs both recipes, all eight, into one table):

1. ``kgc train RECIPE --set data.dataset=SPLIT --out RUNS/SPLIT`` (a finished run is reused; its seconds kept);
2. the text model on the inference graph: the full filtered ranking over every inference entity
   (``kgc evaluate --inductive``) and GraIL's 50 candidates (``--negatives 50``, the draws in the ranks file);
3. on the same queries and the same draws: personalized PageRank from the query's entity over the known inference
   graph (:mod:`kgc.linkpred.evaluation.pagerank`, a floor), closed path rules mined on the known inference graph
   (:mod:`kgc.linkpred.structure.rules`), and the text model fused with those rules,
   α·z(text) + (1 − α)·z(rules), one α for all queries chosen on the inference graph's dev triples by MRR;
4. the seconds of training, of each evaluation, and the text model's query cost (ms per query encoded).

The rows go to ``RUNS/inductive.json`` and ``RUNS/inductive.md`` (docs/results/inductive.md holds this machine's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from kgc.errors import KGCError

ALPHAS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)


def _metrics(results: dict) -> dict:
    both = results["both"]["realistic"]
    return {"MRR": round(float(both["inverse_harmonic_mean_rank"]), 4), "H@1": round(float(both["hits_at_1"]), 4),
            "H@3": round(float(both["hits_at_3"]), 4), "H@10": round(float(both["hits_at_10"]), 4)}


def _z(x: torch.Tensor) -> torch.Tensor:
    """kgc's fusion's z-score (one name, so a test can count the calls)."""
    from kgc.linkpred.structure.pykeen import standardise

    return standardise(x)


def _once(scores):
    """``scores(queries)``, computed once per block of queries: the α grid and both protocols ask for the same
    blocks again (the dev grid once per α, the test blocks once per protocol)."""
    seen: dict[bytes, torch.Tensor] = {}

    def call(q: np.ndarray) -> torch.Tensor:
        key = np.ascontiguousarray(q).tobytes()
        if key not in seen:
            seen[key] = scores(q)
        return seen[key]

    return call


def structural_rows(run, graph, *, negatives: int, seed: int, batch_size: int = 128) -> dict:
    """PageRank, rules and text + rules on ``graph`` (the inference graph, the run's relation ids): both
    protocols each, the draws the same as the text model's (same seed). The text and rule scores of a block of
    queries and their z-scores are computed once, whatever α and protocol ask for them; so a row's ``seconds`` are
    what it adds (the text + rules row reuses the rules row's scores of the test queries)."""
    from kgc.linkpred.evaluation.pagerank import pagerank_scores, transition
    from kgc.linkpred.evaluation.sampled import filtered_ranks, sampled_ranks
    from kgc.linkpred.evaluation.scoring import entity_states
    from kgc.linkpred.structure.options import RulesOptions
    from kgc.linkpred.structure.rules import RuleModel, mine_graph

    rows: dict[str, dict] = {}
    p = transition(graph)

    @_once
    def ppr(q: np.ndarray) -> torch.Tensor:
        return pagerank_scores(p, q[:, 0])

    config = run.recipe.structure if isinstance(run.recipe.structure, RulesOptions) else RulesOptions()
    start = time.perf_counter()
    rules, edges = mine_graph(config, graph)
    mined = time.perf_counter() - start
    rule_model = RuleModel(rules, edges, graph.num_entities, 2 * graph.num_relations, config.rule_aggregation)

    @_once
    def rule(q: np.ndarray) -> torch.Tensor:
        return rule_model.scores(q[:, 0], q[:, 1]).float()

    model = run.predictor.model_for(graph)
    heads = np.unique(np.concatenate([graph.both_directions(s)[:, 0] for s in ("dev", "test")]))
    engine, table, _, _, _ = entity_states(model, batch_size=batch_size, heads=heads)
    table = table.float().to(model.device)

    @_once
    def z_text(q: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            return _z((engine(q[:, 0], q[:, 1]).float().to(table.device) @ table.T).cpu())

    z_rule = _once(lambda q: _z(rule(q)))

    def fused(alpha: float):
        return lambda q: alpha * z_text(q) + (1 - alpha) * z_rule(q)

    grid = {a: _metrics(filtered_ranks(graph, "dev", fused(a), batch_size=batch_size).results)["MRR"]
            for a in ALPHAS} if len(graph.splits["dev"]) else {1.0: None}
    alpha = max(grid, key=lambda a: (grid[a] or 0, a))

    def on_candidates(full):
        return lambda q, c: torch.gather(full(q), 1, torch.as_tensor(c))

    for name, full in (("pagerank", ppr), ("rules", rule), ("text + rules", fused(alpha))):
        tick = time.perf_counter()
        rows[name] = {"full": _metrics(filtered_ranks(graph, "test", full, batch_size=batch_size).results),
                      "sampled": _metrics(sampled_ranks(graph, "test", on_candidates(full), negatives=negatives,
                                                        seed=seed, batch_size=batch_size).results),
                      "seconds": round(time.perf_counter() - tick, 2)}
    rows["rules"]["mined"] = {"rules": len(rules), "seconds": round(mined, 2)}
    rows["text + rules"]["alpha"] = {"chosen": alpha, "dev MRR": {str(a): m for a, m in grid.items()}}
    return rows


def bench_grail(recipe_path: Path, *, splits: list[str] | None = None, runs: Path = Path("runs/grail"),
                negatives: int = 50, seed: int = 0, overrides: list[str] | None = None, progress: bool = False,
                echo=print) -> dict:
    """Train and evaluate ``splits`` (module docstring); returns ``{"rows": [...], "machine": …}``."""
    from kgc.data.grail import SPLITS
    from kgc.encoding.precision import describe_cpu
    from kgc.linkpred.evaluation.inductive import inductive_graph
    from kgc.linkpred.answer.results import inference_folder
    from kgc.fileio import write_json, write_text
    from kgc.recipe import load_recipe
    from kgc.training.loop import train
    from kgc.training.task import open_run

    if not splits:  # the four of the recipe's own graph (its data.dataset: grail-wn18rr-v1 → WN18RR v1–v4)
        named = load_recipe(recipe_path, overrides or []).data.dataset
        if named not in SPLITS:
            raise KGCError(f"{recipe_path}: data.dataset is {named!r}, not a GraIL split; give --splits, or a recipe "
                           "on one (recipes/grail_wn18rr.yaml, recipes/grail_fb237.yaml)")
        splits = [name for name, (kg, _) in SPLITS.items() if kg == SPLITS[named][0]]
    splits = list(splits)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise KGCError(f"--splits: {', '.join(unknown)} are not GraIL splits ({', '.join(SPLITS)})")
    out = Path(runs)
    rows = []
    for name in splits:
        run_dir = out / name
        if not (run_dir / "train_summary.json").is_file():
            echo(f"{name}: training {recipe_path} → {run_dir}")
            tick = time.perf_counter()
            train(load_recipe(recipe_path, [*(overrides or []), f"data.dataset={name}"]), out=run_dir,
                  progress=progress, echo=lambda line: None)
            echo(f"{name}: trained in {time.perf_counter() - tick:.0f}s")
        run = open_run(run_dir, echo=None)
        summary = run.dir.summary() or {}
        tick = time.perf_counter()
        full = run.evaluation("test", inductive=True, progress=progress)
        full_seconds = time.perf_counter() - tick
        tick = time.perf_counter()
        sampled = run.evaluation("test", inductive=True, negatives=negatives, seed=seed, progress=progress)
        sampled_seconds = time.perf_counter() - tick
        graph, info = inductive_graph(inference_folder(run.predictor), run.predictor.graph(), split="test",
                                      candidates="all", long_text=run.recipe.data.long_text)
        structure = structural_rows(run, graph, negatives=negatives, seed=seed)
        k = full.results["kgc"]
        row = {"split": name, "train_seconds": summary.get("train_seconds"), "train_steps": summary.get("steps"),
               "precision": (summary.get("precision") or {}).get("name"),
               "entities": info["entities"], "test_triples": int(len(graph.splits["test"])),
               "text": {"full": _metrics(full.results), "sampled": _metrics(sampled.results),
                        "seconds": {"full": round(full_seconds, 2), "sampled": round(sampled_seconds, 2)},
                        "query_ms": round(1000 * k["query_encoding_seconds"] / max(1, k["queries"]), 3)},
               **structure, "shared_entities": info["seen_in_training"]}
        rows.append(row)
        echo(f"{name}: text MRR {row['text']['full']['MRR']:.4f} H@10 {row['text']['full']['H@10']:.4f} (all "
             f"{info['entities']} entities); H@10 {row['text']['sampled']['H@10']:.4f} against {negatives - 1} "
             f"negatives; text + rules MRR {row['text + rules']['full']['MRR']:.4f}; PageRank MRR "
             f"{row['pagerank']['full']['MRR']:.4f}")
    for row in rows:
        row.update(recipe=str(recipe_path), overrides=overrides or [])
    earlier = _earlier_rows(out / "inductive.json", negatives, seed)
    done = {r["split"] for r in rows}
    rows = sorted([r for r in earlier if r["split"] not in done] + rows, key=lambda r: list(SPLITS).index(r["split"]))
    result = {"rows": rows, "negatives": negatives, "seed": seed, "machine": describe_cpu(),
              "torch_threads": torch.get_num_threads()}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "inductive.json", result)
    write_text(out / "inductive.md", table(result))
    echo(f"wrote {out / 'inductive.json'} and {out / 'inductive.md'}")
    return result


def _earlier_rows(path: Path, negatives: int, seed: int) -> list[dict]:
    """The rows an earlier ``kgc bench grail`` into the same folder wrote (another recipe's splits: the WN18RR and
    FB15k-237 recipes fill one table), when they were ranked against the same draws; none otherwise."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(earlier, dict) or (earlier.get("negatives"), earlier.get("seed")) != (negatives, seed):
        return []
    return [r for r in earlier.get("rows", []) if isinstance(r, dict) and "split" in r]


def table(result: dict) -> str:
    """The rows as markdown: per split, each method's full-ranking MRR / H@10 and its H@10 against the sampled
    negatives, then the costs."""
    methods = ("text", "text + rules", "rules", "pagerank")
    head = ("| split | " + " | ".join(f"{m} MRR | {m} H@10 | {m} H@10 ({result['negatives']})" for m in methods)
            + " | train s | eval s | ms/query |")
    lines = [head, "|" + "---|" * (1 + 3 * len(methods) + 3)]
    for r in result["rows"]:
        cells = [r["split"]]
        for m in methods:
            cells += [f"{r[m]['full']['MRR']:.4f}", f"{r[m]['full']['H@10']:.4f}", f"{r[m]['sampled']['H@10']:.4f}"]
        train = f"{r['train_seconds']:.0f}" if r.get("train_seconds") else "-"
        cells += [train, f"{r['text']['seconds']['full'] + r['text']['seconds']['sampled']:.1f}",
                  f"{r['text']['query_ms']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    recipes = sorted({r["recipe"] for r in result["rows"]})
    return "\n".join(lines) + f"\n\nrecipes: {', '.join(recipes)}; {result['negatives']} candidates per side, seed " \
        f"{result['seed']}\n"
