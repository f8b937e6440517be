"""One trial: its values drawn (never a point twice), its recipe resolved with the budget, trained, each
validation reported to Optuna's pruner; the objective is its best dev figure."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from kgc.errors import KGCError
from kgc.recipe import resolve_recipe
from kgc.tune.budget import budget_overrides, report_steps
from kgc.tune.space import format_value, suggest


class DuplicatePoint(Exception):
    """A draw that repeated another trial's values: that trial fails without training (Optuna records it), and
    the sampler draws again."""


class Surplus(DuplicatePoint):
    """A trial a ``--jobs`` worker asked for when the trials finished and those running in the other workers already
    make the number asked (Optuna's MaxTrialsCallback counts only at a trial's end, so ``--trials 2 --jobs 2`` ran
    3): it trains nothing, stops its worker, and is left out of the study's outputs. A process on its own (no
    ``--jobs``) never counts running trials: one left RUNNING by a process that died is not a worker."""


def run_trial(study: Any, trial) -> float:
    """Optuna's objective for ``study`` (a :class:`kgc.tune.study.Study`): trial ``trial`` trained in ``STUDY/trials/NNNN`` (a retried one from
    nothing), each validation reported (and pruned where its curve falls behind), its best dev figure returned.
    A draw that repeats another trial's values raises :class:`DuplicatePoint`, a ``--jobs`` worker's trial past
    the number asked :class:`Surplus`; a KGCError stops the study with its one message."""
    import optuna

    from kgc.training.loop import train

    from optuna.trial import TrialState

    others = [t for t in study.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
              if t.number != trial.number] if os.environ.get("KGC_TUNE_WORKER") is not None else []
    if others and study.finished() + len(others) >= study.asked:  # --jobs: the other workers finish what was asked
        trial.set_user_attr("surplus", True)
        trial.study.stop()
        raise Surplus(f"{study.finished()} trials finished and {len(others)} running of the {study.asked} asked")
    values = suggest(trial, study.space)
    same = study.same_values(trial, values)
    if same is not None:  # never a point twice: this draw fails (it trains nothing) and the next is drawn anew
        study.duplicates += 1
        trial.set_user_attr("duplicate_of", same)
        study.echo(f"trial {trial.number}: the values of trial {same} again; drawing anew")
        raise DuplicatePoint(f"the values of trial {same}")
    with_values = resolve_recipe(study.recipe_path, {**study.fixed, **values})
    extra = budget_overrides(with_values, study.budget, study.recipe.tune.reports)
    recipe = resolve_recipe(study.recipe_path, {**study.fixed, **values, **extra})
    recipe.name = f"{study.recipe.name}-trial{trial.number:04d}"
    metric, sign = study.metric, (1 if study.direction == "maximize" else -1)
    out = study.trial_dir(trial.number)
    if out.exists():  # a retried trial (its process was killed): start it again from nothing
        import shutil

        shutil.rmtree(out)
    study.echo(f"trial {trial.number}: " + ", ".join(f"{k}={format_value(v)}" for k, v in values.items()))
    last = recipe.train.max_steps  # the budget's last step (None: a budget in minutes)
    start = time.perf_counter()
    best: list[float] = []  # the trial's best dev figure so far (in the study's direction)

    def report(step: int, figures: dict) -> None:
        value = float(figures[metric])
        if not math.isnan(value) and (not best or sign * value > sign * best[0]):
            best[:] = [value]
        trial.report(value, step)
        seconds = time.perf_counter() - start
        study.echo(f"trial {trial.number}: step {step}{f'/{last}' if last else ''}, {metric} {value:.4f} "
                  f"({seconds:.0f}s, {step / max(seconds, 1e-9):.2f} steps/s)")
        if (last is None or step < last) and trial.should_prune():  # never at its last report: it is done
            study.echo(f"trial {trial.number}: pruned at step {step} ({metric} {value:.4f}, behind the "
                      f"earlier trials at that step)")
            raise optuna.TrialPruned(f"dev {value:.4f} at step {step}")

    try:
        with study.tracked(trial.number):
            train(recipe, out=out, progress=False, echo=lambda m: None, on_validation=report,
                  validate_at=report_steps(last, study.recipe.tune.reports))
    except KGCError as exc:  # a full disk, a bad value: the study stops with this one message
        study.stopped = exc
        study.tag_trial(out, "failed")
        raise KGCError(f"trial {trial.number} ({out}): {exc}") from None
    except optuna.TrialPruned:
        study.tag_trial(out, "pruned")
        raise
    study.tag_trial(out, "complete", best[0] if best else None)
    if not best:
        raise KGCError(f"{out}: the trial validated nothing, so it has no {metric}; give tune.budget room for "
                       "at least one validation")
    trial.set_user_attr("run", str(out))
    study.echo(f"trial {trial.number}: complete, best {metric} {best[0]:.4f} "
              f"({time.perf_counter() - start:.0f}s)")
    return best[0]
