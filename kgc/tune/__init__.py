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

The package, one concern a file: :mod:`~kgc.tune.space` (the search space and its samplers),
:mod:`~kgc.tune.budget` (a trial's budget and reports), :mod:`~kgc.tune.identity` (what makes a study's trials
comparable, the metric), :mod:`~kgc.tune.storage` (the study's database, checked and its write errors said),
:mod:`~kgc.tune.study` (:class:`Study`: a study folder and Optuna's study), :mod:`~kgc.tune.objective` (one trial),
:mod:`~kgc.tune.outputs` (best.yaml, trials.csv/md, the plots), :mod:`~kgc.tune.workers` (``--jobs``' processes)
and :mod:`~kgc.tune.command` (``kgc tune`` itself). Trackers that keep a study as one record (MLflow's parent run)
do it through the tracker family (:meth:`kgc.training.trackers.Tracker.for_study`).
"""

from __future__ import annotations

from kgc.tune.budget import budget_overrides, parse_budget, report_steps
from kgc.tune.command import tune
from kgc.tune.identity import resolve_metric, study_identity
from kgc.tune.space import default_space, grid_points, make_sampler, sampler_seed, suggest
from kgc.tune.storage import STUDY_DB, STUDY_JSON, check_sqlite_storage, storage_error, trial_folders
from kgc.tune.study import Study

__all__ = ["STUDY_DB", "STUDY_JSON", "Study", "budget_overrides", "check_sqlite_storage", "default_space",
           "grid_points", "make_sampler", "parse_budget", "report_steps", "resolve_metric", "sampler_seed",
           "storage_error", "study_identity", "suggest", "trial_folders", "tune"]
