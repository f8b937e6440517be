"""Data-parallel training on 2 CPU processes (gloo): the same steps as one process on the global batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import write_toy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def still_bert(tmp_path_factory, tokenizer) -> Path:
    """The tiny random BERT without dropout: one process and two then draw no different masks."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("still_bert")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def recipe(path: Path, backbone: Path, data: Path, **train) -> Path:
    t = {"epochs": 40, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1, "log_every": 1, "checkpoint_every": 1,
         "num_threads": 1, "keep": "all", **train}
    path.write_text(f"name: ddp\ndata: {{dataset: {data}, max_tokens: 24}}\n"
                    f"model: {{backbone: {backbone}, conditioner: biencoder}}\n"
                    "loss: {pre_batch: 1, self_negative: true, mask_false_negatives: true, symmetric: true}\n"
                    f"train: {json.dumps(t)}\neval: {{batch_size: 16}}\n")
    return path


def kgc(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kgc", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, **kw)


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_two_processes_take_the_single_process_steps(still_bert, tmp_path, monkeypatch):
    """3 steps of a global batch of 8 (4 per rank; in-batch, pre-batch and self negatives, false-negative masks,
    the symmetric term, learnable τ): the same losses and the same weights as one process on the same 8."""
    import kgc.training.loop as loop
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    r = recipe(tmp_path / "r.yaml", still_bert, write_toy(tmp_path / "TOY"), max_steps=3)
    loop.train(load_recipe(r), out=tmp_path / "one", progress=False, echo=lambda m: None)
    res = kgc("train", r, "--out", tmp_path / "two", "--nproc", "2", "--no-progress")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 processes, global batch 8" in res.stdout and res.stdout.count("finished 3 steps") == 1  # rank 0 speaks
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    a = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == 3 and b["world_size"] == 2 and len(b["rng_ranks"]) == 2
    assert set(a["model"]) == set(b["model"])
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k], rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(b["loss"]["log_inv_t"], a["loss"]["log_inv_t"])  # τ moved, and identically
    assert a["loss"]["log_inv_t"] != pytest.approx(torch.log(torch.tensor(1 / 0.05)).item())
    (va, ia), = a["loss_extra"]
    (vb, ib), = b["loss_extra"]  # the pre-batch queue holds the global batch, in rank order
    assert (ia == ib).all() and vb.shape == (8, 32)
    torch.testing.assert_close(torch.as_tensor(vb), torch.as_tensor(va), rtol=1e-4, atol=1e-5)


def test_killed_group_resumes(still_bert, tmp_path):
    """SIGKILL to the whole torchrun group mid-run; `--resume` with 2 processes finishes every step once."""
    r = recipe(tmp_path / "r.yaml", still_bert, write_toy(tmp_path / "TOY"), max_steps=16)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KGC_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "kgc", "train", str(r), "--out", str(run), "--nproc", "2",
                             "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    metrics, deadline = run / "metrics.jsonl", time.time() + 240
    while time.time() < deadline:
        if metrics.is_file() and metrics.read_text().count('"loss"') >= 6:
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert 4 <= state["step"] < 16 and state["world_size"] == 2
    res = subprocess.run([sys.executable, "-m", "kgc", "train", "--resume", str(run), "--nproc", "2", "--no-progress"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming {run} from step {state['step']}" in res.stdout and "finished 16 steps" in res.stdout
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert steps == list(range(1, 17))
    assert json.loads((run / "train_summary.json").read_text())["processes"] == 2


def test_global_batch_must_split_evenly(monkeypatch):
    from kgc.errors import KGCError
    from kgc.training import distributed as dist

    monkeypatch.setattr(dist, "world_size", lambda: 3)
    dist.check_batch(9)
    with pytest.raises(KGCError, match=r"train.batch_size=8 is the global batch .* 3 processes.*batch_size=6"):
        dist.check_batch(8)


def test_two_processes_stop_together_at_the_time_budget(still_bert, tmp_path, monkeypatch):
    """train.max_minutes under torchrun: the budget check is all-reduced, so the ranks stop at the same step and
    neither waits at a collective the other never reaches (here both clocks pass a tiny budget at step 1; the
    reduction is what keeps them together when their clocks differ); the run finishes once, after that step."""
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    r = recipe(tmp_path / "r.yaml", still_bert, write_toy(tmp_path / "TOY"), max_steps=20)
    res = kgc("train", r, "--out", tmp_path / "two", "--nproc", "2", "--no-progress", "--set",
              "train.max_minutes=0.00001")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reached after 1 steps" in res.stdout and res.stdout.count("finished 1 steps") == 1
