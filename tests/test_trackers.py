"""train.trackers: every metrics.jsonl row also in TensorBoard's event files (read back with TensorBoard's own
reader), an MLflow run (listed by the MLflow client with its params, metric history and artefacts, and the test
figures after `kgc evaluate`), an offline W&B run (its records decoded with W&B's own protobuf) and metrics.csv; a
resumed run's rows past its checkpoint are not kept twice; a missing package is one message naming the extra."""

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
    pytest.importorskip("wandb")
    tmp = tmp_path_factory.mktemp("tracked")
    recipe = toy_recipe(tmp / "tracked.yaml", tiny_bert, write_toy(tmp / "TOY"), {"conditioner": "biencoder"},
                        epochs=2, max_steps=4)
    text = recipe.read_text().replace('"num_threads": 1', '"num_threads": 1, "trackers": ["tensorboard", "mlflow", "csv", "wandb"]')
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


def wandb_records(path):
    """The records of an offline W&B run file (``run-ID.wandb``): W&B's header, then LevelDB-log records (32 KiB
    blocks; a 7-byte header each: checksum, length, type 1 full / 2 first / 3 middle / 4 last), each a protobuf
    ``Record`` of W&B's own schema."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, part, out = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if left < 7 or (length == 0 and kind == 0):  # the block's zero-filled tail
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def wandb_items(items) -> dict:
    """A history or summary record's items as a dict (W&B stores a key as ``key`` or as a ``nested_key`` path)."""
    out: dict = {}
    for item in items:
        keys = [item.key] if item.key else list(item.nested_key)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = json.loads(item.value_json)
    return out


