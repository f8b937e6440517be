"""``kgc compare``: train and evaluate several recipes of one task under one budget, and tabulate them.

The same ``--set`` overrides (the budget: epochs, max_steps, batch size, …) apply to every recipe. A run
already finished in the output folder is reused (and its results file, when newer than its weights), an
interrupted one resumed. The table is the
toolkit's version of the papers' tables:

* link prediction: conditioner, pooling, MRR, H@1, H@3, H@10 (test), the best dev MRR (when the recipe
  validates), trainable/total parameters, training
  triples/s, training seconds, evaluation seconds (all of it) and query seconds (the query vectors alone,
  entity states cached: the cost a deployed model pays per query), cache bytes;
* C-STS: conditioner, pooling, Spearman, Pearson, pair accuracy, trainable/total parameters, training
  pairs/s, training and evaluation seconds, cache bytes — with, before the first recipe of each
  dataset, a row for the condition-blind baseline (the untrained backbone's plain sentence cosine) on
  the same split: the test split when it has labels, else the validation split (the official C-STS test
  labels are hidden).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kgc.errors import KGCError
from kgc.fileio import write_json, write_text
from kgc.recipe import load_recipe
from kgc.training.loop import train
from kgc.training.run import open_run

COLUMNS = {
    "linkpred": ["recipe", "conditioner", "pooling", "MRR", "H@1", "H@3", "H@10", "dev MRR", "trainable params",
                 "total params", "train triples/s", "train seconds", "eval seconds", "query seconds", "cache bytes"],
    "csts": ["recipe", "conditioner", "pooling", "data", "Spearman", "Pearson", "pair accuracy", "trainable params",
             "total params", "train pairs/s", "train seconds", "eval seconds", "cache bytes"],
}
METRICS = {"MRR", "H@1", "H@3", "H@10", "dev MRR", "Spearman", "Pearson", "pair accuracy"}


def _fmt_int(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def describe_conditioner(recipe) -> str:
    m = recipe.model
    extra = {"hypernet": f" ({m.hypernet_form}, K={m.rank or 'H/12'})",
             "router": f" (k={m.router_layers or 1}, {m.scorer}, {m.weighting}"
                       + (f", cross-attends {m.cross_attend}" if m.cross_attend != "none" else "") + ")",
             "biencoder": f" + CSR in the top {m.router_layers} layers ({m.weighting})" if m.router_layers else "",
             "case": f" ({m.case_projection}, k={m.case_dim or 'H'})"}.get(m.conditioner, "")
    layers = recipe.encoder.trainable_layers
    return m.conditioner + extra + {"all": "", 0: ", frozen encoder"}.get(layers, f", top {layers} layers")


def describe_pooling(recipe, params: int) -> str:
    m = recipe.model
    if m.pooling != "s2sent":
        return m.pooling
    return f"s2sent (n={m.s2sent_blocks}, m={m.s2sent_frequencies}, r={m.s2sent_reduction}; +{_fmt_int(params)})"


def _row(run, ev, summary: dict, seconds: float) -> dict:
    recipe = run.recipe
    row = {"recipe": recipe.name, "conditioner": describe_conditioner(recipe),
           "pooling": describe_pooling(recipe, summary.get("pooling_params", 0)),
           "trainable params": summary["trainable_params"], "total params": summary["total_params"],
           "eval seconds": ev.results["kgc"]["evaluation_seconds"], "cache bytes": ev.results["kgc"]["cache_bytes"]}
    if recipe.task == "linkpred":
        both = ev.results["both"]["realistic"]
        row.update({"MRR": both["inverse_harmonic_mean_rank"], "H@1": both["hits_at_1"], "H@3": both["hits_at_3"],
                    "H@10": both["hits_at_10"], "train triples/s": summary["triples_per_s"],
                    "train seconds": round(seconds, 1), "dev MRR": summary.get("best_dev_mrr"),
                    "query seconds": ev.results["kgc"].get("query_encoding_seconds")})
    else:
        r = ev.results
        row.update({"data": f"{recipe.data.dataset} {r['split']}", "Spearman": r["spearman"], "Pearson": r["pearson"],
                    "pair accuracy": r["pair_accuracy"],
                    "train pairs/s": summary["pairs_per_s"], "train seconds": round(seconds, 1)})
    return row


def compare(recipes: list[Path], overrides: list[str], out: Path, *, echo=print, progress: bool = False) -> list[dict]:
    loaded = [load_recipe(path, overrides) for path in recipes]  # every recipe validated before any training
    tasks = {r.task for r in loaded}
    if len(tasks) > 1:
        raise KGCError(f"kgc compare: the recipes mix tasks ({', '.join(sorted(tasks))}); compare one task at a time")
    task = tasks.pop()
    names = [r.name for r in loaded]
    if len(set(names)) < len(names):
        raise KGCError(f"kgc compare: two recipes share a name ({', '.join(names)}); each run needs its own folder")
    rows = []
    out.mkdir(parents=True, exist_ok=True)
    splits: dict[str, str] = {}  # C-STS dataset → the split every recipe on it is evaluated on
    for recipe in loaded:
        split = "test"
        if task == "csts":
            key = _data_key(recipe)
            if key not in splits:
                splits[key], blind = _blind_row(recipe, echo)
                rows.append(blind)
            split = splits[key]
        run_dir = out / recipe.name
        seconds = None
        if (run_dir / "train_summary.json").is_file():
            echo(f"{recipe.name}: already trained in {run_dir}, reusing it")
        else:
            start = time.perf_counter()
            if (run_dir / "checkpoints" / "last.pt").is_file():
                train(resume=run_dir, progress=progress, echo=echo)
            else:
                train(recipe, out=run_dir, progress=progress, echo=echo)
            seconds = time.perf_counter() - start
        summary = json.loads((run_dir / "train_summary.json").read_text())
        if seconds is None:
            seconds = summary.get("train_seconds") or 0.0
        run = open_run(run_dir)
        ev = _evaluate(run, split, progress, echo)
        rows.append(_row(run, ev, summary, seconds))
        key = "MRR" if task == "linkpred" else "Spearman"
        value = rows[-1][key]
        echo(f"{recipe.name}: {split} {key} {'n/a' if value is None else f'{value:.4f}'}")
    table = markdown_table(rows, task)
    write_text(out / "compare.md", table + "\n")
    write_json(out / "compare.json", {"task": task, "overrides": overrides, "rows": rows})
    return rows


def _evaluate(run, split: str, progress: bool, echo=print):
    """Evaluate ``run`` on ``split``, or reuse its results file when it is newer than the weights it scored."""
    from types import SimpleNamespace

    done = run.path / f"results{'' if split == 'test' else f'.{split}'}.json"
    if done.is_file() and done.stat().st_mtime >= (run.path / "best.pt").stat().st_mtime:
        echo(f"{run.recipe.name}: {split} results already in {done}, reusing them")
        return SimpleNamespace(results=json.loads(done.read_text()))
    if run.recipe.task == "linkpred":
        from kgc.linkpred.evaluate import evaluate_run

        return evaluate_run(run, split, progress=progress)
    from kgc.csts.evaluate import evaluate_run

    return evaluate_run(run, split, progress=progress)


def _data_key(recipe) -> str:
    d = recipe.data
    return f"{d.dataset}|{d.path}|{d.synth.model_dump() if d.dataset == 'synth-csts' else ''}"


def _blind_row(recipe, echo) -> tuple[str, dict]:
    """(the split to evaluate this recipe's dataset on — test when it has labels, else validation — and the
    condition-blind baseline's row there: plain sentence cosine of the recipe's untrained backbone)."""
    from kgc.csts.data import load_csts
    from kgc.csts.evaluate import condition_blind
    from kgc.encoding.backbone import resolve_backbone

    d = recipe.data
    start = time.perf_counter()
    data = load_csts(d.dataset, d.path, d.synth)
    split = "test" if "test" in data.splits and data.splits["test"].labelled.any() else "validation"
    r = condition_blind(data, resolve_backbone(recipe.model.backbone), split, max_tokens=d.max_tokens)
    seconds = time.perf_counter() - start
    rho = "n/a" if r["spearman"] is None else f"{r['spearman']:.4f}"
    echo(f"condition-blind baseline on {d.dataset}: {split} Spearman {rho}")
    return split, {"recipe": "(condition-blind)", "conditioner": "none: cos(f(s1), f(s2)), untrained", "pooling": "mean",
            "data": f"{d.dataset} {split}",
            "Spearman": r["spearman"], "Pearson": r["pearson"], "pair accuracy": r["pair_accuracy"],
            "trainable params": None, "total params": None, "train pairs/s": None, "train seconds": None,
            "eval seconds": round(seconds, 1), "cache bytes": None}


def markdown_table(rows: list[dict], task: str = "linkpred") -> str:
    columns = COLUMNS[task]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for col in columns:
            v = r.get(col)
            if v is None:
                cells.append("—")
            elif col in METRICS:
                cells.append(f"{v:.4f}")
            elif col.endswith("params"):
                cells.append(_fmt_int(v) if v else "—")
            elif col == "cache bytes":
                cells.append(f"{v / 2**20:.1f} MiB")
            elif isinstance(v, float):
                cells.append(f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
