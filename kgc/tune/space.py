"""The search space (``tune.space``, or the task's and conditioner's shipped ones), a trial's draw from it, and the
Optuna sampler that draws (``tune.sampler``), seeded so a study is reproducible and workers draw apart."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from kgc.errors import KGCError
from kgc.recipe import ParamRange, Recipe


def format_value(v: Any) -> str:
    """A drawn value as trial lines, trials.md and best.yaml show it (floats to 4 significant digits)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def grid_points(space: dict[str, ParamRange]) -> dict[str, list] | None:
    """Every value of each parameter when the space is a grid (choices, int ranges, float ranges with a step);
    None when a parameter is a continuous range."""
    import numpy as np

    grid: dict[str, list] = {}
    for key, spec in space.items():
        if spec.choices is not None:
            grid[key] = list(spec.choices)
        elif spec.is_int():
            grid[key] = list(range(int(spec.low), int(spec.high) + 1, int(spec.step or 1)))
        elif spec.step is not None:
            n = int(math.floor((spec.high - spec.low) / spec.step + 1e-9)) + 1
            grid[key] = [float(round(v, 12)) for v in spec.low + spec.step * np.arange(n)]
        else:
            return None
    return grid


def make_sampler(kind: str, space: dict[str, ParamRange], seed: int, asked: int):
    """The Optuna sampler ``tune.sampler`` names, seeded with ``seed`` (:func:`sampler_seed`); a space the sampler
    cannot search is refused with the reason and the samplers that can."""
    import optuna

    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, asked // 4))
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        grid = grid_points(space)
        if grid is None:
            ranges = [k for k, v in space.items() if v.choices is None and not v.is_int() and v.step is None]
            raise KGCError(f"tune.sampler grid: {', '.join(ranges)} is a continuous range; give it a step "
                           "({low, high, step}) or choices, or use tpe, random or cmaes")
        size = math.prod(len(v) for v in grid.values())
        if size > 100_000:
            raise KGCError(f"tune.sampler grid: the space has {size:,} points; use tpe or random for a space "
                           "this large, or fewer values")
        return optuna.samplers.GridSampler(grid, seed=seed)
    if kind == "cmaes":
        choices = [k for k, v in space.items() if v.choices is not None]
        if choices or len(space) < 2:
            why = (f"{', '.join(choices)} {'is a choice' if len(choices) == 1 else 'are choices'}" if choices
                   else "the space has one parameter")
            raise KGCError(f"tune.sampler cmaes: CMA-ES searches two or more ranges, and {why}; use tpe, random "
                           "or grid")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental options in some Optuna versions
            return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=max(1, asked // 4),
                                                warn_independent_sampling=False)
    raise KGCError(f"tune.sampler {kind!r}: use tpe, random, grid or cmaes")


def default_space(recipe: Recipe) -> dict[str, dict]:
    """A recipe's space when its tune.space is empty: its task's (``Task.tune_space_for``) and its conditioner's
    (``Conditioner.tune_space``: the lr of the parameters it adds)."""
    from kgc.registry import CONDITIONERS
    from kgc.training.task import task_class

    return {**task_class(recipe.task).tune_space_for(recipe), **CONDITIONERS[recipe.model.conditioner].tune_space}


def suggest(trial, space: dict[str, ParamRange]) -> dict[str, Any]:
    values = {}
    for key, spec in space.items():
        if spec.choices is not None:
            values[key] = trial.suggest_categorical(key, spec.choices)
        elif spec.is_int():
            values[key] = trial.suggest_int(key, int(spec.low), int(spec.high), step=int(spec.step or 1),
                                            log=spec.log)
        else:
            values[key] = trial.suggest_float(key, spec.low, spec.high, step=spec.step, log=spec.log)
    return values


def sampler_seed(seed: int, study) -> int:
    """The seed of this process's sampler: the recipe's ``train.seed`` for a new study run by one process (a
    study is reproducible); moved on by the number of trials the study holds when it is continued, so a
    continuation draws new points instead of the first ones again; and by this process's id and host when other
    processes work on the study (``--jobs``, several machines on one ``--storage``), so workers draw apart."""
    import socket
    import zlib

    from optuna.trial import TrialState

    held = len(study.get_trials(deepcopy=False))
    others = os.environ.get("KGC_TUNE_WORKER") is not None or bool(
        study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    salt = zlib.crc32(f"{socket.gethostname()}:{os.getpid()}:{os.environ.get('KGC_TUNE_WORKER', '')}".encode()) \
        if others else 0
    return (seed + 1_000_003 * held + salt) % (2 ** 32)
