"""Through the CLI on UMLS with a tiny random BERT: train, evaluate, index, predict, kill -9, resume.

The commands run in this process (:func:`tests.conftest.cli`: typer's parsing, KGCError → exit 2, as
``kgc.cli.main``); only the SIGKILL test starts a real ``kgc train`` process, which it must kill.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import cli as kgc, linkpred_model

pytestmark = pytest.mark.slow


def write_recipe(path: Path, backbone: Path, model: dict | None = None, encoder: dict | None = None, **train) -> Path:
    t = {"epochs": 1, "batch_size": 64, "lr": 1e-3, "warmup_steps": 2, "checkpoint_every": 2, "log_every": 1,
         "num_threads": 1, "keep": "all", **train}  # keep: all — these tests compare the final resume state
    m = {"backbone": str(backbone), "conditioner": "biencoder", **(model or {})}
    path.write_text(
        "name: tiny\n"
        f"data: {{dataset: umls, neighbor_text: true, max_tokens: 24}}\n"
        f"model: {json.dumps(m)}\n"
        f"encoder: {json.dumps(encoder or {})}\n"
        "loss: {pre_batch: 2, self_negative: true}\n"
        f"train: {json.dumps(t)}\n"
        "eval: {batch_size: 128, dev_queries: 60, validate_every_steps: 3}\n")
    return path


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory, data_home):
    tmp = tmp_path_factory.mktemp("e2e")
    recipe = write_recipe(tmp / "tiny.yaml", tiny_bert, max_steps=6)
    run = tmp / "run"
    out = kgc("train", recipe, "--out", run, "--no-progress")
    assert f"run directory: {run}" in out.stdout and "finished 6 steps" in out.stdout
    return run


def test_run_directory_is_self_contained(trained):
    for f in ("recipe.yaml", "backbone/config.json", "best.pt", "checkpoints/last.pt", "metrics.jsonl",
              "curves.png", "train_summary.json"):
        assert (trained / f).is_file(), f
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if "dev_mrr" in r] == [3, 6]  # every 3 steps, and at the end
    assert all(r["tau"] > 0 and r["triples_per_s"] > 0 for r in records if "loss" in r)
    assert not list(trained.rglob("*.tmp"))  # atomic writes leave no temp files


def test_evaluate_writes_pykeen_layout(trained):
    out = kgc("evaluate", trained, "--no-progress")
    assert "MRR" in out.stdout and "both" in out.stdout
    results = json.loads((trained / "results.json").read_text())
    mrr = results["both"]["realistic"]["inverse_harmonic_mean_rank"]
    assert 0 < mrr <= 1 and 0 <= results["tail"]["realistic"]["hits_at_10"] <= 1
    with open(trained / "ranks.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 2 * 661
    ranks = np.array([float(r["rank"]) for r in rows])
    assert (ranks >= 1).all() and (ranks <= 135).all()
    assert mrr == pytest.approx(np.mean(1 / ranks))  # ranks.tsv and results.json agree
    k = results["kgc"]
    assert k["queries"] == 1322 and k["triples"] == 661 and not k["sampled"]
    # the time breakdown accounts for parts of the total, never more than it (each figure rounded to 1 ms)
    parts = ("state_seconds", "entity_table_seconds", "query_encoding_seconds")
    assert all(k[p] >= 0 for p in parts) and sum(k[p] for p in parts) <= k["evaluation_seconds"] + 0.002


def test_index_and_predict(trained, monkeypatch):
    from kgc.linkpred.model import LinkPredictor

    before = json.loads((trained / "results.json").read_text()) if (trained / "results.json").is_file() else None
    kgc("index", trained, "--no-progress")
    assert (trained / "index" / "meta.json").is_file()
    kgc("evaluate", trained, "--no-progress")  # now reuses the index's entity embeddings
    after = json.loads((trained / "results.json").read_text())
    assert after["kgc"]["entity_embeddings"] == "index" and after["kgc"]["encoder_passes"] == 1322
    if before is not None:
        assert before["kgc"]["entity_embeddings"] == "computed" and before["kgc"]["encoder_passes"] == 135 + 1322
        key = ("both", "realistic", "inverse_harmonic_mean_rank")
        assert after[key[0]][key[1]][key[2]] == pytest.approx(before[key[0]][key[1]][key[2]], abs=1e-6)
    # predict answers from the stored index: one query encoded, no entity embedded, the index left as it was
    stamp = {f.name: f.stat().st_mtime_ns for f in (trained / "index").iterdir()}

    def no_entity_encoding(*a, **kw):
        raise AssertionError("predict embedded entities instead of searching the index")

    with monkeypatch.context() as m:
        m.setattr(LinkPredictor, "entity_table", no_entity_encoding)
        m.setattr(LinkPredictor, "encode_entities", no_entity_encoding)
        out = kgc("predict", trained, "--head", "Virus", "--relation", "location of", "--top-k", "5", "--json")
    assert out.stderr == "" and {f.name: f.stat().st_mtime_ns for f in (trained / "index").iterdir()} == stamp
    answer = json.loads(out.stdout)
    preds = answer["predictions"]
    assert answer["head"] == "virus" and answer["relation"] == "location_of" and len(preds) == 5
    scores = [p["score"] for p in preds]
    assert scores == sorted(scores, reverse=True) and [p["rank"] for p in preds] == [1, 2, 3, 4, 5]
    # brute force: the same top-5 from cosines of the query against every entity
    model, graph = linkpred_model(trained)
    with torch.no_grad():
        q = model.encode_queries([graph.entity_index["virus"]], [graph.relation_index["location_of"]])
        s = (q @ model.entity_table().t())[0]
        s[graph.entity_index["virus"]] = float("-inf")  # kgc predict leaves the head out (--include-head keeps it)
    top = torch.topk(s, 5)
    assert [p["entity"] for p in preds] == [graph.entities[i] for i in top.indices.tolist()]
    np.testing.assert_allclose(scores, top.values.numpy(), atol=1e-5)
    filtered = json.loads(kgc("predict", trained, "--head", "virus", "--relation", "location_of",
                              "--filter-known", "--top-k", "135", "--json").stdout)["predictions"]
    known = {graph.entities[i] for i in graph.all_answers[graph.hr_keys(np.array([graph.entity_index["virus"]]),
                                                                         np.array([graph.relation_index["location_of"]]))].indices}
    assert known and not known & {p["entity"] for p in filtered}
    assert len(filtered) == 135 - len(known | {"virus"})  # every other entity but the head, each once
    assert len({p["entity"] for p in filtered}) == len(filtered)


def test_predict_errors_are_helpful(trained):
    typo = kgc("predict", trained, "--head", "virsu", "--relation", "isa", check=False)  # a typo: did you mean
    assert typo.returncode == 2 and "'virsu' is not an entity of" in typo.stderr
    assert "did you mean: virus? (--free-text" in typo.stderr and "Traceback" not in typo.stderr
    free = kgc("predict", trained, "--head", "virsu", "--relation", "isa", "--free-text", "--json")
    assert "'virsu' is not an entity of" in free.stderr and "embedded as free text" in free.stderr
    assert json.loads(free.stdout)["head"] == "(free text)"
    bad = kgc("predict", trained, "--head", "virus", "--relation", "eats", check=False)
    assert bad.returncode == 2 and "unknown relation 'eats'" in bad.stderr
    bad = kgc("predict", trained, "--relation", "isa", check=False)  # typer's own usage error
    assert bad.returncode == 2 and "--head" in bad.stderr


def test_stale_index_is_refused(trained, tmp_path):
    from kgc.training.run import RunDir

    run = tmp_path / "copy"
    shutil.copytree(trained, run)
    kgc("index", run, "--no-progress")
    state = torch.load(run / "best.pt", weights_only=False)
    next(iter(state["model"].values())).add_(1.0)
    torch.save(state, run / "best.pt")
    summary = json.loads((run / "train_summary.json").read_text())  # new weights, recorded as a retraining does
    summary["files"] = RunDir(run).file_records()
    (run / "train_summary.json").write_text(json.dumps(summary))
    bad = kgc("evaluate", run, "--no-progress", check=False)
    assert bad.returncode == 2 and "stale" in bad.stderr and f"kgc index {run}" in bad.stderr
    out = kgc("predict", run, "--head", "virus", "--relation", "isa", "--no-progress")  # predict rebuilds it
    assert f"rebuilding the index of {run}: it was built from other model weights" in out.stderr
    assert "stale" not in kgc("evaluate", run, "--no-progress").stderr  # fresh again


def loss_records(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_sigkill_mid_run_then_resume_reproduces_the_uninterrupted_run(tiny_bert, tmp_path, data_home):
    """A real `kgc train` process, checkpointing every step, is killed with SIGKILL mid-run; `kgc train --resume`
    then ends bit for bit where a run that never stopped ends: every weight (torch.equal), τ, the pre-batch
    queue, the schedule, the best dev metric, and the logged losses and dev MRRs of every step, each logged once."""
    import kgc as api

    steps = 12
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_bert, max_steps=steps, checkpoint_every=1)
    run = tmp_path / "run"
    log = tmp_path / "train.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kgc", "train", recipe, "--out", run, "--no-progress"],
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300  # a guard against a hung child, not a speed claim
    while time.monotonic() < deadline:
        if metrics.is_file() and metrics.read_text().count('"loss"') >= 4:
            break
        assert proc.poll() is None, log.read_text()  # it must still be running when killed
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=False)  # never a truncated file
    assert 3 <= state["step"] < steps
    res = kgc("train", "--resume", run, "--no-progress")
    assert f"resuming {run} from step {state['step']}" in res.stdout and f"finished {steps} steps" in res.stdout
    assert json.loads((run / "train_summary.json").read_text())["steps"] == steps

    full = api.train(recipe, tmp_path / "full", progress=False, echo=None).path  # the same recipe, never stopped
    assert [s for s, _ in loss_records(run)] == list(range(1, steps + 1))
    assert loss_records(run) == loss_records(full)
    dev = lambda d: [(r["step"], r["dev_mrr"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                     if "dev_mrr" in r]  # noqa: E731
    assert dev(run) == dev(full) and [s for s, _ in dev(run)] == [3, 6, 9, 12]
    a = torch.load(full / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == steps and a["best_metric"] == b["best_metric"]
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert torch.equal(a["loss"]["log_inv_t"], b["loss"]["log_inv_t"])
    assert len(a["loss_extra"]) == len(b["loss_extra"]) == 2  # the pre-batch queue: the last 2 batches' tails
    for (va, ia), (vb, ib) in zip(a["loss_extra"], b["loss_extra"]):
        assert np.array_equal(ia, ib) and np.array_equal(va, vb)
    assert a["scheduler"] == b["scheduler"]
    best_a, best_b = (torch.load(d / "best.pt", weights_only=False) for d in (full, run))
    assert best_a["step"] == best_b["step"] and all(torch.equal(best_a["model"][k], best_b["model"][k])
                                                    for k in best_a["model"])


def assert_resume_reproduces(recipe, tmp_path, monkeypatch, *, at_step: int, steps: int) -> None:
    """Train ``recipe`` uninterrupted, and again resumed from its step-``at_step`` checkpoint: the same end."""
    import kgc.training.loop as loop
    import kgc.training.session as session

    full = loop.train(recipe, out=tmp_path / "full", progress=False, echo=lambda m: None)
    real_save, snapshot = session.save_checkpoint, tmp_path / "snap"

    def save_and_snapshot(path, state):
        real_save(path, state)
        if path.name == "last.pt" and state["step"] == at_step and not snapshot.exists():
            shutil.copytree(path.parent.parent, snapshot)

    monkeypatch.setattr(session, "save_checkpoint", save_and_snapshot)  # the session writes last.pt
    loop.train(recipe, out=tmp_path / "other", progress=False, echo=lambda m: None)
    monkeypatch.setattr(session, "save_checkpoint", real_save)
    loop.train(resume=snapshot, progress=False, echo=lambda m: None)
    a = torch.load(full / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(snapshot / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == steps and a["best_metric"] == b["best_metric"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]


@pytest.mark.parametrize("model,encoder", [
    ({"conditioner": "hadamard", "shared_towers": True}, {}),
    ({"conditioner": "concat", "shared_towers": True}, {}),
    ({"conditioner": "hypernet", "shared_towers": True, "hypernet_form": "residual", "rank": 4}, {"trainable_layers": 0}),
    ({"conditioner": "router", "router_layers": 1}, {"trainable_layers": 1}),
    ({"conditioner": "router", "router_layers": 1, "cross_attend": "top"}, {"trainable_layers": 1}),
    ({"conditioner": "router", "router_layers": 1, "cross_attend": "all", "scorer": "cls_attention"}, {}),
], ids=["hadamard", "concat", "hypernet-residual-frozen", "router-top1-cached", "router-cross-top-cached",
        "router-cross-all-cls"])
def test_every_conditioner_through_the_cli(model, encoder, tiny_bert, tmp_path, data_home, monkeypatch):
    from kgc.linkpred.model import LinkPredictor

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "run"
    out = kgc("train", write_recipe(tmp_path / "r.yaml", tiny_bert, model, encoder, max_steps=3), "--out", run,
              "--no-progress")
    assert "finished 3 steps" in out.stdout
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["conditioner"] == model["conditioner"] and summary["steps"] == 3
    if encoder:
        assert summary["trainable_params"] < summary["total_params"]
    else:
        assert summary["trainable_params"] == summary["total_params"]
    if encoder:  # frozen layers came from (and went to) the on-disk cache
        cache = summary["layer_cache"]
        assert cache["misses"] > 0 and Path(cache["folder"], "meta.json").is_file()
        assert Path(cache["folder"]).parent.parent == tmp_path / "cache"
    kgc("evaluate", run, "--no-progress")
    res = json.loads((run / "results.json").read_text())["kgc"]
    passes = res["encoder_passes_by_kind"]
    from kgc.data.formats import load_graph

    test = load_graph("umls").splits["test"]
    heads = len(np.unique(test[:, [0, 2]]))  # the entities the test queries start from (both directions)
    assert heads < 135
    # every relation once; the sentence states of the queries' heads once, or of every entity where the sentence
    # table is the entity table (pooled conditioners with shared towers)
    assert passes["conditions"] == 92 and passes["sentences"] == (135 if model.get("shared_towers") else heads)
    if model.get("cross_attend") == "all":  # the condition is read from layer 0: the whole encoder per query
        assert passes["queries_full"] == 1322 and passes["queries_top_layers"] == 0
        assert res["condition_enters_at_layer"] == 0 and res["encoder_layers_per_query"] == 2
    elif model["conditioner"] == "router":
        assert passes["queries_top_layers"] == 1322 and passes["queries_full"] == 0
        assert res["condition_enters_at_layer"] == 1 and res["encoder_layers_per_query"] == 1
    else:  # the tri-encoders compose: no encoder pass per query, the entity table is the sentence table
        assert passes["queries_full"] == passes["queries_top_layers"] == 0 and "entities" not in passes
        assert res["condition_enters_at_layer"] == 2 and res["encoder_layers_per_query"] == 0
    assert res["cache_bytes"] > 0
    kgc("index", run, "--no-progress")
    with monkeypatch.context() as m:  # answered from the index: no entity is embedded again
        m.setattr(LinkPredictor, "entity_table", lambda *a, **k: pytest.fail("predict re-embedded every entity"))
        out = kgc("predict", run, "--head", "virus", "--relation", "isa", "--top-k", "3", "--json")
    preds = json.loads(out.stdout)["predictions"]
    assert out.stderr == "" and [p["rank"] for p in preds] == [1, 2, 3]
    # the index's top 3 are the exact top 3 of the query against every entity
    model_, graph = linkpred_model(run)
    with torch.no_grad():
        q = model_.encode_queries([graph.entity_index["virus"]], [graph.relation_index["isa"]]).float()
        s = (q @ model_.entity_table().float().t())[0]
        s[graph.entity_index["virus"]] = float("-inf")  # the head is not among its own answers
    top = torch.topk(s, 3)
    assert [p["entity"] for p in preds] == [graph.entities[i] for i in top.indices.tolist()]
    np.testing.assert_allclose([p["score"] for p in preds], top.values.numpy(), atol=1e-4)


def test_entity_table_refresh_is_a_fresh_encode(tiny_bert, tmp_path, data_home, monkeypatch):
    """loss.table_negatives N: at steps 0, N, 2N … the loss's table is every entity's tail-tower embedding as a
    fresh evaluation-time encode gives it (eval mode, no gradient); in between it is kept; training mode is back."""
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=4), ["loss.table_negatives=2"])
    task = LinkPredTraining(recipe)
    model, _ = task.build_model(tiny_bert)
    model.attach_layer_cache(recipe)
    criterion = task.make_loss(torch.device("cpu"))
    model.train()
    task.before_step(model, criterion, 0)
    first = criterion.table
    assert model.training and first.shape == (task.graph.num_entities, model.tail_encoder.dim)
    model.eval()
    torch.testing.assert_close(first, model.entity_table(recipe.eval.batch_size), rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        next(model.tail_encoder.parameters()).add_(0.05)  # the tail tower moves, as training moves it
    task.before_step(model, criterion, 1)
    assert criterion.table is first  # not a refresh step: kept
    task.before_step(model, criterion, 2)
    model.eval()
    torch.testing.assert_close(criterion.table, model.entity_table(recipe.eval.batch_size), rtol=0, atol=0)
    assert not torch.equal(criterion.table, first)


def test_resume_with_the_entity_table_reproduces_the_run(tiny_bert, tmp_path, data_home, monkeypatch):
    """A run with table negatives resumed from a checkpoint between two refreshes (the table comes from the
    checkpoint) ends bit-identical to the uninterrupted run."""
    import yaml

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    path = write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=5, checkpoint_every=1)
    tree = yaml.safe_load(path.read_text())
    tree["loss"]["table_negatives"] = 2
    tree["eval"]["validate_every_steps"] = None
    path.write_text(yaml.safe_dump(tree))
    from kgc.recipe import load_recipe

    assert_resume_reproduces(load_recipe(path), tmp_path, monkeypatch, at_step=3, steps=5)


@pytest.mark.parametrize("shared", [False, True])
def test_table_tails_trains_the_query_tower_from_the_table(tiny_bert, tmp_path, data_home, monkeypatch, shared):
    """loss.table_tails: the step runs no tail tower (its tails and heads are table rows). Separate towers: the tail
    tower does not train (no trainable parameter, weights unchanged after training), its table is computed once
    (later refresh steps keep it) and validation ranks against that same table; shared towers: refreshed every N
    steps as with table_negatives alone, and the shared encoder trains through the queries."""
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=4),
                         ["loss.table_negatives=2", "loss.table_tails=true", f"model.shared_towers={str(shared).lower()}",
                          "encoder.trainable_layers=all"])
    task = LinkPredTraining(recipe)
    model, _ = task.build_model(tiny_bert)
    model.attach_layer_cache(recipe)
    criterion = task.make_loss(torch.device("cpu"))
    assert any(p.requires_grad for p in model.tail_encoder.parameters()) == shared
    tail_before = {k: v.clone() for k, v in model.tail_encoder.state_dict().items()}
    model.train()
    task.before_step(model, criterion, 0)
    first = criterion.table
    calls = []
    monkeypatch.setattr(type(model), "encode_entities",
                        lambda self, *a, **k: calls.append(1) or pytest.fail("the tail tower ran in a step"))
    loss = task.batch_loss(model, criterion, task.examples[:4])
    loss.backward()
    monkeypatch.undo()
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    assert not calls and torch.isfinite(loss)
    with torch.no_grad():
        for p in model.query_encoder.parameters():
            p.add_(0.05)  # a training step moves the query tower (and, shared, the tail tower with it)
    task.before_step(model, criterion, 2)
    assert (criterion.table is first) == (not shared)
    if not shared:
        assert task.fixed_table is not None and torch.equal(task.fixed_table, first.cpu())
    run = train(recipe, out=tmp_path / "run", progress=False, echo=lambda *_: None)
    if not shared:
        from kgc.training.run import RunDir

        best = torch.load(run / "best.pt", weights_only=False)  # lean: the frozen tower is not in it ...
        assert not any(k.startswith("tail_encoder.") for k in best["model"])
        assert {f"tail_encoder.{k}" for k in tail_before} <= set(best["frozen_keys"])
        assert RunDir.has_backbone_weights(run)  # ... but in backbone/, whence the loaded run reads it
        from kgc.linkpred.answer.run import LinkPredRun

        state = LinkPredRun(run, echo=None).predictor.model().state_dict()
        for k, v in tail_before.items():
            torch.testing.assert_close(state[f"tail_encoder.{k}"], v, rtol=0, atol=0)


KILL_MID_REFRESH = """
import os, signal, sys
from pathlib import Path
import kgc.linkpred.model as m
from kgc.recipe import load_recipe
from kgc.training.loop import train

