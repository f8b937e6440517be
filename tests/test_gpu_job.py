"""The GPU job, rehearsed on the CPU: ``gpu/bundle.py`` packs a (UMLS-only) bundle, ``gpu/rehearse.py`` runs
``gpu/run.sh`` from a clean copy of the tree in an environment that holds only the GPU image's packages (no
pydantic, pykeen, faiss, fastapi, uvicorn: they must come from the bundle's wheels), with a tiny random BERT; the
environment, smoke and one training phase (WN18RR's recipe pointed at UMLS) must pass and write what the device tool
brings back. And the bundle's fp16 model loads as float32."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, SHARED_DATA


def test_an_fp16_checkpoint_loads_as_float32(tmp_path, tokenizer):
    from kgc.encoding.backbone import load_backbone
    from tests.conftest import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "bert", tokenizer, 1)
    from transformers import AutoModel

    AutoModel.from_pretrained(folder).half().save_pretrained(folder)  # as the GPU bundle stores MiniLM
    assert AutoModel.from_pretrained(folder).dtype == torch.float16  # transformers 5 keeps the file's dtype
    assert {p.dtype for p in load_backbone(folder).parameters()} == {torch.float32}


def load_job():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_job", ROOT / "gpu" / "job.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def test_a_rehearsal_is_bounded_by_steps_not_the_clock(tmp_path):
    """gpu/job.py --rehearsal: a command is not killed at its share of the minutes (only past REHEARSAL_CAP), and
    no phase is out of time, however late it is; on the GPU (no --rehearsal) the share holds."""
    import argparse
    import time

    module = load_job()
    args = argparse.Namespace(out=tmp_path, work=tmp_path, bundle=tmp_path, started=time.time() - 3600, minutes=1,
                              backbone="", set=[], rehearsal=False)
    sleep = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    gpu = module.Job(args)
    assert gpu.run("x", sleep, timeout=0.2) == 124 and gpu.out_of_time(40)  # 59 minutes past its deadline
    rehearsal = module.Job(argparse.Namespace(**{**vars(args), "rehearsal": True}))
    assert rehearsal.run("x", sleep, timeout=0.2) == 0 and not rehearsal.out_of_time(40)
    assert rehearsal.cap(0.2) == module.REHEARSAL_CAP and gpu.cap(0.2) == 0.2


@pytest.mark.slow
@pytest.mark.rehearsal  # `make test-rehearsal` (CI runs it after `make test`)
def test_the_gpu_job_rehearses_on_the_cpu(tmp_path, data_home):
    env = {**os.environ, "KGC_DATA_HOME": str(SHARED_DATA), "HF_HUB_OFFLINE": "1"}
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    subprocess.run([sys.executable, "gpu/bundle.py", "--out", str(bundle), "--datasets", "UMLS"], cwd=ROOT,
                   env=env, check=True, timeout=600)
    assert json.loads((bundle / "manifest.json").read_text())["model_dtype"] == "float16"
    # every phase: the pace and profile runs and both protocols pointed at UMLS, batches of 64 (a tiny BERT on 2
    # cores), the protocols' max_steps 4; one length-group width, so "compile on" builds one graph. On a busy
    # machine: a process spins on one of the two cores for the whole run, and --minutes 3 is less than the phases
    # take even on an idle one; a rehearsal is bounded by its steps, so every phase must still run and pass
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        res = subprocess.run([sys.executable, "gpu/rehearse.py", "--bundle", str(bundle), "--keep", str(out),
                              "--minutes", "3", "--smoke-seconds", "60", "--phases",
                              "environment,smoke,profile,pace,wn18rr_protocol,fb15k237_protocol",
                              "--pace-steps", "24", "--pace-switches", "all", "--train-set", "data.dataset=umls",
                              "--train-set", "train.max_steps=4", "--train-set", "train.batch_size=64",
                              "--train-set", "train.length_bucket=64"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    finally:
        hog.kill()
        hog.wait()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "a rehearsal: each phase bounded by its steps, not the clock" in res.stdout
    assert sorted(p.name for p in out.iterdir()) == ["environment.log", "fb15k237_protocol.log", "metrics.jsonl",
                                                     "pace.log", "profile.log", "smoke.log", "summary.md",
                                                     "wn18rr_protocol.log"]  # 8: what the device tool brings back
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    phases = {r["phase"]: r for r in rows if r["kind"] == "phase"}
    assert [phases[p]["status"] for p in ("environment", "smoke", "profile")] == ["ok", "ok", "ok"]
    pace = {p: r for p, r in phases.items() if p.startswith("pace: ")}
    assert set(pace) == {"pace: host", "pace: defaults", "pace: prefetch off", "pace: length groups off",
                         "pace: prefetch and length groups off", "pace: compile on"}
    assert all(r["status"] == "ok" for r in pace.values()), pace
    assert all(r["triples_per_s"] > 0 for p, r in pace.items() if p != "pace: host")
    assert set(pace["pace: host"]["inputs"]["ms_per_step"]) == {"one at a time", "before (in the step)",
                                                                "prepared (a step ahead)"}
    assert "top operators by CPU time" in phases["profile"]["profile"] and phases["profile"]["triples_per_s"] > 0
    assert phases["profile"]["detail"].endswith("skipped (no GPU)")
    for name, epochs in (("wn18rr_protocol", 50), ("fb15k237_protocol", 10)):  # max_steps 4: the minutes did not end it
        assert phases[name]["status"].startswith(f"ok (") and f"of {epochs} epochs" in phases[name]["status"]
        assert 0 < phases[name]["mrr"] <= 1
    assert phases["smoke"]["detail"] == ("cuda tests: ok; train 20 steps: ok; evaluate: ok; predict: ok; "
                                         "serve: ok")
    env_detail = phases["environment"]["detail"]
    assert "faiss-cpu None" in env_detail and "pydantic 2." in env_detail  # faiss absent, pydantic from a wheel
    # MiniLM found through the Hugging Face cache the job fills from the bundle, its fp16 weights loaded as float32
    assert "models--sentence-transformers--all-MiniLM-L6-v2" in env_detail and "torch.float32, 384-dim" in env_detail
    wn = phases["wn18rr_protocol"]
    assert wn["triples_per_s"] > 0 and wn["epochs"] > 0
    curves = [r for r in rows if r["kind"] == "curve" and "loss" in r]
    assert [(r["phase"], r["step"]) for r in curves] == [("wn18rr_protocol", 4), ("fb15k237_protocol", 4)]
    summary = (out / "summary.md").read_text()
    assert "kgc train recipes/wn18rr_biencoder.yaml --set train.epochs=50 --set train.max_minutes=" in summary
    assert "| wn18rr_protocol | ok (" in summary and "## " in summary and "top operators by CPU time" in summary


def test_the_pace_phase_reads_the_steady_rate_past_the_warm_up():
    """gpu/job.py's pace phase: triples/s between the first logged step at or past 20 and the last (the slow first
    steps left out), nothing when fewer than two such rows were logged."""
    job = load_job()
    rows = [{"step": s, "seen": 1024 * s, "train_seconds": t}
            for s, t in ((10, 9.0), (20, 10.0), (30, 10.5), (40, 11.0))] + [{"step": 40, "loss": 1.0}]
    assert job.steady_rate(rows) == pytest.approx(1024 * 20 / 1.0)
    assert job.steady_rate(rows[:2]) is None and job.steady_rate([]) is None
