"""A study folder and its Optuna study (:class:`Study`): the recipe and space checked, the storage opened, the
identity checked against the folder's and the storage's, the sampler seeded, and the trials run until the number
asked are finished."""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from pathlib import Path
from typing import Callable

from kgc.errors import KGCError
from kgc.recipe import ParamRange, load_recipe, parse_overrides, resolve_recipe
from kgc.tune.budget import parse_budget
from kgc.tune.identity import _identity_text, resolve_metric, study_identity
from kgc.tune.objective import DuplicatePoint, run_trial
from kgc.tune.outputs import write_outputs
from kgc.tune.space import default_space, grid_points, make_sampler, sampler_seed
from kgc.tune.storage import STUDY_DB, STUDY_JSON, check_sqlite_storage, storage_error, trial_folders
from kgc.fileio import write_text


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
        from kgc.training.trackers import study_trackings

        # the trackers that keep the study as one record (MLflow: a parent run, a child per trial), asked of the
        # tracker family; made on a trial's first use
        self.trackings = study_trackings(self.recipe.train.trackers, folder=self.folder, name=self.name,
                                         identity=self.identity, metric=self.metric, direction=self.direction)

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

    def objective(self, trial) -> float:
        """One trial (:func:`kgc.tune.objective.run_trial`)."""
        return run_trial(self, trial)

    @contextlib.contextmanager
    def tracked(self, number: int):
        """While trial ``number`` trains: each tracker's record of it as one of the study's (MLflow: a child run)."""
        with contextlib.ExitStack() as stack:
            for tracking in self.trackings:
                stack.enter_context(tracking.trial(number))
            yield

    def tag_trial(self, run: Path, state: str, objective: float | None = None) -> None:
        """The trial's outcome (complete, pruned, failed; a complete one's objective) in each tracker's record."""
        for tracking in self.trackings:
            tracking.ended(run, state, objective)

    def write_outputs(self) -> dict:
        """trials.csv, trials.md, best.yaml and the plots (:func:`kgc.tune.outputs.write_outputs`), then each
        tracker's record of the study finished with the summary."""
        summary = write_outputs(self)
        for tracking in self.trackings:
            tracking.finish(summary)
        return summary


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


def _retries(study) -> int:
    """Trials of a killed process waiting to be tried again (RetryFailedTrialCallback enqueues them)."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