def test_wandb_writes_an_offline_run_with_the_recipe_rows_image_and_test_figures(tracked):
    path, rows, results = tracked
    meta = json.loads((path / "wandb" / "run.json").read_text())
    assert meta["project"] == "tracked"
    files = sorted((path / "wandb" / "wandb").glob(f"offline-run-*-{meta['id']}/run-{meta['id']}.wandb"))
    assert len(files) == 2  # the training, then `kgc evaluate` reopening the same run id
    training = wandb_records(files[0])
    (run,) = [r.run for r in training if r.WhichOneof("record_type") == "run"]
    assert run.run_id == meta["id"] and run.project == "tracked" and run.display_name == path.name
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["train"]["lr"] == 0.001 and config["model"]["conditioner"] == "biencoder"  # the resolved recipe
    history = [wandb_items(r.history.item) for r in training if r.WhichOneof("record_type") == "history"]
    for tag, key in (("train/loss", "loss"), ("dev/mrr", "dev_mrr")):  # each row, at its step
        logged = [(h["step"], h[tag]) for h in history if tag in h]
        expected = [(r["step"], r[key]) for r in rows if key in r]
        assert [s for s, _ in logged] == [s for s, _ in expected] and len(expected) >= 2
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected])
    assert any(h.get("images/curves", {}).get("_type") == "image-file" for h in history)
    saved = {f.path for r in training if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert "train_summary.json" in saved
    summary = {k: v for r in wandb_records(files[1]) if r.WhichOneof("record_type") == "summary"
               for k, v in wandb_items(r.summary.update).items()}
    assert summary["test_mrr"] == pytest.approx(results["both"]["realistic"]["inverse_harmonic_mean_rank"])


def test_csv_is_pykeens_csv_result_tracker_layout(tracked, tmp_path):
    """metrics.csv: the header and rows PyKEEN's CSVResultTracker writes (type,step,key,value): the parameters at
    step 0, then each step's numbers (the epoch among them) as metric rows, equal to metrics.jsonl."""
    from pykeen.trackers import CSVResultTracker

    path, rows, _ = tracked
    with (path / "metrics.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    ours = (path / "metrics.csv").read_text().splitlines()
    theirs = CSVResultTracker(path=tmp_path / "pykeen.csv")
    theirs.start_run()
    theirs.log_params({"train": {"lr": 0.001}})
    theirs.log_metrics({"loss": 2.5}, step=3)
    theirs.end_run()
    pk = (tmp_path / "pykeen.csv").read_text().splitlines()
    assert ours[0] == pk[0] == "type,step,key,value"
    assert pk[1:] == ["parameter,0,train.lr,0.001", "metric,3,loss,2.5"]
    params = [t for t in table if t["type"] == "parameter"]
    assert params and all(t["step"] == "0" for t in params) and any(t["key"] == "train.lr" for t in params)
    metrics = [t for t in table if t["type"] == "metric"]
    expected = [(r["step"], k, float(v)) for r in rows for k, v in r.items()
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    got = sorted((int(t["step"]), t["key"], float(t["value"])) for t in metrics)  # a step may log two rows
    want = sorted(expected)
    assert [(s, k) for s, k, _ in got] == [(s, k) for s, k, _ in want]
    assert [v for _, _, v in got] == pytest.approx([v for _, _, v in want])


def test_tensorboard_holds_the_test_figures_after_kgc_evaluate(tracked):
    """`kgc evaluate` writes its headline figures into the run's TensorBoard events (test/mrr …) at its last step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, _, results = tracked
    events = EventAccumulator(str(path / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    (mrr,) = events.Scalars("test/mrr")
    assert mrr.value == pytest.approx(results["both"]["realistic"]["inverse_harmonic_mean_rank"])
    assert mrr.step == json.loads((path / "train_summary.json").read_text())["steps"]
    assert "test/hits_at_10" in events.Tags()["scalars"]


def test_a_resumed_run_logs_each_step_into_mlflow_once(tmp_path):
    """MLflow kept a resumed run's replayed steps twice: the reopened run skips the steps MLflow holds already."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from kgc.training.trackers import open_trackers

    first = open_trackers(["mlflow"], tmp_path, {"train": {"lr": 1}}, title="t")
    for step in (1, 2, 3):
        first.log({"step": step, "loss": float(step)})
    first.close()
    second = open_trackers(["mlflow"], tmp_path, {"train": {"lr": 1}}, title="t", resume_step=2)
    for step in (3, 4):
        second.log({"step": step, "loss": float(step)})
    second.finish([])
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run_id = (tmp_path / "mlflow" / "run_id").read_text().split()[0]
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


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
        table = list(csv.DictReader(f))
    assert [(int(r["step"]), float(r["value"])) for r in table if r["key"] == "loss"] == [(1, 1), (2, 2), (3, 30),
                                                                                        (4, 40)]
    assert [(r["type"], r["key"], r["value"]) for r in table if r["type"] == "parameter"] == [
        ("parameter", "train.lr", "1")]  # once, not again on the resume
    events = EventAccumulator(str(tmp_path / "tensorboard"), purge_orphaned_data=True).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1), (2, 2), (3, 30), (4, 40)]


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path):
    """W&B: the resumed process reopens the run id kept in RUN/wandb/run.json and logs its rows against kgc's step."""
    pytest.importorskip("wandb")
    from kgc.training.trackers import open_trackers

    first = open_trackers(["wandb"], tmp_path, {"train": {"lr": 1}}, title="t")
    for step in (1, 2, 3):
        first.log({"step": step, "loss": float(step)})
    first.close()  # the training failed: aborted, not finished
    run_id = json.loads((tmp_path / "wandb" / "run.json").read_text())["id"]
    second = open_trackers(["wandb"], tmp_path, {"train": {"lr": 1}}, title="t", resume_step=2)
    for step in (3, 4):
        second.log({"step": step, "loss": 10.0 * step})
    second.finish([])
    files = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2
    logged = [wandb_items(r.history.item) for r in wandb_records(files[1]) if r.WhichOneof("record_type") == "history"]
    assert [(h["step"], h["train/loss"]) for h in logged] == [(3, 30.0), (4, 40.0)]


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


def test_one_tracker_may_be_written_without_brackets():
    """`--set train.trackers=tensorboard` failed without the `[a,b]` hint: one name (or a comma list) is the list."""
    from kgc.recipe import load_recipe

    assert load_recipe(None, ["train.trackers=csv"]).train.trackers == ["csv"]
    assert load_recipe(None, ["train.trackers=tensorboard,csv"]).train.trackers == ["tensorboard", "csv"]
    assert load_recipe(None, ["train.trackers=[csv]"]).train.trackers == ["csv"]
