"""``kgc tune RECIPE``: hyperparameter search with Optuna over a recipe's ``tune:`` section.

Each trial is a normal training run (``STUDY/trials/NNNN``) of the recipe with the trial's values set and the
same budget for every trial (``tune.budget``: "N triples" — the task's unit —, "N steps" or "N minutes"). The
trial validates ``tune.reports`` times; each dev figure (the task's metric: dev MRR, dev Spearman) is reported to
Optuna, whose pruner (``tune.pruner``: median, or successive halving) stops a trial whose curve falls behind. The
objective is the trial's best dev figure, maximised by TPE. The study lives in ``STUDY/study.db`` (SQLite, with
Optuna's heartbeats: a trial whose process was killed is marked failed and its values tried again once), so the
same command run again continues the study until it holds ``tune.trials`` finished (complete or pruned) trials or
``tune.timeout_minutes`` have passed. ``--storage URL`` puts the study in any database Optuna reads (several
machines then work on one study); ``--jobs K`` starts K worker processes here.

At the end (and after each call): ``best.yaml`` (the recipe with the best trial's values, ready for ``kgc
train``), ``trials.csv`` and ``trials.md`` (each trial's values, dev figure, steps, state), and the plots Optuna
draws with matplotlib: ``history.png`` (optimisation history), ``importance.png`` (parameter importances) and
``slice.png`` (the figure against each parameter).

A search space is written as ``KEY: {low, high[, log, step]}`` or ``KEY: {choices: [...]}``, keys as ``--set``
writes them. Without one, the task's and the conditioner's shipped spaces are searched (``tune_space`` on each class).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import yaml

from kgc.errors import KGCError
from kgc.fileio import write_text, write_with
from kgc.recipe import ParamRange, Recipe, load_recipe, parse_overrides, resolve_recipe

STUDY_DB = "study.db"
STUDY_JSON = "study.json"  # the study this folder holds: its name and what makes its trials comparable


def trial_folders(folder: Path) -> list[str]:
    """The trial folders a study's folder holds (``trials/0000`` …), by name."""
    trials = Path(folder) / "trials"
    return sorted(p.name for p in trials.iterdir() if p.is_dir()) if trials.is_dir() else []


def check_sqlite_storage(url: str, folder: Path) -> None:
    """A study's SQLite storage, checked before Optuna opens it: a file that is not a readable SQLite database, fails
    SQLite's integrity check or holds no Optuna tables is one message naming it (not a SQLAlchemy traceback); an empty
    or missing one is a new study's — unless trial folders beside it say a study was there, when it is refused
    rather than started over (a new study would write its trials into those folders)."""
    import sqlite3

    if not url.startswith("sqlite:///"):
        return
    path = Path(url[len("sqlite:///"):])
    trials = trial_folders(folder)
    fix = ("Restore it from a copy, or give another --out for a new study (the trial folders stay as they are); "
           "nothing was started over.")
    if not path.is_file() or path.stat().st_size == 0:
        if trials:
            raise KGCError(f"{path}: the study's storage is {'missing' if not path.exists() else 'empty (0 bytes)'}, "
                           f"but {Path(folder) / 'trials'} holds {len(trials)} trial folder(s) "
                           f"({', '.join(trials[:3])}{', …' if len(trials) > 3 else ''}): the study's record is lost. "
                           + fix)
        return
    problem = None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            verdict = con.execute("PRAGMA quick_check").fetchone()[0]
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if verdict != "ok":
            problem = f"damaged (SQLite's integrity check: {verdict[:200]})"
        elif "studies" not in tables:
            problem = "a SQLite database without Optuna's tables (no studies table)"
    except sqlite3.DatabaseError as exc:
        problem = f"not a readable SQLite database ({exc})"
    if problem:
        raise KGCError(f"{path}: the study's storage is {problem}." + (
            f" {Path(folder) / 'trials'} holds {len(trials)} trial folder(s)." if trials else "") + " " + fix)


# --set keys that change no trial's figures (where its metrics also go, what it keeps, how often it logs or saves):
# a study continued with them changed is the same study
NOT_A_TRIALS = ("train.trackers", "train.keep", "train.log_every", "train.checkpoint_every", "train.num_threads",
                "train.check_memory", "train.profile_steps", "tune.trials", "tune.timeout", "name")


