"""``kgc index RUN --nproc 2``: the entity table encoded in shards by 2 gloo processes equals the one-process table,
and a run whose second rank is killed after its first chunk resumes from the chunks it left. A tiny run on UMLS
(135 entities) in chunks of 32: rank 0 takes positions 0..95 (3 chunks), rank 1 96..134 (2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import kgc
from kgc.errors import KGCError
from kgc.fileio import lock_holder
from kgc.linkpred.answer import sharded
from tests.conftest import cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory, data_home) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=1, echo=None)
    return out


def copy_run(trained: Path, to: Path) -> Path:
    shutil.copytree(trained, to, ignore=shutil.ignore_patterns("index"))
    return to


def answers(run_dir: Path) -> list[tuple[str, float]]:
    frame = kgc.load(run_dir, echo=None).predict("virus", "causes", top_k=5)
    return list(zip(frame["entity"], frame["score"].round(6)))


@pytest.fixture(scope="module")
def one_process(trained, tmp_path_factory) -> dict:
    """The index one process builds: its table, meta.json and top 5."""
    run_dir = copy_run(trained, tmp_path_factory.mktemp("one") / "run")
    cli("index", run_dir, "--no-progress")
    return {"table": np.load(run_dir / "index" / "entities.npy"),
            "meta": json.loads((run_dir / "index" / "meta.json").read_text()), "answers": answers(run_dir)}


@pytest.fixture()
def small_chunks(monkeypatch):
    monkeypatch.setattr(sharded, "CHUNK", 32)  # rank 0 reads it and sends it to the others in the job


def check_same_index(run_dir: Path, one: dict) -> None:
    table = np.load(run_dir / "index" / "entities.npy")
    assert table.dtype == np.float32 and table.shape == one["table"].shape
    np.testing.assert_allclose(table, one["table"], rtol=0, atol=1e-6)
    meta = json.loads((run_dir / "index" / "meta.json").read_text())
    same = ("weights_sha256", "texts_sha256", "entities", "dim", "index", "embeddings", "exact")
    assert {k: meta[k] for k in same} == {k: one["meta"][k] for k in same}
    run = kgc.load(run_dir, echo=None)
    assert run.entities.stale_reason() is None
    assert answers(run_dir) == one["answers"]
    assert not (run_dir / "index" / sharded.SHARDS).exists()  # the work folder goes with the commit
    assert lock_holder(run_dir) is None


def test_two_processes_one_killed_then_resumed_build_the_one_process_index(trained, one_process, small_chunks, tmp_path, monkeypatch):
    run_dir = copy_run(trained, tmp_path / "run")
    monkeypatch.setenv(sharded.KILL_ENV, "1:1")  # rank 1 is SIGKILLed after writing its first chunk
    res = cli("index", run_dir, "--nproc", "2", "--no-progress", check=False)
    assert res.exit_code == 2 and "shard 2/2" in res.stderr and "killed by signal 9" in res.stderr, res
    assert "run the same command again to resume" in res.stderr
    assert not (run_dir / "index" / "meta.json").exists() and lock_holder(run_dir) is None
    (work,) = (run_dir / "index" / sharded.SHARDS).iterdir()
    left = sorted(f.name for f in work.iterdir())
    assert left == ["chunk-0-32.npy", "chunk-32-64.npy", "chunk-64-96.npy", "chunk-96-128.npy"]  # rank 0's 3, 1's first
    for name in left:  # each whole (written to a temp file, then renamed)
        start, end = map(int, name[len("chunk-"):-len(".npy")].split("-"))
        assert np.load(work / name).shape == (end - start, one_process["table"].shape[1])
    monkeypatch.delenv(sharded.KILL_ENV)
    out = cli("index", run_dir, "--nproc", "2", "--no-progress").stdout
    assert "shard 1/2: entities 0..95 (by text length), 0 chunks encoded, 3 reused" in out
    assert "shard 2/2: entities 96..134 (by text length), 1 chunk encoded, 1 reused" in out
    assert re.search(r"indexed 135 entities .* as flat", out)
    check_same_index(run_dir, one_process)  # two processes (one of them resumed) built the one-process index
    again = cli("index", run_dir, "--nproc", "2", "--no-progress").stdout  # fresh: nothing to encode, no shard
    assert "nothing to do" in again and "shard" not in again


def test_bad_process_counts_are_one_message(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "run")
    res = cli("index", run_dir, "--nproc", "0", check=False)
    assert res.exit_code == 2 and "--nproc 0: give 1 or more processes" in res.stderr
    res = cli("index", run_dir, "--nproc", "136", "--no-progress", check=False)
    assert res.exit_code == 2 and "the graph has 135 entities; give at most 135 processes" in res.stderr
    assert not (run_dir / "index").exists()
    res = cli("index", run_dir, "--nproc", "2", "--add", tmp_path / "new.tsv", check=False)
    assert res.exit_code == 2 and "--add embeds its new entities in one process" in res.stderr
    with pytest.raises(KGCError, match="chunk_size=0: give 1 or more entities per chunk"):
        kgc.load(run_dir, echo=None).index(nproc=2, chunk_size=0)
