"""kgc tune: trials of one budget on UMLS with a tiny BERT, the study in SQLite, best.yaml / trials table / plots;
a killed study continues where it stopped; a trial whose dev curve falls below the median is pruned; a bad space
is one message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kgc.errors import KGCError
from tests.conftest import ROOT, SHARED_DATA


def write_tune_recipe(path: Path, backbone: Path, space: dict | None = None, **tune) -> Path:
    t = {"budget": "6 steps", "reports": 2, "trials": 4, **tune}
    if space is not None:
        t["space"] = space
    path.write_text(
        f"name: {path.stem}\n"
        "data: {dataset: umls, neighbor_text: false, max_tokens: 16}\n"
        f"model: {json.dumps({'backbone': str(backbone), 'conditioner': 'biencoder'})}\n"
        "loss: {pre_batch: 0}\n"
        'train: {batch_size: 32, lr: 1.0e-3, warmup_steps: 1, log_every: 2, num_threads: 1}\n'
        "eval: {batch_size: 128, dev_queries: 60}\n"
        f"tune: {json.dumps(t)}\n")
    return path


def test_a_study_of_eight_trials_writes_the_best_recipe_the_table_and_the_plots(tiny_bert, tmp_path, data_home,
                                                                                   monkeypatch):
    import optuna

    from kgc.recipe import load_recipe
    from kgc.tune import tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_tune.yaml", tiny_bert,
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True},
                                      "loss.margin": {"choices": [0.0, 0.02]}}, pruner="none")
    summary = tune(recipe, out=tmp_path / "study", trials=8, echo=lambda m: None)
    assert summary["complete"] == 8 and summary["failed"] == 0
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    values = [t.value for t in study.trials]
    assert summary["best"]["value"] == max(values) == study.best_value
    for t in study.trials:  # each trial: its own run, trained 6 steps, validated at steps 3 and 6
        run = tmp_path / "study" / "trials" / f"{t.number:04d}"
        saved = load_recipe(run / "recipe.yaml", saved=True)
        assert saved.train.lr == pytest.approx(t.params["train.lr"]) and saved.loss.margin == t.params["loss.margin"]
        assert json.loads((run / "train_summary.json").read_text())["steps"] == 6
        assert sorted(t.intermediate_values) == [3, 6] and t.value == pytest.approx(max(t.intermediate_values.values()))
    best = load_recipe(tmp_path / "study" / "best.yaml")
    assert best.train.lr == pytest.approx(study.best_params["train.lr"]) and best.train.max_steps is None
    table = (tmp_path / "study" / "trials.md").read_text().splitlines()
    assert len(table) == 2 + 8 and table[2].startswith(f"| {study.best_trial.number} | complete |")
    for name in ("history.png", "slice.png", "importance.png"):
        assert (tmp_path / "study" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_killed_study_continues_the_same_study(tiny_bert, tmp_path, data_home, monkeypatch):
    """SIGKILL to a `kgc tune` process while trial 1 trains; the same study run again (here in this process, as
    the command's `kgc.tune` call) ends with 3 finished trials (the killed one failed and its values tried again),
    trial 0 not trained again."""
    import optuna

    from kgc.tune import tune

    recipe = write_tune_recipe(tmp_path / "umls_resume.yaml", tiny_bert,
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}}, budget="16 steps",
                               pruner="none", stale_after=4)
    env = {**os.environ, "KGC_DATA_HOME": str(SHARED_DATA), "KGC_CACHE_HOME": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "kgc", "tune", str(recipe), "--out", str(tmp_path / "study"), "--trials", "3"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "study" / "trials" / "0000" / "train_summary.json"
    deadline = time.time() + 300
    while time.time() < deadline and not (tmp_path / "study" / "trials" / "0001" / "metrics.jsonl").is_file():
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.is_file(), "trial 0 did not finish before the kill"
    stamp = first.stat().st_mtime_ns
    time.sleep(5)  # past tune.stale_after (4 s here, 20 by default): the killed trial's heartbeat is stale
    for key in ("KGC_DATA_HOME", "KGC_CACHE_HOME"):  # the folders the killed process used
        monkeypatch.setenv(key, env[key])
    summary = tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None)
    assert summary["complete"] == 3 and summary["failed"] == 1
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 3 and states[1] == "FAIL", states
    assert first.stat().st_mtime_ns == stamp  # trial 0 kept, not redone
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert retried and retried[0].params == study.trials[1].params


def test_two_worker_processes_share_one_study(tiny_bert, tmp_path, data_home, monkeypatch):
    """`--jobs 2`: two `kgc tune --worker` processes on the one SQLite study, trials run side by side (their
    intervals overlap), each in its own trial folder; the study stops at exactly 3 finished trials (a worker that
    would start a trial when the finished and running ones make 3 stops instead: `--trials 2 --jobs 2` ran 3)."""
    import optuna

    from kgc.tune import tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("KGC_DATA_HOME", str(data_home))
    recipe = write_tune_recipe(tmp_path / "umls_jobs.yaml", tiny_bert, budget="4 steps", pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    summary = tune(recipe, out=tmp_path / "study", trials=3, jobs=2, echo=lambda m: None)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and summary["complete"] == 3 and summary["trials"] == 3 and summary["failed"] == 0
    assert all("surplus" in t.user_attrs for t in study.trials if t.state.name != "COMPLETE")
    spans = sorted((t.datetime_start, t.datetime_complete) for t in done)
    assert any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans  # side by side
    folders = sorted(p.name for p in (tmp_path / "study" / "trials").iterdir())
    assert folders == [f"{t.number:04d}" for t in sorted(done, key=lambda t: t.number)]
    assert all((tmp_path / "study" / "trials" / f / "train_summary.json").is_file() for f in folders)
    params = [t.params["train.lr"] for t in done]
    assert len(set(params)) == len(params), params  # the two workers drew apart (they drew alike before)


def test_a_trial_below_the_median_is_pruned(tiny_bert, tmp_path, data_home, monkeypatch):
    """Two trials at a working lr, then one at lr 1e-9 (its model barely moves): its first dev figure is below the
    median of the first two at that step, and the median pruner stops it there."""
    import optuna

    from kgc.tune import Study

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_prune.yaml", tiny_bert, budget="12 steps", reports=3,
                               space={"train.lr": {"low": 1e-9, "high": 3e-3, "log": True}})
    study = Study(recipe, tmp_path / "study", echo=lambda m: None)
    for lr in (2e-3, 3e-3, 1e-9):
        study.study.enqueue_trial({"train.lr": lr})
    study.optimize(3, None)
    trials = study.study.trials
    assert [t.state for t in trials[:2]] == [optuna.trial.TrialState.COMPLETE] * 2
    assert trials[2].state == optuna.trial.TrialState.PRUNED and sorted(trials[2].intermediate_values) == [4]
    median = sorted(t.intermediate_values[4] for t in trials[:2])
    assert trials[2].intermediate_values[4] < sum(median) / 2
    assert not (tmp_path / "study" / "trials" / "0002" / "train_summary.json").exists()  # stopped mid-training


def test_a_space_key_the_recipe_lacks_is_one_message(tiny_bert, tmp_path):
    from kgc.tune import Study

    recipe = write_tune_recipe(tmp_path / "bad.yaml", tiny_bert, space={"train.lrr": {"low": 1e-5, "high": 1e-3}})
    with pytest.raises(KGCError, match=r"tune.space train.lrr: not a recipe key \(did you mean train.lr\?\)"):
        Study(recipe, tmp_path / "study", echo=lambda m: None)
    with pytest.raises(KGCError, match="budget"):
        Study(write_tune_recipe(tmp_path / "b2.yaml", tiny_bert, budget="6 parsecs"), tmp_path / "s2", echo=print)
    reversed_range = write_tune_recipe(tmp_path / "b3.yaml", tiny_bert, space={"train.lr": {"low": 1e-3, "high": 1e-5}})
    with pytest.raises(KGCError, match="low < high"):
        Study(reversed_range, tmp_path / "s3", echo=print)
    negative = write_tune_recipe(tmp_path / "b4.yaml", tiny_bert, space={"train.lr": {"low": -1.0, "high": 1e-3}})
    with pytest.raises(KGCError, match="train.lr=-1.0"):
        Study(negative, tmp_path / "s4", echo=print)


def test_budgets_in_the_tasks_unit_steps_and_minutes():
    from kgc.recipe import resolve_recipe
    from kgc.tune import budget_overrides, parse_budget

    recipe = resolve_recipe({"data": {"dataset": "umls"}, "train": {"batch_size": 64}})
    assert parse_budget("20000 triples", "triples") == ("examples", 20000.0)
    assert budget_overrides(recipe, ("examples", 20000.0), 4)["train.max_steps"] == 313  # ceil(20000 / 64)
    assert budget_overrides(recipe, ("steps", 100.0), 4)["eval.validate_every_steps"] == 25
    minutes = budget_overrides(recipe, ("minutes", 5.0), 4)
    assert minutes["train.max_minutes"] == 5.0 and "eval.validate_every_steps" not in minutes
    with pytest.raises(KGCError):
        parse_budget("100 pairs", "triples")


def test_an_empty_space_is_the_tasks_and_the_conditioners():
    from kgc.recipe import resolve_recipe
    from kgc.tune import default_space

    plain = default_space(resolve_recipe({"data": {"dataset": "umls"}, "model": {"conditioner": "biencoder"}}))
    assert set(plain) == {"train.lr", "loss.temperature", "loss.margin"}
    hyper = default_space(resolve_recipe({"data": {"dataset": "umls"}, "model": {"conditioner": "hypernet"}}))
    assert set(hyper) == set(plain) | {"train.conditioner_lr"}
    # C-STS: the lr and the contrastive τ, which a recipe without the contrastive term (CASE's MSE) does not search
    csts = {"task": "csts", "data": {"dataset": "synth-csts"}}
    assert set(default_space(resolve_recipe({**csts, "model": {"conditioner": "biencoder"}}))) == \
        {"train.lr", "loss.contrastive_temperature"}
    mse = resolve_recipe({**csts, "model": {"conditioner": "case"}, "loss": {"contrastive": False}})
    assert set(default_space(mse)) == {"train.lr", "train.conditioner_lr"}


def _limited(nbytes: int):
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


@pytest.mark.parametrize("limit_kib,names", [(60, "study.db: the study cannot be written (disk I/O error)"),
                                             (400, "trial 0 (")])
def test_a_full_disk_under_a_study_is_one_message(tiny_bert, tmp_path, data_home, limit_kib, names):
    """A file-size limit (`ulimit -f`, a full disk for SQLite and for torch/safetensors/tokenizers alike) under
    `kgc tune`: at 60 KiB SQLite cannot create the study, at 400 KiB the first trial cannot save its backbone —
    each one message naming the file and the fix, exit 2, no traceback (there were seven)."""
    recipe = write_tune_recipe(tmp_path / "umls_full.yaml", tiny_bert, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    env = {**os.environ, "KGC_DATA_HOME": str(SHARED_DATA), "KGC_CACHE_HOME": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "kgc", "tune", str(recipe), "--out", str(tmp_path / "study"),
                           "--trials", "2"], cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=_limited(limit_kib << 10))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert len(errors) == 1 and names in errors[0] and "ulimit -f" in errors[0], proc.stderr[-3000:]


def test_a_study_database_that_fails_mid_study_is_one_message_and_keeps_its_trials(tiny_bert, tmp_path, data_home,
                                                                                    monkeypatch):
    """SQLite refusing a write after the first trial (what a full disk makes it say, as SQLAlchemy and Optuna pass
    it on): one KGCError naming study.db, the trial recorded before kept; the same command then continues."""
    import optuna
    import sqlalchemy.exc

    from kgc.tune import tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_mid.yaml", tiny_bert, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    real = optuna.storages.RDBStorage.set_trial_state_values
    calls = []

    def full(self, trial_id, state, values=None):
        calls.append(state)
        if len(calls) >= 3:  # the third trial's result is refused
            raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("database or disk is full"))
        return real(self, trial_id, state, values)

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", full)
    with pytest.raises(KGCError, match=r"study\.db: the study cannot be written \(database or disk is full\)\. "
                                       r"It keeps every trial"):
        tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None)
    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", real)
    summary = tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None)
    assert summary["complete"] == 3


def test_a_continued_study_never_draws_a_point_again(tiny_bert, tmp_path, data_home, monkeypatch):
    """`--trials 3` then `--trials 5` on the same study: the continuation draws new points (each process used to
    restart TPE's seeded random start: trials 3 and 4 repeated trials 0 and 1); a categorical space of two values
    asked for three trials says it is exhausted instead of training a point twice."""
    import optuna

    from kgc.tune import tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_more.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None)
    tune(recipe, out=tmp_path / "study", trials=5, echo=lambda m: None)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    lrs = [t.params["train.lr"] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(lrs) == 5 and len(set(lrs)) == 5, lrs

    lines: list[str] = []
    two = write_tune_recipe(tmp_path / "umls_two.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                            space={"loss.margin": {"choices": [0.0, 0.02]}})
    summary = tune(two, out=tmp_path / "two", trials=3, echo=lines.append)
    assert summary["complete"] == 2 and summary["redrawn"] >= 1 and summary["failed"] == 0
    assert any("the search space gave 2 distinct points of the 3 trials asked" in line for line in lines), lines
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'two' / 'study.db'}")
    margins = [t.params["loss.margin"] for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(margins) == [0.0, 0.02]


def test_each_process_on_a_study_seeds_its_own_sampler(tmp_path, monkeypatch):
    """The sampler's seed: the recipe's for a new study in one process (reproducible), moved on by the trials a
    continued study holds, and apart for each worker (--jobs) or process beside others (one --storage)."""
    import optuna

    from kgc.tune import sampler_seed

    monkeypatch.delenv("KGC_TUNE_WORKER", raising=False)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    assert sampler_seed(7, study) == 7
    study.add_trial(optuna.create_trial(params={"x": 1.0}, distributions={
        "x": optuna.distributions.FloatDistribution(0, 2)}, value=0.5))
    assert sampler_seed(7, study) == 7 + 1_000_003
    seeds = set()
    for worker in ("0", "1"):
        monkeypatch.setenv("KGC_TUNE_WORKER", worker)
        seeds.add(sampler_seed(7, study))
    assert len(seeds) == 2 and 7 + 1_000_003 not in seeds


def test_a_study_with_another_budget_or_space_is_another_study(tiny_bert, tmp_path, data_home, monkeypatch):
    """The study is named by the recipe and a hash of its space, budget, pruner and --set values (study.json
    records them): continuing it into the same folder with another budget is refused naming both budgets, as is
    joining a named study drawn with another space; the same settings continue it."""
    from kgc.tune import STUDY_JSON, tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    space = {"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}}
    recipe = write_tune_recipe(tmp_path / "umls_same.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                               space=space)
    tune(recipe, out=tmp_path / "study", trials=1, echo=lambda m: None)
    record = json.loads((tmp_path / "study" / STUDY_JSON).read_text())
    assert record["name"] == f"umls_same-{record['digest']}" and record["budget"] == "2 steps"
    longer = write_tune_recipe(tmp_path / "umls_same.yaml", tiny_bert, budget="4 steps", reports=1, pruner="none",
                               space=space)
    with pytest.raises(KGCError, match=r"holds the study 'umls_same-\w+'; this command asks for 'umls_same-\w+', "
                                       r"which differs in budget '4 steps' \(that study: budget '2 steps'\)") as refused:
        tune(longer, out=tmp_path / "study", trials=2, echo=lambda m: None)
    assert "space {" not in str(refused.value) and len(str(refused.value)) < 500  # the field that differs, only
    import optuna

    url = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    assert [s.study_name for s in optuna.get_all_study_summaries(url, include_best_trial=False)] == [record["name"]]
    optuna.load_study(study_name=None, storage=url)  # one study: the refused command created nothing
    with pytest.raises(KGCError, match=r"the study 'umls_same-\w+' was drawn with budget '2 steps'; this command "
                                       r"asks for budget '4 steps'"):
        tune(longer, out=tmp_path / "elsewhere", trials=2, echo=lambda m: None, study_name=record["name"],
             storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    write_tune_recipe(tmp_path / "umls_same.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none", space=space)
    assert tune(recipe, out=tmp_path / "study", trials=2, echo=lambda m: None)["complete"] == 2
    # tracking added, and how often it logs: the same study, continued (these change no trial's figures)
    summary = tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None,
                   overrides=["train.trackers=[csv]", "train.log_every=1"])
    assert summary["complete"] == 3 and (tmp_path / "study" / "trials" / "0002" / "metrics.csv").is_file()
    assert len(optuna.get_all_study_summaries(url, include_best_trial=False)) == 1


def test_a_study_says_what_it_does_and_never_prunes_a_finished_trial(tiny_bert, tmp_path, data_home, monkeypatch):
    """A line per report (step, figure, pace) and per outcome, the study's progress after each trial; trials.csv
    best first with start and seconds; the objective named in the study (optuna-dashboard); a trial is never
    pruned at its last report (its whole budget is spent: it is done); no tune.budget is warned about."""
    import csv

    import optuna

    from kgc.tune import Study

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_said.yaml", tiny_bert, budget="4 steps", reports=1,
                               space={"train.lr": {"low": 1e-9, "high": 3e-3, "log": True}})
    lines: list[str] = []
    study = Study(recipe, tmp_path / "study", echo=lines.append, trials=3)
    for lr in (2e-3, 3e-3, 1e-9):  # the third would be pruned by the median — but its one report is its last
        study.study.enqueue_trial({"train.lr": lr})
    study.optimize(3, None)
    study.write_outputs()
    assert [t.state.name for t in study.study.trials] == ["COMPLETE"] * 3
    assert any(line.startswith("trial 0: step 4/4, dev_mrr ") and "steps/s)" in line for line in lines), lines
    assert any(line.startswith("trial 2: complete, best dev_mrr") for line in lines)
    assert lines[0] == "study [--------------------] 0/3 trials"  # the bar at the start, then after each trial
    assert any(line.startswith("study [#######-------------] 1/3 trials, about ") and line.endswith(" s left")
               for line in lines), lines
    assert "study [####################] 3/3 trials" in lines
    assert study.study.metric_names == ["dev_mrr"]
    with open(tmp_path / "study" / "trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    values = [float(r["value"]) for r in rows]
    assert values == sorted(values, reverse=True) and all(r["start"] and float(r["seconds"]) > 0 for r in rows)

    said: list[str] = []
    no_budget = write_tune_recipe(tmp_path / "umls_nobudget.yaml", tiny_bert, budget=None)
    Study(no_budget, tmp_path / "other", echo=said.append)
    assert any(line.startswith("warning: tune.budget is not set") for line in said), said
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_metric_names_are_read_as_the_task_reports_them():
    from kgc.training.task import task_class
    from kgc.tune import resolve_metric

    assert resolve_metric(task_class("linkpred"), None) == ("dev_mrr", "maximize")
    assert resolve_metric(task_class("linkpred"), "hits@10") == ("dev_hits_at_10", "maximize")
    assert resolve_metric(task_class("linkpred"), "dev_hits_at_1") == ("dev_hits_at_1", "maximize")
    assert resolve_metric(task_class("linkpred"), "head_above_gold") == ("dev_head_above_gold", "minimize")
    with pytest.raises(KGCError, match=r"tune.metric 'spearman': not a dev figure of link prediction; it reports "
                                       r"dev_mrr \(higher is better\), .*dev_head_above_gold \(lower is better\)"):
        resolve_metric(task_class("linkpred"), "spearman")


def test_each_sampler_draws_inside_the_space_and_grid_visits_every_point_once():
    """random and CMA-ES draw within the ranges (CMA-ES only over two or more ranges: a choice is refused, naming
    it); grid needs steps or choices and visits each point of the space once, in a seeded order."""
    import optuna

    from kgc.recipe import ParamRange
    from kgc.tune import grid_points, make_sampler, suggest

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ranges = {"train.lr": ParamRange(low=1e-4, high=1e-2, log=True), "loss.margin": ParamRange(low=0.0, high=0.1)}
    for kind in ("random", "cmaes", "tpe"):
        study = optuna.create_study(sampler=make_sampler(kind, ranges, 3, 12))
        study.optimize(lambda t: -abs(suggest(t, ranges)["loss.margin"] - 0.05), n_trials=12)
        assert type(study.sampler).__name__ == {"random": "RandomSampler", "cmaes": "CmaEsSampler",
                                                "tpe": "TPESampler"}[kind]
        for t in study.trials:
            assert 1e-4 <= t.params["train.lr"] <= 1e-2 and 0.0 <= t.params["loss.margin"] <= 0.1
        assert len({tuple(t.params.values()) for t in study.trials}) == 12
    with pytest.raises(KGCError, match=r"tune.sampler cmaes: CMA-ES searches two or more ranges, and loss.margin is "
                                       r"a choice; use tpe, random or grid"):
        make_sampler("cmaes", {"train.lr": ranges["train.lr"], "loss.margin": ParamRange(choices=[0.0, 0.02])}, 0, 4)
    with pytest.raises(KGCError, match=r"tune.sampler grid: train.lr, loss.margin is a continuous range; give it a "
                                       r"step"):
        make_sampler("grid", ranges, 0, 4)

    stepped = {"train.batch_size": ParamRange(low=16, high=64, step=16),
               "loss.margin": ParamRange(low=0.0, high=0.04, step=0.02),
               "model.pooling": ParamRange(choices=["mean", "cls"])}
    grid = grid_points(stepped)
    assert grid == {"train.batch_size": [16, 32, 48, 64], "loss.margin": [0.0, 0.02, 0.04],
                    "model.pooling": ["mean", "cls"]}
    orders = []
    for seed in (0, 0, 1):
        study = optuna.create_study(sampler=make_sampler("grid", stepped, seed, 100))
        study.optimize(lambda t: float(suggest(t, stepped)["train.batch_size"]), n_trials=100)
        points = [tuple(t.params[k] for k in stepped) for t in study.trials]
        assert len(points) == 24 and len(set(points)) == 24  # every point once, then the study stops
        orders.append(points)
    assert orders[0] == orders[1] != orders[2]


def test_a_study_optimises_the_metric_asked_in_its_direction(tiny_bert, tmp_path, data_home, monkeypatch):
    """--metric dev_head_above_gold (lower is better) with the random sampler: the study minimises, each trial's
    value is the lowest of its reports, trials.csv and best.yaml put the lowest first; the metric and sampler are
    part of the study's identity (the same recipe with the default metric is another study)."""
    import csv

    import optuna

    from kgc.tune import STUDY_JSON, tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_metric.yaml", tiny_bert, budget="4 steps", reports=2, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    lines: list[str] = []
    summary = tune(recipe, out=tmp_path / "study", trials=3, echo=lines.append, metric="head_above_gold",
                   sampler="random")
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert study.direction == optuna.study.StudyDirection.MINIMIZE and study.metric_names == ["dev_head_above_gold"]
    assert type(study.sampler).__name__ in ("TPESampler", "RandomSampler")  # a loaded study has a default sampler
    for t in study.trials:
        assert sorted(t.intermediate_values) == [2, 4] and t.value == min(t.intermediate_values.values())
    assert summary["best"]["value"] == min(t.value for t in study.trials)
    with open(tmp_path / "study" / "trials.csv") as fh:
        values = [float(r["value"]) for r in csv.DictReader(fh)]
    assert values == sorted(values)
    assert (tmp_path / "study" / "best.yaml").read_text().startswith(f"# kgc tune {recipe} → trial ")
    assert "best dev_head_above_gold" in (tmp_path / "study" / "best.yaml").read_text().splitlines()[0]
    record = json.loads((tmp_path / "study" / STUDY_JSON).read_text())
    assert record["metric"] == "dev_head_above_gold" and record["sampler"] == "random"
    with pytest.raises(KGCError, match=r"which differs in sampler 'tpe', metric 'dev_mrr' \(that study: sampler "
                                       r"'random', metric 'dev_head_above_gold'\)"):
        tune(recipe, out=tmp_path / "study", trials=4, echo=lambda m: None)


def test_a_grid_study_tries_each_point_once_and_says_when_it_has(tiny_bert, tmp_path, data_home, monkeypatch):
    import optuna

    from kgc.tune import tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_grid.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                               space={"loss.margin": {"choices": [0.0, 0.02]}}, sampler="grid")
    lines: list[str] = []
    summary = tune(recipe, out=tmp_path / "study", trials=4, echo=lines.append)
    assert summary["complete"] == 2 and summary["redrawn"] == 0 and summary["failed"] == 0
    assert any("the grid has 2 points and the study has tried them all (2 finished of the 4 asked)" in line
               for line in lines), lines
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert sorted(t.params["loss.margin"] for t in study.trials) == [0.0, 0.02]


def test_a_studys_trials_are_child_runs_of_one_mlflow_run(tiny_bert, tmp_path, data_home, monkeypatch):
    """With train.trackers mlflow, a study is one MLflow experiment (named as the study) holding one parent run and
    each trial's run as its child, tagged with the trial's number, the study and its outcome."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from kgc.tune import STUDY_JSON, tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    recipe = write_tune_recipe(tmp_path / "umls_mlflow.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    recipe.write_text(recipe.read_text().replace("num_threads: 1}", "num_threads: 1, trackers: [mlflow]}"))
    tune(recipe, out=tmp_path / "study", trials=3, echo=lambda m: None)
    name = json.loads((tmp_path / "study" / STUDY_JSON).read_text())["name"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'study' / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id])
    parent = (tmp_path / "study" / "mlflow" / "parent_run_id").read_text().strip()
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    assert len(runs) == 4 and len(children) == 3
    assert sorted(r.data.tags["kgc.trial"] for r in children) == ["0", "1", "2"]
    assert all(r.data.tags["kgc.state"] == "complete" and r.data.tags["kgc.study"] == name for r in children)
    assert all("loss" in r.data.metrics and "train.lr" in r.data.params for r in children)
    # each child logs the trial's objective (Optuna's value, the best of its reports), the parent ends FINISHED with
    # the study's settings and best value; the three agree with trials.csv
    import csv

    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    values = {str(t.number): t.value for t in study.trials}
    assert {r.data.tags["kgc.trial"]: r.data.metrics["objective"] for r in children} == pytest.approx(values)
    table = {row["trial"]: float(row["value"]) for row in csv.DictReader((tmp_path / "study" / "trials.csv").open())}
    assert table == pytest.approx({k: round(v, 4) for k, v in values.items()})
    top = client.get_run(parent)
    assert top.info.status == "FINISHED" and top.data.metrics["best_dev_mrr"] == pytest.approx(study.best_value)
    assert top.data.params["budget"] == "2 steps" and "train.lr" in top.data.params["space"]
    assert top.data.tags["kgc.best_trial"] == str(study.best_trial.number)


def test_a_trial_reports_exactly_tune_reports_times(tiny_bert, tmp_path, data_home, monkeypatch):
    """A graph whose epoch is 3 steps, a budget of 10 steps and reports 2: the trial validates at steps 5 and 10
    only (each epoch's end validated too before: reports at 3, 5, 6, 9, 10), the objective is the best of those."""
    import optuna

    from kgc.tune import report_steps, tune
    from tests.conftest import write_toy

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    toy = write_toy(tmp_path / "toy")
    recipe = tmp_path / "toy_tune.yaml"
    recipe.write_text(
        f"name: toy_tune\ndata: {{path: {toy}, neighbor_text: false, max_tokens: 16}}\n"
        f"model: {json.dumps({'backbone': str(tiny_bert), 'conditioner': 'biencoder'})}\n"
        "loss: {pre_batch: 0}\n"
        "train: {batch_size: 4, lr: 1.0e-3, warmup_steps: 1, log_every: 2, num_threads: 1}\n"
        "eval: {batch_size: 16, validate_every_epoch: true}\n"
        'tune: {budget: "10 steps", reports: 2, trials: 2, pruner: none, '
        'space: {train.lr: {low: 1.0e-4, high: 3.0e-3, log: true}}}\n')
    summary = tune(recipe, out=tmp_path / "study", echo=lambda m: None)
    assert summary["complete"] == 2
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    for t in study.trials:
        assert sorted(t.intermediate_values) == [5, 10] and t.value == max(t.intermediate_values.values())
        rows = [json.loads(line) for line in
                (tmp_path / "study" / "trials" / f"{t.number:04d}" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "dev_mrr" in r] == [5, 10]
    assert report_steps(10, 2) == [5, 10] and report_steps(10, 3) == [3, 6, 10] and report_steps(2, 5) == [1, 2]
    assert report_steps(None, 2) is None and report_steps(6, 1) == [6]


@pytest.mark.parametrize("damage", ["emptied", "cut", "random", "deleted"])
def test_a_damaged_or_emptied_study_storage_is_refused_never_started_over(damage, tiny_bert, tmp_path, data_home,
                                                                           monkeypatch):
    """`: > study.db` (or a cut file, random bytes, a deleted file) beside a study's trial folders: one message naming
    the storage and the trials, no traceback, and trials/0000 is not overwritten by a new study."""
    import os

    from kgc.tune import STUDY_DB, tune

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_tune_recipe(tmp_path / "umls_db.yaml", tiny_bert, budget="2 steps", reports=1, pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    tune(recipe, out=tmp_path / "study", trials=1, echo=lambda m: None)
    db = tmp_path / "study" / STUDY_DB
    kept = (tmp_path / "study" / "trials" / "0000" / "train_summary.json").read_bytes()
    data = db.read_bytes()
    if damage == "emptied":
        db.write_bytes(b"")
    elif damage == "cut":
        db.write_bytes(data[: len(data) // 3])
    elif damage == "random":
        db.write_bytes(os.urandom(len(data)))
    else:
        db.unlink()
    with pytest.raises(KGCError, match=r"study\.db: the study's (storage|record)") as refused:
        tune(recipe, out=tmp_path / "study", trials=2, echo=lambda m: None)
    assert "nothing was started over" in str(refused.value)
    assert (tmp_path / "study" / "trials" / "0000" / "train_summary.json").read_bytes() == kept
    assert not (tmp_path / "study" / "trials" / "0001").exists()


def test_killing_the_parent_of_jobs_stops_its_workers(tiny_bert, tmp_path, data_home):
    """`kgc tune --jobs 2` killed (SIGKILL) left its two workers training; SIGTERM exited 143 without a word. Now
    the workers die with their parent however it dies, and SIGTERM is forwarded and said; the study continues."""
    import signal
    import subprocess
    import sys

    recipe = write_tune_recipe(tmp_path / "umls_kill.yaml", tiny_bert, budget="400 steps", pruner="none",
                               space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}})
    env = {**os.environ, "KGC_CACHE_HOME": str(tmp_path / "cache"), "KGC_DATA_HOME": str(data_home),
           "HF_HUB_OFFLINE": "1"}

    def workers_of(parent: int) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out]

    def gone(pids: list[int], within: float) -> bool:
        end = time.time() + within
        while time.time() < end:
            if not any(os.path.exists(f"/proc/{p}") and "zombie" not in _state(p) for p in pids):
                return True
            time.sleep(0.2)
        return False

    for sig in (signal.SIGKILL, signal.SIGTERM):
        out = tmp_path / f"study-{sig.name}"
        proc = subprocess.Popen([sys.executable, "-m", "kgc", "tune", str(recipe), "--out", str(out), "--trials", "4",
                                 "--jobs", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while len(workers_of(proc.pid)) < 2 or not list((out / "trials").glob("*")):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        pids = workers_of(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert gone(pids, 30), (sig.name, pids)
        if sig == signal.SIGTERM:
            assert proc.returncode == 2 and "stopped by SIGTERM; its 2 workers were stopped with it" in err, err
            assert "Traceback" not in err, err


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((line for line in fh if line.startswith("State:")), "").lower()
    except OSError:
        return "zombie"
