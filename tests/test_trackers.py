"""train.trackers: every metrics.jsonl row also in TensorBoard's event files (read back with TensorBoard's own
reader), an MLflow run (listed by the MLflow client with its params, metric history and artefacts, and the test
figures after `kgc evaluate`) and metrics.csv; a resumed run's rows past its checkpoint are not kept twice; a
missing package is one message naming the extra."""

from __future__ import annotations

import csv
import json

import pytest

from kgc.errors import KGCError


@pytest.fixture(scope="module")
def tracked(tiny_bert, tmp_path_factory, data_home):
    import kgc
    from tests.conftest import write_toy
    from tests.test_cli_smoke import toy_recipe

    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("tracked")
    recipe = toy_recipe(tmp / "tracked.yaml", tiny_bert, write_toy(tmp / "TOY"), {"conditioner": "biencoder"},
                        epochs=2, max_steps=4)
    text = recipe.read_text().replace('"num_threads": 1', '"num_threads": 1, "trackers": ["tensorboard", "mlflow", "csv"]')
    recipe.write_text(text)
    run = kgc.train(recipe, tmp / "run", progress=False, echo=None)
    results = kgc.load(run.path, device="cpu", echo=None).evaluate("test", progress=False)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    return run.path, rows, results


def test_tensorboard_reads_every_row(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, rows, _ = tracked
    events = EventAccumulator(str(path / "tensorboard"), size_guidance={"scalars": 0, "images": 0}).Reload()
    losses = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    assert len(losses) == 4
    assert [(e.step, round(e.value, 5)) for e in events.Scalars("train/loss")] == losses
    dev = [(r["step"], r["dev_mrr"]) for r in rows if "dev_mrr" in r]
    got = events.Scalars("dev/mrr")
    assert len(dev) == 2 and [e.step for e in got] == [s for s, _ in dev]
    assert [e.value for e in got] == pytest.approx([v for _, v in dev])
    assert "train/lr" in events.Tags()["scalars"] and "curves" in events.Tags()["images"]
    assert "recipe/text_summary" in events.Tags()["tensors"]  # the resolved recipe, as text


def test_mlflow_lists_the_run_with_params_metrics_and_artifacts(tracked):
    from mlflow.tracking import MlflowClient

    path, rows, results = tracked
    client = MlflowClient(f"sqlite:///{path / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tracked")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_id == (path / "mlflow" / "run_id").read_text().strip()
    assert run.data.params["train.lr"] == "0.001" and run.data.params["model.conditioner"] == "biencoder"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in rows if "loss" in r]
    both = results["both"]["realistic"]
    assert run.data.metrics["test_mrr"] == pytest.approx(both["inverse_harmonic_mean_rank"])
    assert run.data.metrics["test_hits_at_10"] == pytest.approx(both["hits_at_10"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "train_summary.json", "results.json"} <= artifacts


def test_csv_holds_each_scalar_in_the_long_layout(tracked):
    path, rows, _ = tracked
    with (path / "metrics.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    expected = [(r["step"], k, v) for r in rows for k, v in r.items()
                if k not in ("step", "epoch") and isinstance(v, (int, float))]
    assert [(int(t["step"]), t["key"]) for t in table] == [(s, k) for s, k, _ in expected]
    assert [float(t["value"]) for t in table] == pytest.approx([v for _, _, v in expected])


def test_a_resumed_run_keeps_each_step_once(tmp_path):
    """Reopened at the checkpoint's step 2 (as a resumed run is), the rows past it are dropped and logged again."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kgc.training.trackers import open_trackers

    first = open_trackers(["tensorboard", "csv"], tmp_path, {"train": {"lr": 1}}, title="t")
    for step in (1, 2, 3):
        first.log({"step": step, "loss": float(step)})
    second = open_trackers(["tensorboard", "csv"], tmp_path, {"train": {"lr": 1}}, title="t", resume_step=2)
    for step in (3, 4):
        second.log({"step": step, "loss": 10.0 * step})
    second.finish([])
    with (tmp_path / "metrics.csv").open(newline="") as f:
        assert [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f)] == [(1, 1), (2, 2), (3, 30), (4, 40)]
    events = EventAccumulator(str(tmp_path / "tensorboard"), purge_orphaned_data=True).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1), (2, 2), (3, 30), (4, 40)]


def test_a_missing_tracker_package_names_its_extra(monkeypatch, tmp_path):
    import importlib.util

    from kgc.training import trackers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(KGCError, match=r"pip install 'kgc\[mlflow\]'"):
        trackers.open_trackers(["csv", "mlflow"], tmp_path, {}, title="t")
    assert not (tmp_path / "metrics.csv").exists()  # checked before any tracker opens


def test_an_unknown_tracker_is_refused_by_the_recipe(tmp_path):
    from kgc.recipe import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("data: {dataset: umls}\ntrain: {trackers: [tensorbord]}\n")
    with pytest.raises(KGCError, match="tensorbord"):
        load_recipe(path)
