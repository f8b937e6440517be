"""What a study leaves in its folder: ``trials.csv`` and ``trials.md`` (best first), ``best.yaml`` (the recipe with
the best trial's values) and Optuna's plots (history, slice, importance)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import yaml

from kgc.fileio import write_text, write_with
from kgc.recipe import resolve_recipe
from kgc.tune.budget import _budget_text
from kgc.tune.space import format_value


def write_outputs(study: Any) -> dict:
    """trials.csv and trials.md (best first; a --jobs surplus trial left out), best.yaml and the plots of
    ``study`` (a :class:`kgc.tune.study.Study`, typed loosely so this module does not import it back); the
    summary: counts of each state, the best trial, the plots drawn."""
    from optuna.trial import TrialState

    trials = study.study.get_trials(deepcopy=False)
    rows = []
    trials = [t for t in trials if "surplus" not in t.user_attrs]  # asked past the number wanted: never run
    for t in trials:
        run = study.trial_dir(t.number)
        took = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        rows.append({"trial": t.number, "state": t.state.name.lower(),
                     "value": None if t.value is None else round(t.value, 4),
                     "steps": max(t.intermediate_values, default=None),
                     "start": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
                     "seconds": None if took is None else round(took, 1),
                     # a trial a killed process left, run again (Optuna's failed_trial): the number it retries
                     "retries": t.system_attrs.get("failed_trial"),
                     **{k: t.params.get(k) for k in study.space}, "run": str(run)})
    sign = 1 if study.direction == "maximize" else -1
    rows.sort(key=lambda r: (r["value"] is None, -sign * (r["value"] or 0), r["trial"]))  # best first
    _write_csv(study.folder / "trials.csv", rows)
    write_text(study.folder / "trials.md", _markdown(rows, study.metric))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    out = {"study": str(study.folder), "trials": len(trials), "complete": len(complete),
           "pruned": sum(t.state == TrialState.PRUNED for t in trials),
           "failed": sum(t.state == TrialState.FAIL and "duplicate_of" not in t.user_attrs for t in trials),
           "redrawn": sum("duplicate_of" in t.user_attrs for t in trials), "best": None, "plots": []}
    if complete:
        best = study.study.best_trial
        path = study.folder / "best.yaml"
        write_text(path, best_recipe_text(study, best.params, best.value, best.number))
        out["best"] = {"trial": best.number, "value": best.value, "params": best.params, "recipe": str(path)}
    out["plots"] = plots(study, len(complete))
    return out


def best_recipe_text(study: Any, params: dict, value: float, number: int) -> str:
    """The study's recipe with the best trial's values set (the trials' budget left out): a file for kgc
    train, the recipe resolved in full."""
    recipe = resolve_recipe(study.recipe_path, {**study.fixed, **params})
    tree = yaml.safe_load(recipe.to_yaml())
    tree.pop("tune", None)
    head = (f"# kgc tune {study.recipe_path} → trial {number} of {study.folder}: best "
            f"{study.metric} {value:.4f} at {_budget_text(study.budget, study.task.unit)}\n"
            f"# {', '.join(f'{k}={format_value(v)}' for k, v in params.items())}\n")
    return head + yaml.safe_dump(tree, sort_keys=False)


def plots(study: Any, complete: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    drawn = []
    kinds = [("history.png", ovm.plot_optimization_history, 1), ("slice.png", ovm.plot_slice, 1)]
    if len(study.space) > 1:
        kinds.append(("importance.png", ovm.plot_param_importances, 2))
    for name, draw, least in kinds:
        if complete < least:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            ax = draw(study.study, target_name=study.metric)  # the axis names the metric (not "Objective Value")
        import numpy as np

        fig = np.ravel(ax)[0].get_figure()  # one axes, or an array of them (slice: one per parameter)
        fig.set_size_inches(max(6.0, 3.2 * len(study.space)) if name == "slice.png" else 7.0, 4.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the slice plot's colour bar is not a tight_layout axes: harmless
            fig.tight_layout()
        write_with(study.folder / name, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        drawn.append(name)
    return drawn


def _write_csv(path: Path, rows: list[dict]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
            writer.writeheader()
            writer.writerows(rows)

    write_with(path, write)


def _markdown(rows: list[dict], metric: str) -> str:
    if not rows:
        return "no trials yet\n"
    keys = [k for k in rows[0] if k not in ("run", "start")]
    head = ["trial", "state", metric, "steps", *keys[4:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:  # in the caller's order: best first
        lines.append("| " + " | ".join("" if r[k] is None else format_value(r[k]) for k in keys) + " |")
    return "\n".join(lines) + "\n"
