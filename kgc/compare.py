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
from kgc.registry import CONDITIONERS, TASKS
from kgc.training.loop import train
from kgc.training.run import RunDir
from kgc.training.task import open_run, task_class

METRICS = {"MRR", "H@1", "H@3", "H@10", "dev MRR", "Spearman", "Pearson", "pair accuracy"}
SHARES = {"head above gold"}  # a share of the test queries, 0..1: three decimals (one would print 0.8933 as 0.9)


def _fmt_int(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def describe_conditioner(recipe) -> str:
    """The conditioner's own description of its options, and how much of the encoder trains."""
    cls = CONDITIONERS[recipe.model.conditioner]
    text = cls.describe({k: getattr(recipe.model, k) for k in cls.options})
    layers = recipe.encoder.trainable_layers
    return text + {"all": "", 0: ", frozen encoder"}.get(layers, f", top {layers} layers")


def describe_pooling(recipe, params: int) -> str:
    m = recipe.model
    if m.pooling != "s2sent":
        return m.pooling
    return f"s2sent (n={m.s2sent_blocks}, m={m.s2sent_frequencies}, r={m.s2sent_reduction}; +{_fmt_int(params)})"


def _row(run, results: dict, summary: dict, seconds: float) -> dict:
    recipe = run.recipe
    row = {"recipe": recipe.name, "conditioner": describe_conditioner(recipe),
           "pooling": describe_pooling(recipe, summary.get("pooling_params", 0)),
           "trainable params": summary["trainable_params"], "total params": summary["total_params"],
           "eval seconds": results["kgc"]["evaluation_seconds"], "cache bytes": results["kgc"]["cache_bytes"]}
    row.update(task_class(recipe.task).compare_row(run, results, summary, seconds))
    return row


def compare(recipes: list[Path], overrides: list[str], out: Path, *, echo=print, progress: bool = False) -> list[dict]:
    loaded = [load_recipe(path, overrides) for path in recipes]  # every recipe validated before any training
    tasks = {r.task for r in loaded}
    if len(tasks) > 1:
        raise KGCError(f"kgc compare: the recipes mix tasks ({', '.join(sorted(tasks))}); compare one task at a time")
    task = task_class(tasks.pop())
    names = [r.name for r in loaded]
    if len(set(names)) < len(names):
        raise KGCError(f"kgc compare: two recipes share a name ({', '.join(names)}); each run needs its own folder")
    rows: list[dict] = []
    out.mkdir(parents=True, exist_ok=True)
    state: dict = {}  # the task's memory over the recipes (C-STS: the split of each dataset, its baseline row)
    for recipe in loaded:
        split, before = task.compare_split(recipe, state, echo)
        rows.extend(before)
        run_dir = out / recipe.name
        seconds = None
        if RunDir.finished(run_dir):
            echo(f"{recipe.name}: already trained in {run_dir}, reusing it")
        else:
            start = time.perf_counter()
            if RunDir.resumable(run_dir):
                train(resume=run_dir, progress=progress, echo=echo)
            else:
                train(recipe, out=run_dir, progress=progress, echo=echo)
            seconds = time.perf_counter() - start
        run = open_run(run_dir, echo=echo)
        summary = run.dir.summary()
        if seconds is None:
            seconds = summary.get("train_seconds") or 0.0
        results = _evaluate(run, split, progress, echo)
        rows.append(_row(run, results, summary, seconds))
        value = rows[-1][task.compare_metric]
        echo(f"{recipe.name}: {split} {task.compare_metric} {'n/a' if value is None else f'{value:.4f}'}")
    table = markdown_table(rows, task.name)
    write_text(out / "compare.md", table + "\n")
    write_json(out / "compare.json", {"task": task.name, "overrides": overrides, "rows": rows})
    return rows


def _evaluate(run, split: str, progress: bool, echo=print) -> dict:
    """Evaluate ``run`` on ``split``, or reuse its results file when it is newer than the weights it scored."""
    done = run.dir.results(split)
    if done.is_file() and done.stat().st_mtime >= run.dir.weights_file().stat().st_mtime:
        results = json.loads(done.read_text(encoding="utf-8"))
        if isinstance(results, dict) and "cache_bytes" in results.get("kgc", {}):  # an older layout is redone
            echo(f"{run.recipe.name}: {split} results already in {done}, reusing them")
            return results
    return run.evaluation(split, progress=progress).results


def markdown_table(rows: list[dict], task: str | None = None) -> str:
    """``kgc compare``'s rows as markdown, in the columns of ``task`` (None: the default task's)."""
    columns = task_class(task or TASKS.default).compare_columns
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for col in columns:
            v = r.get(col)
            if v is None:
                cells.append("—")
            elif col in METRICS:
                cells.append(f"{v:.4f}")
            elif col in SHARES:
                cells.append(f"{v:.3f}")
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