def study_identity(recipe: Recipe, space: dict, fixed: dict, metric: str) -> dict[str, Any]:
    """What makes a study's trials comparable — the space, the budget and reports, the pruner, the sampler, the
    metric, the --set values — with a short digest of it (the default study name's suffix)."""
    import hashlib
    import json

    tc = recipe.tune
    identity = {"space": {k: {f: v for f, v in space[k].model_dump().items() if v is not None and v is not False}
                          for k in sorted(space)},
                "budget": tc.budget, "reports": tc.reports, "pruner": tc.pruner, "sampler": tc.sampler,
                "metric": metric, "fixed": {k: fixed[k] for k in sorted(fixed) if not k.startswith(NOT_A_TRIALS)}}
    identity["digest"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return identity


def _identity_text(a: dict, other: dict | None = None) -> str:
    """What ``a`` says (only where it differs from ``other``, when given): 'budget "4 steps", space train.lr
    {...}' — within the space and the --set values, only the keys that differ."""
    keys = [k for k in ("budget", "reports", "pruner", "sampler", "metric", "space", "fixed")
            if other is None or a.get(k) != other.get(k)] or ["space"]
    parts = []
    for k in keys:
        mine, theirs = a.get(k), (other or {}).get(k)
        if other is not None and isinstance(mine, dict) and isinstance(theirs, dict):
            inner = sorted(set(mine) | set(theirs))
            shown = {key: mine.get(key, "(unset)") for key in inner if mine.get(key) != theirs.get(key)}
            parts.append(f"{k} " + ", ".join(f"{key}={value!r}" for key, value in shown.items()))
        else:
            parts.append(f"{k} {mine!r}")
    return ", ".join(parts)


def resolve_metric(task, name: str | None) -> tuple[str, str]:
    """(the dev figure a study optimises, "maximize" or "minimize"): ``name`` as the task's validation reports it
    (``dev_hits_at_10``), without its ``dev_`` prefix (``hits_at_10``) or as PyKEEN writes it (``hits@10``);
    None: the task's metric (the one that picks best.pt)."""
    if name is None:
        return task.metric, task.dev_metrics.get(task.metric, "maximize")
    key = name.strip().lower().replace("@", "_at_")
    key = key if key.startswith("dev_") else f"dev_{key}"
    if key not in task.dev_metrics:
        raise KGCError(f"tune.metric {name!r}: not a dev figure of {task.title}; it reports "
                       + ", ".join(f"{k} ({'higher' if d == 'maximize' else 'lower'} is better)"
                                   for k, d in task.dev_metrics.items()))
    return key, task.dev_metrics[key]


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


def parse_budget(text: str | None, unit: str) -> tuple[str, float] | None:
    """"20000 triples" → ("examples", 20000); "200 steps"; "5 minutes"; None: the recipe's own training."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", text)
    kinds = {unit: "examples", "examples": "examples", "steps": "steps", "minutes": "minutes"}
    if not m or m.group(2) not in kinds or float(m.group(1)) <= 0:
        raise KGCError(f"tune.budget {text!r}: write 'N {unit}', 'N steps' or 'N minutes' (e.g. '20000 {unit}')")
    return kinds[m.group(2)], float(m.group(1))


def budget_overrides(recipe: Recipe, budget: tuple[str, float] | None, reports: int) -> dict[str, Any]:
    """The training keys that make a trial of ``recipe`` (its values already set) spend the budget, validating
    ``reports`` times on the way."""
    # validate_every_epoch: also at the last step (the loop ends its epoch there) and at each epoch's end
    out: dict[str, Any] = {"eval.validate_every_epoch": True}
    if budget is None:
        steps = recipe.train.max_steps
    elif budget[0] == "minutes":
        out.update({"train.max_minutes": budget[1], "train.schedule": "minutes"})
        steps = None
    else:
        steps = int(budget[1]) if budget[0] == "steps" else math.ceil(budget[1] / recipe.train.batch_size)
        out.update({"train.max_steps": max(steps, 1), "train.epochs": max(recipe.train.epochs, 10_000)})
    if steps and reports > 1:  # reports - 1 on the way, the last at the end
        out["eval.validate_every_steps"] = max(1, steps // reports)
    return out


def report_steps(last: int | None, reports: int) -> list[int] | None:
    """The steps a trial of ``last`` steps validates at: ``reports`` − 1 evenly on the way and the last, exactly
    ``reports`` validations (fewer where the budget has fewer steps); None for a budget in minutes (the steps are not
    known: each epoch's end and ``eval.validate_every_steps`` then)."""
    if not last:
        return None
    every = max(1, last // max(1, reports))
    return sorted({min(last, every * i) for i in range(1, max(1, reports))} | {last})


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


class Study:
    """A study folder: the Optuna study in ``study.db`` (or ``storage``), one run per trial under ``trials/``."""

    def __init__(self, recipe_path: Path, folder: Path, *, overrides: list[str] | None = None,
                 storage: str | None = None, echo: Callable[[str], None] = print, trials: int | None = None,
                 study_name: str | None = None, metric: str | None = None, sampler: str | None = None) -> None:
        import optuna

        self.recipe_path, self.folder, self.overrides, self.echo = Path(recipe_path), Path(folder), overrides or [], echo
        self.fixed = parse_overrides(self.overrides)  # --set: typed values, for every trial
        self.recipe = load_recipe(self.recipe_path, self.overrides)
        tc = self.recipe.tune
        if metric is not None:  # --metric / --sampler: the study's, not a value set for every trial
            tc.metric = metric
        if sampler is not None:
            if sampler not in ("tpe", "random", "grid", "cmaes"):
                raise KGCError(f"--sampler {sampler!r}: use tpe, random, grid or cmaes")
            tc.sampler = sampler
        raw = tc.space or {k: ParamRange(**v) for k, v in default_space(self.recipe).items()}
        self.space = raw
        from kgc.training.task import task_class

        self.task = task_class(self.recipe.task)
        self.metric, self.direction = resolve_metric(self.task, tc.metric)
        self.budget = parse_budget(tc.budget, self.task.unit)
        self._check_space()
        asked = self.asked = trials or tc.trials
        make_sampler(tc.sampler, self.space, 0, asked)  # a space this sampler cannot search: said before anything
        self.folder.mkdir(parents=True, exist_ok=True)
        self.storage_given = storage  # None: the study's own study.db
        url = storage or f"sqlite:///{(self.folder / STUDY_DB).resolve()}"
        check_sqlite_storage(url, self.folder)  # empty, cut or damaged: one message, never a study started over
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: stable in use
            self.storage = optuna.storages.RDBStorage(
                url, heartbeat_interval=max(1, tc.stale_after // 4), grace_period=tc.stale_after,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
        pruner = {"median": optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
                  "halving": optuna.pruners.SuccessiveHalvingPruner(),
                  "none": optuna.pruners.NopPruner()}[tc.pruner]
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.identity = study_identity(self.recipe, self.space, self.fixed, self.metric)
        self.name = study_name or self._default_name(url)
        self._check_folder()  # a refused command creates nothing: both checks come before any study is made
        names = {s.study_name for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}
        trials = trial_folders(self.folder)
        if self.name not in names and trials and (self.folder / STUDY_JSON).is_file():
            raise KGCError(f"{url}: the study {self.name!r} that {self.folder / STUDY_JSON} records is not in it, but "
                           f"{self.folder / 'trials'} holds {len(trials)} trial folder(s) ({', '.join(trials[:3])}"
                           f"{', …' if len(trials) > 3 else ''}): the study's record is lost. Restore the storage "
                           "from a copy, or give another --out for a new study (those trials' runs stay as they "
                           "are); nothing was started over.")
        if self.name in names:
            self.study = optuna.load_study(study_name=self.name, storage=self.storage, pruner=pruner)
        else:
            self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction=self.direction,
                                             pruner=pruner, load_if_exists=True)
        self._check_identity()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental in some Optuna versions
            self.study.set_metric_names([self.metric])  # the objective's name in optuna-dashboard (dev_mrr)
        if self.budget is None:
            echo("warning: tune.budget is not set, so every trial trains the recipe's whole budget; set it (e.g. "
                 f"--set 'tune.budget=20000 {self.task.unit}') to compare trials at a fraction of it")
        self.seed = sampler_seed(self.recipe.train.seed, self.study)
        self.study.sampler = make_sampler(tc.sampler, self.space, self.seed, asked)
        self.duplicates = 0  # draws that repeated a trial's values (failed, drawn anew)

    def _default_name(self, url: str) -> str:
        """The recipe's name and a short hash of what makes its trials comparable (space, budget, reports, pruner,
        sampler, metric, the --set values): a study with another budget or space is another study. A study this
        folder made before names were hashed (the recipe's name alone) is continued under that name."""
        import optuna

        hashed = f"{self.recipe.name}-{self.identity['digest']}"
        if not (self.folder / STUDY_JSON).is_file() and (self.folder / STUDY_DB).is_file():
            names = {s.study_name for s in optuna.get_all_study_summaries(url, include_best_trial=False)}
            if self.recipe.name in names and hashed not in names:
                return self.recipe.name
        return hashed

    def _check_folder(self) -> None:
        """Refuse a folder that holds another study (STUDY/study.json names it), before anything is created."""
        import json

        here = self.folder / STUDY_JSON
        if here.is_file():
            with contextlib.suppress(OSError, ValueError):
                folder_record = json.loads(here.read_text(encoding="utf-8"))
                if folder_record.get("name") != self.name:
                    raise KGCError(f"{self.folder} holds the study {folder_record.get('name')!r}; this command asks "
                                   f"for {self.name!r}, which differs in {_identity_text(self.identity, folder_record)}"
                                   f" (that study: {_identity_text(folder_record, self.identity)}). A study compares "
                                   "trials of one space and budget: give another --out for a new study (or "
                                   "--study-name to join that one as it is).")

    def _check_identity(self) -> None:
        """Refuse to join a study whose trials were drawn from another space or budget (the fields that differ,
        both ways); record this study's identity in the study (for other machines on one --storage) and in
        STUDY/study.json (one study per folder: its trials' folders and outputs are the study's)."""
        import json

        recorded = self.study.user_attrs.get("kgc")
        here = self.folder / STUDY_JSON
        if recorded is not None and recorded.get("digest") != self.identity["digest"]:
            raise KGCError(f"the study {self.name!r} was drawn with {_identity_text(recorded, self.identity)}; this "
                           f"command asks for {_identity_text(self.identity, recorded)}. A study compares trials of "
                           "one space and budget: give another --out or --study-name for a new study, or set the "
                           "recipe back to join this one.")
        if recorded is None:
            self.study.set_user_attr("kgc", self.identity)
        write_text(here, json.dumps({"name": self.name, **self.identity}, indent=2, default=str) + "\n")

    def _check_space(self) -> None:
        """Every key of the space must be a key of the recipe (its lowest and highest values both valid)."""
        from difflib import get_close_matches

        from kgc.recipe import valid_keys

        known = valid_keys()
        for key, spec in self.space.items():
            if key not in known:
                near = get_close_matches(key, known, n=1)
                raise KGCError(f"tune.space {key}: not a recipe key{f' (did you mean {near[0]}?)' if near else ''}; "
                               "`kgc recipes keys` lists them")
            for value in (spec.choices if spec.choices is not None else (spec.low, spec.high)):
                try:
                    resolve_recipe(self.recipe_path, {**self.fixed, key: value})
                except KGCError as exc:
                    raise KGCError(f"tune.space {key}={value}: {exc}") from None

    def finished(self) -> int:
        from optuna.trial import TrialState

        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))

    def trial_dir(self, number: int) -> Path:
        return self.folder / "trials" / f"{number:04d}"

    def objective(self, trial) -> float:
        import optuna

        from kgc.training.loop import train

        from optuna.trial import TrialState

        others = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                  if t.number != trial.number] if os.environ.get("KGC_TUNE_WORKER") is not None else []
        if others and self.finished() + len(others) >= self.asked:  # --jobs: the other workers finish what was asked
            trial.set_user_attr("surplus", True)
            trial.study.stop()
            raise Surplus(f"{self.finished()} trials finished and {len(others)} running of the {self.asked} asked")
        values = suggest(trial, self.space)
        same = self.same_values(trial, values)
        if same is not None:  # never a point twice: this draw fails (it trains nothing) and the next is drawn anew
            self.duplicates += 1
            trial.set_user_attr("duplicate_of", same)
            self.echo(f"trial {trial.number}: the values of trial {same} again; drawing anew")
            raise DuplicatePoint(f"the values of trial {same}")
        with_values = resolve_recipe(self.recipe_path, {**self.fixed, **values})
        extra = budget_overrides(with_values, self.budget, self.recipe.tune.reports)
        recipe = resolve_recipe(self.recipe_path, {**self.fixed, **values, **extra})
        recipe.name = f"{self.recipe.name}-trial{trial.number:04d}"
        metric, sign = self.metric, (1 if self.direction == "maximize" else -1)
        out = self.trial_dir(trial.number)
        if out.exists():  # a retried trial (its process was killed): start it again from nothing
            import shutil

            shutil.rmtree(out)
        self.echo(f"trial {trial.number}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
        last = recipe.train.max_steps  # the budget's last step (None: a budget in minutes)
        start = time.perf_counter()
        best: list[float] = []  # the trial's best dev figure so far (in the study's direction)

        def report(step: int, figures: dict) -> None:
            value = float(figures[metric])
            if not math.isnan(value) and (not best or sign * value > sign * best[0]):
                best[:] = [value]
            trial.report(value, step)
            seconds = time.perf_counter() - start
            self.echo(f"trial {trial.number}: step {step}{f'/{last}' if last else ''}, {metric} {value:.4f} "
                      f"({seconds:.0f}s, {step / max(seconds, 1e-9):.2f} steps/s)")
            if (last is None or step < last) and trial.should_prune():  # never at its last report: it is done
                self.echo(f"trial {trial.number}: pruned at step {step} ({metric} {value:.4f}, behind the "
                          f"earlier trials at that step)")
                raise optuna.TrialPruned(f"dev {value:.4f} at step {step}")

        try:
            with self.tracked(trial.number):
                train(recipe, out=out, progress=False, echo=lambda m: None, on_validation=report,
                      validate_at=report_steps(last, self.recipe.tune.reports))
        except KGCError as exc:  # a full disk, a bad value: the study stops with this one message
            self.stopped = exc
            self.tag_trial(out, "failed")
            raise KGCError(f"trial {trial.number} ({out}): {exc}") from None
        except optuna.TrialPruned:
            self.tag_trial(out, "pruned")
            raise
        self.tag_trial(out, "complete", best[0] if best else None)
        if not best:
            raise KGCError(f"{out}: the trial validated nothing, so it has no {metric}; give tune.budget room for "
                           "at least one validation")
        trial.set_user_attr("run", str(out))
        self.echo(f"trial {trial.number}: complete, best {metric} {best[0]:.4f} "
                  f"({time.perf_counter() - start:.0f}s)")
        return best[0]

    def progress(self, study, trial=None) -> None:
        """The study's progress bar, at its start and after each finished trial (an Optuna callback), with the
        time left from the finished trials' mean duration: ``study [######------] 2/5 trials, about 3 min left``."""
        from optuna.trial import TrialState

        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))]
        if (trial is not None and trial.state not in (TrialState.COMPLETE, TrialState.PRUNED)) or not self.asked:
            return
        self.echo(progress_line(done, self.asked, self.jobs))

    jobs = 1  # worker processes on the study here (the time left is divided among them)

    stopped: KGCError | None = None  # what ended the study: said once, by the caller (not by Optuna's log too)

    # ------------------------------------------------------------------ MLflow: one parent run, a child per trial

    def mlflow_parent(self) -> "tuple[str, str] | None":
        """(store URI, parent run id) of the study's MLflow run when the recipe tracks with MLflow: in the study's
        experiment (named as the study), in ``$MLFLOW_TRACKING_URI`` or ``STUDY/mlflow/mlflow.db``, made once
        (``STUDY/mlflow/parent_run_id``) and tagged with the study's identity."""
        if "mlflow" not in self.recipe.train.trackers:
            return None
        if getattr(self, "_parent", None) is None:
            from mlflow.tracking import MlflowClient

            folder = self.folder / "mlflow"
            folder.mkdir(parents=True, exist_ok=True)
            uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
            client = MlflowClient(uri)
            id_file = folder / "parent_run_id"
            run_id = id_file.read_text().strip() if id_file.is_file() else ""
            if not run_id:
                from kgc.training.trackers import mlflow_experiment

                run_id = client.create_run(mlflow_experiment(client, self.name, folder / "artifacts"), run_name=f"study {self.name}", tags={
                    "kgc.study": self.name, "kgc.budget": str(self.identity["budget"]),
                    "kgc.metric": self.metric}).info.run_id
                write_text(id_file, run_id + "\n")
            self._parent = (uri, run_id)
        return self._parent

    @contextlib.contextmanager
    def tracked(self, number: int):
        """Trial ``number``'s MLflow run (if the recipe tracks with MLflow) as a child of the study's run."""
        parent = self.mlflow_parent()
        if parent is None:
            yield
            return
        from kgc.training.trackers import study_trial

        with study_trial(self.name, parent[1], parent[0], {"kgc.study": self.name, "kgc.trial": str(number)}):
            yield

    def tag_trial(self, run: Path, state: str, objective: float | None = None) -> None:
        """The trial's outcome (complete, pruned, failed) as a tag of its MLflow run, and for a complete trial its
        objective — the value Optuna records (the best of its reports), not its last validation — as the metric
        ``objective`` and the tag ``kgc.objective``."""
        parent = self.mlflow_parent()
        id_file = run / "mlflow" / "run_id"
        if parent is None or not id_file.is_file():
            return
        from mlflow.tracking import MlflowClient

        with contextlib.suppress(Exception):  # a tag is not worth a trial
            client, child = MlflowClient(parent[0]), id_file.read_text().split()[0]
            client.set_tag(child, "kgc.state", state)
            if objective is not None:
                client.log_metric(child, "objective", float(objective))
                client.set_tag(child, "kgc.objective", f"{self.metric} {objective:.6g}")

    def finish_mlflow(self, summary: dict) -> None:
        """The study's MLflow run when a command on the study ends: what makes its trials comparable as params (the
        space, budget, reports, pruner, sampler, metric: logged once, as MLflow params are), the best value and
        trial and the counts as metrics and tags, and the run FINISHED (a continued study reopens and ends it
        again)."""
        parent = self.mlflow_parent()
        if parent is None:
            return
        import json

        from mlflow.tracking import MlflowClient

        client, run_id = MlflowClient(parent[0]), parent[1]
        identity = self.identity
        params = {"space": json.dumps(identity["space"], sort_keys=True, default=str), "budget": identity["budget"],
                  "reports": identity["reports"], "pruner": identity["pruner"], "sampler": identity["sampler"],
                  "metric": self.metric, "direction": self.direction,
                  "fixed": json.dumps(identity["fixed"], sort_keys=True, default=str)}
        have = client.get_run(run_id).data.params
        for key, value in params.items():
            if key not in have:
                client.log_param(run_id, key, str(value))
        for key in ("complete", "pruned", "failed"):
            client.log_metric(run_id, f"{key}_trials", summary[key])
        if summary["best"] is not None:
            client.log_metric(run_id, f"best_{self.metric}", float(summary["best"]["value"]))
            client.set_tag(run_id, "kgc.best_trial", str(summary["best"]["trial"]))
        client.set_terminated(run_id, "FINISHED")

    def same_values(self, trial, values: dict) -> int | None:
        """The number of another trial of the study — finished, or running now in another process — that has
        exactly ``values``; None when none has. A killed trial's retry has its values by design: it is compared
        with the others, not with the trial it retries."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        me = next((t for t in trials if t.number == trial.number), None)
        retried = me.system_attrs.get("failed_trial") if me is not None else None
        for other in trials:
            if other.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING) and \
                    other.number not in (trial.number, retried) and other.params == values:
                return other.number
        return None

    def optimize(self, trials: int, timeout: float | None) -> None:
        import logging

        import optuna  # noqa: F401 — its "optuna" logger has its handler once it is imported

        quiet = _QuietFailures(self)  # on Optuna's handlers: its records come from child loggers
        handlers = logging.getLogger("optuna").handlers
        for h in handlers:
            h.addFilter(quiet)
        hook, thread_errors = threading.excepthook, []

        def storage_failures(args) -> None:  # Optuna's heartbeat thread on a full disk: said once, by the study
            if storage_error(args.exc_value, self.folder, self.storage_given) is None:
                return hook(args)
            thread_errors.append(args.exc_value)

        threading.excepthook = storage_failures
        try:
            self._optimize(trials, timeout)
        finally:
            threading.excepthook = hook
            for h in handlers:
                h.removeFilter(quiet)
        if thread_errors:  # the trials ended, but the study's heartbeats could not be written
            raise storage_error(thread_errors[0], self.folder, self.storage_given)

    def _optimize(self, trials: int, timeout: float | None) -> None:
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # trials of a killed process: failed (and retried once)
        left = trials - self.finished()
        if left <= 0:
            return
        self.progress(self.study)
        self.study.optimize(self.objective, n_trials=left + _retries(self.study) + MAX_REDRAWS, timeout=timeout,
                            catch=(DuplicatePoint,), callbacks=[optuna.study.MaxTrialsCallback(
                                trials, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)),
                                self.progress])
        grid = self.study.sampler
        if self.finished() < trials and timeout is None and isinstance(grid, optuna.samplers.GridSampler):
            self.echo(f"the grid has {math.prod(len(v) for v in grid_points(self.space).values())} points and "
                      f"the study has tried them all ({self.finished()} finished of the {trials} asked)")
        elif self.finished() < trials and self.duplicates and timeout is None:
            self.echo(f"the search space gave {self.finished()} distinct points of the {trials} trials asked: "
                      f"{self.duplicates} draws repeated a trial's values (a space of few choices is exhausted; "
                      "widen it or ask fewer trials)")

    # ------------------------------------------------------------------ what a study leaves

    def write_outputs(self) -> dict:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        rows = []
        trials = [t for t in trials if "surplus" not in t.user_attrs]  # asked past the number wanted: never run
        for t in trials:
            run = self.trial_dir(t.number)
            took = (t.datetime_complete - t.datetime_start).total_seconds() \
                if t.datetime_complete and t.datetime_start else None
            rows.append({"trial": t.number, "state": t.state.name.lower(),
                         "value": None if t.value is None else round(t.value, 4),
                         "steps": max(t.intermediate_values, default=None),
                         "start": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
                         "seconds": None if took is None else round(took, 1),
                         # a trial a killed process left, run again (Optuna's failed_trial): the number it retries
                         "retries": t.system_attrs.get("failed_trial"),
                         **{k: t.params.get(k) for k in self.space}, "run": str(run)})
        sign = 1 if self.direction == "maximize" else -1
        rows.sort(key=lambda r: (r["value"] is None, -sign * (r["value"] or 0), r["trial"]))  # best first
        _write_csv(self.folder / "trials.csv", rows)
        write_text(self.folder / "trials.md", _markdown(rows, self.metric))
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        out = {"study": str(self.folder), "trials": len(trials), "complete": len(complete),
               "pruned": sum(t.state == TrialState.PRUNED for t in trials),
               "failed": sum(t.state == TrialState.FAIL and "duplicate_of" not in t.user_attrs for t in trials),
               "redrawn": sum("duplicate_of" in t.user_attrs for t in trials), "best": None, "plots": []}
        if complete:
            best = self.study.best_trial
            path = self.folder / "best.yaml"
            write_text(path, self.best_recipe_text(best.params, best.value, best.number))
            out["best"] = {"trial": best.number, "value": best.value, "params": best.params, "recipe": str(path)}
        out["plots"] = self.plots(len(complete))
        self.finish_mlflow(out)
        return out

    def best_recipe_text(self, params: dict, value: float, number: int) -> str:
        """The study's recipe with the best trial's values set (the trials' budget left out): a file for kgc
        train, the recipe resolved in full."""
        recipe = resolve_recipe(self.recipe_path, {**self.fixed, **params})
        tree = yaml.safe_load(recipe.to_yaml())
        tree.pop("tune", None)
        head = (f"# kgc tune {self.recipe_path} → trial {number} of {self.folder}: best "
                f"{self.metric} {value:.4f} at {_budget_text(self.budget, self.task.unit)}\n"
                f"# {', '.join(f'{k}={_fmt(v)}' for k, v in params.items())}\n")
        return head + yaml.safe_dump(tree, sort_keys=False)

    def plots(self, complete: int) -> list[str]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import optuna.visualization.matplotlib as ovm

        drawn = []
        kinds = [("history.png", ovm.plot_optimization_history, 1), ("slice.png", ovm.plot_slice, 1)]
        if len(self.space) > 1:
            kinds.append(("importance.png", ovm.plot_param_importances, 2))
        for name, draw, least in kinds:
            if complete < least:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                ax = draw(self.study, target_name=self.metric)  # the axis names the metric (not "Objective Value")
            import numpy as np

            fig = np.ravel(ax)[0].get_figure()  # one axes, or an array of them (slice: one per parameter)
            fig.set_size_inches(max(6.0, 3.2 * len(self.space)) if name == "slice.png" else 7.0, 4.0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the slice plot's colour bar is not a tight_layout axes: harmless
                fig.tight_layout()
            write_with(self.folder / name, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
            plt.close(fig)
            drawn.append(name)
        return drawn


MAX_REDRAWS = 20  # draws a call may spend on values a trial had already, beyond the trials asked
BAR = 20  # characters of the study's progress bar


def progress_line(done: list, asked: int, jobs: int = 1) -> str:
    """``study [########------------] 2/5 trials, about 3 min left``: ``done`` the finished trials (their mean
    duration times the trials left, over ``jobs`` workers, is the time left)."""
    n = min(len(done), asked)
    filled = round(BAR * n / asked) if asked else BAR
    left = max(0, asked - len(done))
    spans = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done
             if t.datetime_complete and t.datetime_start]
    seconds = sum(spans) / len(spans) * math.ceil(left / max(1, jobs)) if spans else 0
    eta = "" if not left or not spans else (f", about {seconds / 60:.0f} min left" if seconds >= 90 else
                                              f", about {seconds:.0f} s left")
    return f"study [{'#' * filled}{'-' * (BAR - filled)}] {n}/{asked} trials{eta}"


class DuplicatePoint(Exception):
    """A draw that repeated another trial's values: that trial fails without training (Optuna records it), and
    the sampler draws again."""


class Surplus(DuplicatePoint):
    """A trial a ``--jobs`` worker asked for when the trials finished and those running in the other workers already
    make the number asked (Optuna's MaxTrialsCallback counts only at a trial's end, so ``--trials 2 --jobs 2`` ran
    3): it trains nothing, stops its worker, and is left out of the study's outputs. A process on its own (no
    ``--jobs``) never counts running trials: one left RUNNING by a process that died is not a worker."""


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


class _QuietFailures:
    """A logging filter on Optuna: its "Trial N failed …" records (with a traceback) are dropped once a trial
    stopped the study with a KGCError, which the caller says once."""

    def __init__(self, study: Study) -> None:
        self.study = study

    def filter(self, record) -> bool:
        text = record.getMessage()
        if "DuplicatePoint" in text or "Surplus" in text or (record.exc_info and isinstance(record.exc_info[1],
                                                                                           DuplicatePoint)):
            return False  # said by the study's own line
        return self.study.stopped is None or "failed" not in text


def _die_with_parent() -> None:
    """In a worker, before it runs: SIGTERM when the parent dies, however it dies (Linux's PR_SET_PDEATHSIG; a
    SIGKILLed ``kgc tune --jobs`` leaves no worker training on)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


