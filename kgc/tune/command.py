"""``kgc tune`` itself: a study run or continued here (or in ``--jobs`` workers), its outputs and what it says."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from kgc.errors import KGCError
from kgc.recipe import Recipe, load_recipe
from kgc.tune.space import format_value
from kgc.tune.storage import STUDY_DB, storage_error
from kgc.tune.study import Study
from kgc.tune.workers import _workers


def tune(recipe: str | Path, *, out: str | Path | None = None, trials: int | None = None,
         timeout_minutes: float | None = None, jobs: int = 1, storage: str | None = None,
         overrides: list[str] | None = None, echo: Callable[[str], None] = print, worker: bool = False,
         study_name: str | None = None, metric: str | None = None, sampler: str | None = None) -> dict:
    """Run (or continue) the study of ``recipe`` in ``out`` (default ``runs/tune-<name>``) until it holds
    ``trials`` finished trials (default ``tune.trials``); ``jobs`` worker processes here; ``metric`` and
    ``sampler`` the study's (default ``tune.metric``, ``tune.sampler``); return the summary."""
    base = load_recipe(Path(recipe), overrides or [])
    folder = Path(out) if out is not None else Path("runs") / f"tune-{base.name}"
    try:
        return _tune(recipe, base, folder, trials=trials, timeout_minutes=timeout_minutes, jobs=jobs, storage=storage,
                     overrides=overrides, echo=echo, worker=worker, study_name=study_name, metric=metric,
                     sampler=sampler)
    except Exception as exc:
        error = storage_error(exc, folder, storage)
        if error is None:
            raise
        raise error from None


def _tune(recipe: str | Path, base: Recipe, folder: Path, *, trials: int | None, timeout_minutes: float | None,
          jobs: int, storage: str | None, overrides: list[str] | None, echo: Callable[[str], None],
          worker: bool, study_name: str | None, metric: str | None, sampler: str | None) -> dict:
    n = trials or base.tune.trials
    study = Study(Path(recipe), folder, overrides=overrides, storage=storage, echo=echo, trials=n,
                  study_name=study_name, metric=metric, sampler=sampler)
    study.jobs = jobs
    timeout = 60 * (timeout_minutes or base.tune.timeout_minutes or 0) or None
    start = time.time()
    if jobs > 1 and not worker:
        argv = [sys.executable, "-m", "kgc", "tune", str(recipe), "--out", str(folder), "--trials", str(n), "--worker",
                "--storage", storage or f"sqlite:///{(folder / STUDY_DB).resolve()}", "--study-name", study.name,
                "--jobs", str(jobs), "--metric", study.metric, "--sampler", study.recipe.tune.sampler,
                *(a for o in overrides or [] for a in ("--set", o))]
        if timeout:
            argv += ["--timeout-minutes", f"{timeout / 60:g}"]
        with _workers(argv, jobs) as (procs, stopped):
            codes = [p.wait() for p in procs]
        if stopped:
            raise KGCError(f"kgc tune: stopped by {stopped[0]}; its {jobs} workers were stopped with it (each trial "
                           f"under way is tried again when the study continues); the study in {folder} keeps what "
                           "finished: run the same command again to continue it")
        if any(codes):
            raise KGCError(f"kgc tune: a worker exited with {max(codes)}; the study in {folder} keeps what finished "
                           "(run the same command again to continue it)")
    else:
        study.optimize(n, timeout)
    if worker:
        return {}
    summary = study.write_outputs()
    summary["seconds"] = round(time.time() - start, 1)
    if summary["best"]:
        b = summary["best"]
        echo(f"best: trial {b['trial']}, {study.metric} {b['value']:.4f}: "
             + ", ".join(f"{k}={format_value(v)}" for k, v in b["params"].items()))
        echo(f"wrote {b['recipe']}: kgc train {b['recipe']}")
    redrawn = f", {summary['redrawn']} draws redrawn" if summary["redrawn"] else ""
    echo(f"{summary['complete']} complete, {summary['pruned']} pruned, {summary['failed']} failed{redrawn}; "
         f"{folder / 'trials.md'}, plots: {', '.join(summary['plots']) or 'none'}")
    return summary
