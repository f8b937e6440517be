"""Every unreadable run file ends in one message naming the file and the fix; an error on DDP rank 0 reaches the
other ranks instead of leaving them waiting for torchrun's timeout."""

from __future__ import annotations

import json
import shutil

import pytest

from kgc.errors import KGCError
from tests.conftest import cli as kgc
from tests.test_cli_smoke import toy_recipe


@pytest.fixture(scope="module")
def run(tiny_bert, tmp_path_factory, data_home):
    import os

    from tests.conftest import write_toy

    tmp = tmp_path_factory.mktemp("errors")
    os.environ.setdefault("KGC_CACHE_HOME", str(tmp / "cache"))
    data = write_toy(tmp / "TOY")
    recipe = toy_recipe(tmp / "r.yaml", tiny_bert, data, {"conditioner": "hadamard"}, max_steps=1)
    kgc("train", recipe, "--out", tmp / "run", "--no-progress")
    return tmp / "run"


@pytest.fixture()
def copy(run, tmp_path):
    """A fresh copy of the trained run, to break."""
    return shutil.copytree(run, tmp_path / "run")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "not a checkpoint"])
def test_corrupt_best_pt(copy, damage):
    import torch

    best = copy / "best.pt"
    data = best.read_bytes()
    if damage == "garbage":
        best.write_bytes(b"this is not a checkpoint" * 10)
    elif damage == "truncated":
        best.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        best.write_bytes(b"")
    else:
        torch.save({"weights": 1}, best)
    for args in (("evaluate", copy, "--no-progress"), ("predict", copy, "--head", "e_dog", "--relation", "hypernym")):
        res = kgc(*args, check=False)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res
        assert f"{best}: " in res.stderr and ("unreadable checkpoint" in res.stderr or "not a kgc checkpoint" in
                                             res.stderr)
        assert "kgc train --resume" in res.stderr or "Delete it" in res.stderr  # the fix


def test_corrupt_last_pt_on_resume(copy):
    (copy / "checkpoints").mkdir(exist_ok=True)  # a finished run keeps best.pt only (train.keep: best)
    (copy / "checkpoints" / "last.pt").write_bytes(b"\x00" * 100)
    res = kgc("train", "--resume", copy, check=False)
    assert res.returncode == 2 and "checkpoints/last.pt: unreadable checkpoint" in res.stderr and "Delete it" in res.stderr


def test_corrupt_structure_files(copy):
    folder = copy / "structure"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"not a model")
    (folder / "meta.json").write_text("{not json")
    res = kgc("evaluate", copy, "--no-progress", check=False)
    assert res.returncode == 2 and f"{folder / 'meta.json'}: unreadable" in res.stderr
    assert f"kgc structure {copy}" in res.stderr
    (folder / "meta.json").write_text(json.dumps({"model": "TransE", "entities": 6, "relations": 2, "params": {}}))
    res = kgc("evaluate", copy, "--no-progress", check=False)
    assert res.returncode == 2 and f"{folder / 'model.pt'}: unreadable" in res.stderr and "Traceback" not in res.stderr
    (folder / "meta.json").write_text(json.dumps([1, 2]))
    res = kgc("evaluate", copy, "--no-progress", check=False)
    assert res.returncode == 2 and "not the description kgc writes of a structural model" in res.stderr


def test_corrupt_summary_and_index_meta(copy):
    from kgc.training.run import RunDir

    (copy / "train_summary.json").write_text("{")
    with pytest.raises(KGCError, match=r"train_summary.json: unreadable .* `kgc train --resume"):
        RunDir(copy).summary()
    kgc("index", copy, "--no-progress")
    (copy / "index" / "meta.json").write_bytes(b"\xff\xfe broken")
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", check=False)
    assert res.returncode == 2 and "index/meta.json: unreadable" in res.stderr and f"kgc index {copy}" in res.stderr


def test_rank0_errors_reach_every_rank(monkeypatch):
    """`_on_main` under DDP: whatever rank 0 raises (not only KGCError) is broadcast, so the other ranks stop with
    a KGCError naming it; rank 0 re-raises its own exception."""
    from kgc.training import distributed as dist
    from kgc.training import loop

    sent = []

    def broadcast(obj):
        sent.append(obj)
        return obj if dist.rank() == 0 else (None, "RuntimeError: CUDA out of memory")

    monkeypatch.setattr(dist, "active", lambda: True)
    monkeypatch.setattr(dist, "broadcast", broadcast)

    def boom():
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(dist, "rank", lambda: 0)
    monkeypatch.setattr(dist, "is_main", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        loop._on_main(boom)
    assert sent[-1] == (None, "RuntimeError: CUDA out of memory")  # told the others before raising
    assert loop._on_main(lambda: 7) == 7 and sent[-1] == (7, None)

    monkeypatch.setattr(dist, "rank", lambda: 1)
    monkeypatch.setattr(dist, "is_main", lambda: False)
    with pytest.raises(KGCError, match=r"rank 0 failed \(RuntimeError: CUDA out of memory\); this rank stops too"):
        loop._on_main(lambda: pytest.fail("only rank 0 runs fn"))