real, calls = m.LinkPredictor.entity_table, []


def dying(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the second refresh (step 2): half the entities encoded, then the process is killed
        list(self.bank.length_batches(8))[:2]
        self.encode_entities(list(range(8)))
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, *args, **kwargs)


m.LinkPredictor.entity_table = dying
train(load_recipe(sys.argv[1]), out=Path(sys.argv[2]), progress=False, echo=lambda *_: None)
"""


def test_sigkill_mid_refresh_then_resume_reproduces_the_run(tiny_bert, tmp_path, data_home):
    """A process killed (SIGKILL: no cleanup, no handler) while it refreshes the entity table leaves its last
    checkpoint intact; `kgc train --resume` refreshes again at that step and ends bit-identical to a run that was
    never interrupted."""
    import os
    import signal
    import subprocess
    import sys

    import yaml

    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    env = {**os.environ, "KGC_CACHE_HOME": str(tmp_path / "cache")}
    path = write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=4, checkpoint_every=1)
    tree = yaml.safe_load(path.read_text())
    tree["loss"]["table_negatives"] = 2
    tree["eval"]["validate_every_steps"] = None
    path.write_text(yaml.safe_dump(tree))
    script = tmp_path / "kill.py"
    script.write_text(KILL_MID_REFRESH)
    killed = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "killed")], env=env,
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ckpt = torch.load(tmp_path / "killed" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 2  # the checkpoint written before the refresh at step 2 began
    os.environ["KGC_CACHE_HOME"] = env["KGC_CACHE_HOME"]
    try:
        train(resume=tmp_path / "killed", progress=False, echo=lambda *_: None)
        train(load_recipe(path), out=tmp_path / "full", progress=False, echo=lambda *_: None)
    finally:
        del os.environ["KGC_CACHE_HOME"]
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == 4
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    torch.testing.assert_close(torch.as_tensor(a["loss_extra"]["table"]), torch.as_tensor(b["loss_extra"]["table"]),
                               rtol=0, atol=0)


def test_max_minutes_stops_training_and_the_curves_read_time_and_triples(tiny_bert, tmp_path, data_home, monkeypatch):
    """train.max_minutes: once the training clock (validation excluded) passes the budget the run stops after that
    step, validates and finishes as at its last step; every record carries the training seconds and the triples
    seen so far, and a resumed run carries both on."""
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    said = []
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=50), ["train.max_minutes=0.00001"])
    run = train(recipe, out=tmp_path / "run", progress=False, echo=said.append)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 1 and any("train.max_minutes=1e-05 reached after 1 steps" in m for m in said)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["seen"] for r in records] == [64, 64] and "dev_mrr" in records[-1]  # one step of 64, then validation
    assert 0 < records[0]["train_seconds"] <= summary["train_seconds_without_validation"] + 0.01  # records: ms
    assert summary["train_seconds_without_validation"] <= summary["train_seconds"]
    full = train(load_recipe(write_recipe(tmp_path / "r2.yaml", tiny_bert, max_steps=4)), out=tmp_path / "full",
                 progress=False, echo=lambda *_: None)
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert [r["seen"] for r in records if "loss" in r] == [64, 128, 192, 256]
    seconds = [r["train_seconds"] for r in records if "loss" in r]
    assert seconds == sorted(seconds)


def test_kgc_curves_compares_runs_by_triples_and_minutes(trained, tmp_path):
    """`kgc curves RUN RUN` writes one PNG and prints each run's best validation record (the highest dev_mrr, and
    the last when it came later), read from metrics.jsonl (the same folder name twice is told apart by its path)."""
    copy = tmp_path / "again" / trained.name
    shutil.copytree(trained, copy)
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "dev_mrr" in r]
    assert len(val) >= 2
    val[0]["dev_mrr"] = 0.987654  # the copy's first validation is its best, its last is not
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = kgc("curves", trained, copy, "--out", tmp_path / "c.png")
    best = max(json.loads(line)["dev_mrr"] for line in (trained / "metrics.jsonl").read_text().splitlines()
               if "dev_mrr" in line)
    first = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines() if "dev_mrr" in line]
    top = next(r for r in first if r["dev_mrr"] == best)
    assert f"{trained}: best dev_mrr {best:.4f} at step {top['step']}, {top['seen']:,} seen" in out.stdout
    line = (f"{copy}: best dev_mrr 0.9877 at step {val[0]['step']}, {val[0]['seen']:,} seen, "
            f"{val[0]['train_seconds'] / 60:.1f} min   (last: {val[-1]['dev_mrr']:.4f} at step {val[-1]['step']})")
    assert line in out.stdout and f"wrote {tmp_path / 'c.png'}" in out.stdout
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_the_curves_star_each_runs_best_validation(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from kgc.training.common import best_record, plot_runs

    a = [{"step": 1, "seen": 10, "train_seconds": 60, "dev_mrr": 0.2}, {"step": 1, "loss": 3.0},
         {"step": 2, "seen": 20, "train_seconds": 120, "dev_mrr": 0.5},
         {"step": 3, "seen": 30, "train_seconds": 180, "dev_mrr": 0.5},  # equal: the earlier stays best (best.pt)
         {"step": 4, "seen": 40, "train_seconds": 240, "dev_mrr": 0.3}]
    assert best_record(a, "dev_mrr")["step"] == 2 and best_record([{"loss": 1.0}], "dev_mrr") is None
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    assert plot_runs({"a": a, "b": [{"loss": 1.0}]}, tmp_path / "c.png", metric="dev_mrr") == ["b"]
    left, right = figures[0].axes
    stars = lambda ax: [(list(l.get_xdata()), list(l.get_ydata())) for l in ax.lines if l.get_marker() == "*"]  # noqa: E731,E741
    assert stars(left) == [([20], [0.5])] and stars(right)[0] == ([2.0], [0.5])
    assert "best" in [t.get_text() for t in right.get_legend().get_texts()]


def test_a_slow_pace_with_every_layer_training_names_trainable_layers(tiny_bert, tmp_path, monkeypatch):
    """Once, early: a pace that implies more than an hour an epoch, with every layer training, says what
    encoder.trainable_layers would do; not with a few layers trained, nor for a run capped within the hour."""
    from kgc.recipe import load_recipe
    from kgc.training import loop

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=3))
    slow = loop.pace_warning(recipe, steps=20, seconds=40.0, steps_per_epoch=5000)  # 2 s a step: 2.8 h an epoch
    assert slow == ("warning: at 2.00s a step, an epoch (5,000 steps) takes about 2.8 h with every layer training "
                    "(encoder.trainable_layers: all). encoder.trainable_layers=N (e.g. --set "
                    "encoder.trainable_layers=2) trains only the top N layers and reads the frozen ones below from "
                    "the layer cache, computed once: each step then runs N layers, not all of them")
    assert loop.pace_warning(recipe, steps=20, seconds=10.0, steps_per_epoch=5000) is None  # 42 min an epoch
    assert loop.pace_warning(recipe, steps=20, seconds=40.0, steps_per_epoch=5000, total_steps=100) is None
    top = load_recipe(write_recipe(tmp_path / "t.yaml", tiny_bert, encoder={"trainable_layers": 1}))
    assert loop.pace_warning(top, steps=20, seconds=40.0, steps_per_epoch=5000) is None
    capped = load_recipe(write_recipe(tmp_path / "c.yaml", tiny_bert, max_minutes=30))
    assert loop.pace_warning(capped, steps=20, seconds=40.0, steps_per_epoch=5000) is None
    # in the loop: judged once, after PACE_STEPS steps (here every pace is "slow")
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "PACE_STEPS", 2)
    monkeypatch.setattr(loop, "SLOW_EPOCH_SECONDS", 0.0)
    said: list[str] = []
    loop.train(recipe, out=tmp_path / "run", progress=False, echo=said.append)
    warned = [m for m in said if "encoder.trainable_layers=N" in m]
    assert len(warned) == 1 and warned[0].startswith("warning: at ")