@contextlib.contextmanager
def _workers(argv: list[str], jobs: int):
    """``jobs`` worker processes of ``argv`` — each its own sampler seed, dying with this process — and a list that
    names the signal (SIGTERM, SIGINT) that stopped this process, forwarded to every worker, while they run."""
    stopped: list[str] = []
    procs = [subprocess.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                                         "KGC_TUNE_WORKER": str(i)}, preexec_fn=_die_with_parent)
             for i in range(jobs)]

    def forward(signum, _frame) -> None:
        stopped.append(signal.Signals(signum).name)
        for p in procs:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)

    before = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield procs, stopped
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for p in procs:  # an exception here (or a second signal): none outlives this process
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)


def _retries(study) -> int:
    """Trials of a killed process waiting to be tried again (RetryFailedTrialCallback enqueues them)."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _budget_text(budget: tuple[str, float] | None, unit: str) -> str:
    """The budget as the recipe wrote it: "5248 triples a trial" (examples in the task's unit)."""
    if budget is None:
        return "the recipe's own training"
    return f"{budget[1]:g} {unit if budget[0] == 'examples' else budget[0]} a trial"


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
        lines.append("| " + " | ".join("" if r[k] is None else _fmt(r[k]) for k in keys) + " |")
    return "\n".join(lines) + "\n"


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


# what SQLite says when it cannot write the study (a full disk, `ulimit -f`, a read-only folder)
_SQLITE_WRITE = ("disk I/O error", "database or disk is full", "unable to open database file",
                 "attempt to write a readonly database")


def storage_error(exc: BaseException, folder: Path, storage: str | None) -> KGCError | None:
    """One KGCError for a study database that cannot be written (anywhere in ``exc``'s chain: Optuna wraps
    SQLAlchemy, which wraps sqlite3), naming the database and the fix; None for any other error."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        reason = next((w for w in _SQLITE_WRITE if w in str(e)), None)
        if reason is not None:
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    where = storage or str(folder / STUDY_DB)
    db = Path(where[len("sqlite:///"):]) if where.startswith("sqlite:///") else Path(where)
    disk = db.parent if where.startswith("sqlite:///") or not storage else folder  # the disk SQLite writes to
    if "readonly" in reason or "unable to open" in reason:
        fix = f"make {disk} writable (or pick another --out)"
    else:
        from kgc.fileio import _fsize_limit, free_bytes, human_bytes

        free, limit = free_bytes(disk), _fsize_limit()
        fix = (f"free space on the disk that holds {disk} ({human_bytes(free) if free is not None else '?'} free"
               f"{f'; this process may write files of at most {human_bytes(limit)}: `ulimit -f`' if limit else ''})")
    return KGCError(f"{where}: the study cannot be written ({reason}). It keeps every trial it recorded before "
                    f"(SQLite undid the write that failed). {fix[0].upper() + fix[1:]}, then run the same command "
                    "again to continue the study.")


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
             + ", ".join(f"{k}={_fmt(v)}" for k, v in b["params"].items()))
        echo(f"wrote {b['recipe']}: kgc train {b['recipe']}")
    redrawn = f", {summary['redrawn']} draws redrawn" if summary["redrawn"] else ""
    echo(f"{summary['complete']} complete, {summary['pruned']} pruned, {summary['failed']} failed{redrawn}; "
         f"{folder / 'trials.md'}, plots: {', '.join(summary['plots']) or 'none'}")
    return summary
