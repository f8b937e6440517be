"""Every unreadable run file ends in one message naming the file and the fix; an error on DDP rank 0 reaches the
other ranks instead of leaving them waiting for torchrun's timeout. A run is written by one process at a time (the
second is told who holds it); a damaged index is rebuilt or named; a folder that cannot be written, a damaged
backbone and a folder that is not a run are one message each — and a property-based test damages any file of a
finished run."""

from __future__ import annotations

import json
import shutil

import numpy as np
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
    from kgc.training import session as loop

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


# ---------------------------------------------------------------- a shared run: one writer at a time


@pytest.fixture()
def held():
    """``held(folder, what)``: hold ``folder``'s run lock in another thread (as another process would) until the
    test ends; the thread's lock is refused to this one exactly as another process's is."""
    import threading

    from kgc.fileio import run_lock

    stops = []

    def hold(folder, what):
        taken, stop = threading.Event(), threading.Event()

        def body():
            with run_lock(folder, what):
                taken.set()
                stop.wait(30)

        t = threading.Thread(target=body, daemon=True)
        t.start()
        assert taken.wait(10)
        stops.append((stop, t))

    yield hold
    for stop, t in stops:
        stop.set()
        t.join(10)


def test_run_lock_names_the_holder_is_reentrant_and_refuses_another_process(tmp_path):
    import os
    import subprocess
    import sys

    from kgc.fileio import run_lock

    folder = tmp_path / "run"
    with run_lock(folder, "training"):
        with run_lock(folder, "building the index"):  # the same thread again: no deadlock
            holder = json.loads((folder / ".lock.json").read_text())
        assert holder["pid"] == os.getpid() and holder["what"] == "training"
        code = "from kgc.fileio import run_lock\nwith run_lock(%r, 'x'): pass" % str(folder)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "RunBusy" in res.stderr, res.stderr  # a KGCError: one message in the CLI
        assert (f"{folder} is in use by `" in res.stderr and f"(training; pid {os.getpid()} on " in res.stderr
                and "wait for it to finish or stop it" in res.stderr), res.stderr
    assert not (folder / ".lock.json").exists()  # released: the holder file goes
    with run_lock(folder, "training"):  # and it can be taken again
        pass


def test_a_second_train_into_the_same_out_is_refused_and_writes_nothing(run, tmp_path, held):
    out = tmp_path / "busy"
    held(out, "training")
    before = sorted(p.name for p in out.iterdir())
    res = kgc("train", run / "recipe.yaml", "--out", out, "--no-progress", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert f"{out} is in use by `" in res.stderr and "(training; pid" in res.stderr, res.stderr
    assert "wait for it to finish or stop it" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written, nothing removed
    assert out.is_dir()  # the holder's folder stays


def test_index_builds_and_adds_are_refused_while_another_writes(copy, tmp_path, held):
    new = tmp_path / "new.tsv"
    new.write_text("q1\tQuito\tcapital of Ecuador\n")
    held(copy, "adding entities to the index")
    for args in (("index", copy, "--add", new, "--no-progress"), ("index", copy, "--no-progress"),
                 ("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress")):
        res = kgc(*args, check=False)  # no index yet: predict would build one
        assert res.returncode == 2 and "Traceback" not in res.stderr, res
        assert f"{copy} is in use by `" in res.stderr and "(adding entities to the index; pid" in res.stderr
        assert "--force" not in res.stderr  # wait and run it again; nothing to rebuild
    assert not (copy / "index").exists()


def test_a_fresh_index_serves_answers_while_the_run_is_locked(copy, held):
    kgc("index", copy, "--no-progress")
    held(copy, "training the structural model")
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress")
    assert "e_" in res.stdout  # reading needs no lock


# ---------------------------------------------------------------- a damaged index


def _truncate(path, keep=None):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


def test_index_meta_records_sizes_and_checksums(copy):
    from kgc.fileio import sha256_file

    kgc("index", copy, "--no-progress")  # flat: entities.npy is the whole index
    files = json.loads((copy / "index" / "meta.json").read_text())["files"]
    assert set(files) == {"entities.npy"} and not (copy / "index" / "entities.faiss").exists()
    kgc("index", copy, "--type", "hnsw", "--no-progress")  # a FAISS type: its file is recorded too
    files = json.loads((copy / "index" / "meta.json").read_text())["files"]
    for name in ("entities.npy", "entities.faiss"):
        f = copy / "index" / name
        assert files[name] == {"bytes": f.stat().st_size, "sha256": sha256_file(f)}


def test_a_damaged_index_is_rebuilt_where_it_can_be_and_named_where_not(copy, tmp_path):
    kgc("index", copy, "--type", "hnsw", "--no-progress")  # a FAISS type, so that there is an entities.faiss
    answer = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress").stdout
    faiss_file, npy = copy / "index" / "entities.faiss", copy / "index" / "entities.npy"
    size = faiss_file.stat().st_size
    _truncate(faiss_file)
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress")
    assert f"rebuilding the index of {copy}: entities.faiss is damaged (size {size // 2}, expected {size})" \
        in res.stderr
    assert res.stdout.splitlines()[1:] == answer.splitlines()[1:]  # the same answers (the first line has the time)

    _truncate(npy)
    res = kgc("evaluate", copy, "--no-progress", check=False)  # evaluate reads the index, never rebuilds it
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert f"entities.npy is damaged (size {npy.stat().st_size}, expected" in res.stderr
    assert f"kgc index {copy} --force" in res.stderr

    kgc("index", copy, "--force", "--no-progress")  # the same size, one byte flipped: the checksum tells
    data = bytearray(npy.read_bytes())
    data[-3] ^= 0xFF
    npy.write_bytes(bytes(data))
    res = kgc("evaluate", copy, "--no-progress", check=False)
    assert res.returncode == 2 and "entities.npy is damaged (its sha256 differs" in res.stderr, res

    new = tmp_path / "new.tsv"  # kgc index --add rebuilds it first, with a note
    new.write_text("q1\tQuito\tcapital of Ecuador\n")
    res = kgc("index", copy, "--add", new, "--no-progress")
    assert f"rebuilding the index of {copy}: entities.npy is damaged" in res.stderr
    assert "added 1 entities" in res.stdout


def test_an_old_index_without_checksums_loads_and_unreadable_files_are_one_message(copy):
    kgc("index", copy, "--type", "hnsw", "--no-progress")
    meta_file = copy / "index" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["files"], meta["faiss"]["bytes"]  # as written before sizes and checksums were recorded
    meta_file.write_text(json.dumps(meta))
    kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress")  # loads as it is
    _truncate(copy / "index" / "entities.faiss", 40)
    res = kgc("evaluate", copy, "--use-index", "--no-progress", check=False)  # faiss: RuntimeError
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert f"{copy / 'index' / 'entities.faiss'}: damaged, cannot be read" in res.stderr
    assert f"kgc index {copy} --force" in res.stderr
    _truncate(copy / "index" / "entities.npy", 100)
    res = kgc("evaluate", copy, "--no-progress", check=False)  # numpy: ValueError
    assert res.returncode == 2 and f"{copy / 'index' / 'entities.npy'}: damaged, cannot be read" in res.stderr, res
    assert f"kgc index {copy} --force" in res.stderr


def test_add_reads_a_two_field_line_as_entity2text_does(tmp_path):
    from kgc.linkpred.index.added import NewEntity, read_new_entities

    f = tmp_path / "new.tsv"
    f.write_text("q1\tQuito, capital of Ecuador\nq2\tLima\nq3\tBogota\tcapital, of Colombia\n")
    assert [e for _, e in read_new_entities(f)] == [NewEntity("q1", "Quito", "capital of Ecuador"),
                                                    NewEntity("q2", "Lima", ""),
                                                    NewEntity("q3", "Bogota", "capital, of Colombia")]


# ---------------------------------------------------------------- an unwritable run folder


def test_predict_on_a_run_folder_that_cannot_be_written(copy, monkeypatch):
    import filelock

    class Refused(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(self.lock_file))

    monkeypatch.setattr(filelock, "FileLock", Refused)  # as chmod 555 does for a user other than root
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert (f"{copy} cannot be written (Permission denied), and building the index writes into it. Make it "
            f"writable (e.g. `chmod -R u+w {copy}`") in res.stderr


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root writes into a chmod 555 folder")
def test_predict_on_a_read_only_run_folder(copy):
    import os

    os.chmod(copy, 0o555)
    try:
        res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress", check=False)
    finally:
        os.chmod(copy, 0o755)
    assert res.returncode == 2 and f"{copy} cannot be written" in res.stderr and "chmod" in res.stderr, res


def test_evaluate_prints_its_table_before_a_failed_write(copy, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    res = kgc("evaluate", copy, "--no-progress", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert "side " in res.stdout and "both " in res.stdout and "wrote " not in res.stdout  # the figures, printed
    assert f"{copy / 'results.json'}: cannot be written (Permission denied). Make {copy} writable" in res.stderr
    assert "only saving them failed" in res.stderr
    assert not (copy / "results.json").exists()


# ---------------------------------------------------------------- a damaged backbone, a folder that is not a run


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "tokenizer_config.json"])
def test_a_damaged_backbone_file_is_named(copy, name):
    _truncate(copy / "backbone" / name, 300)
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert f"{copy / 'backbone' / name}: damaged, not readable JSON" in res.stderr
    assert "Copy it back from the model it was copied from" in res.stderr


def test_a_missing_backbone_and_damaged_weights_are_named(copy, tiny_bert, tmp_path):
    import shutil as sh

    from kgc.encoding.backbone import load_backbone

    sh.rmtree(copy / "backbone")
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress", check=False)
    assert res.returncode == 2 and f"{copy / 'backbone'}: no such model folder" in res.stderr, res
    model = sh.copytree(tiny_bert, tmp_path / "bert")
    _truncate(model / "model.safetensors", 5000)
    with pytest.raises(KGCError, match=r"model.safetensors: damaged, the weights cannot be read \(.*Copy it back"):
        load_backbone(model)


def test_flipped_bytes_in_best_pt_are_refused_by_the_recorded_checksum(copy):
    summary = json.loads((copy / "train_summary.json").read_text())
    assert set(summary["files"]) >= {"best.pt", "backbone/config.json", "backbone/tokenizer.json"}
    data = bytearray((copy / "best.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor: torch.load would read it without a word
    (copy / "best.pt").write_bytes(bytes(data))
    res = kgc("predict", copy, "--head", "e_dog", "--relation", "hypernym", "--no-progress", check=False)
    assert res.returncode == 2 and f"{copy / 'best.pt'}: damaged (its sha256 differs" in res.stderr, res


def test_a_folder_that_is_not_a_run(data_home, tmp_path):
    import kgc as api

    folder = data_home / "WN18RR"
    res = kgc("predict", folder, "--head", "dog", "--relation", "hypernym", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert (f"{folder} is a dataset folder, not a kgc run directory (no recipe.yaml); train a run on it with "
            f"`kgc train RECIPE --set data.path={folder} --out runs/NAME`") in res.stderr
    with pytest.raises(KGCError, match=f"{tmp_path} is not a kgc run directory \\(no recipe.yaml\\); train one with "
                                       f"`kgc train RECIPE --out {tmp_path}`"):
        api.load(tmp_path)


# ---------------------------------------------------------------- property-based: a damaged finished run


@pytest.fixture(scope="module")
def finished(run, tmp_path_factory):
    """The trained run with its index built and an evaluation written: every file a finished run has."""
    folder = shutil.copytree(run, tmp_path_factory.mktemp("finished") / "run")
    kgc("index", folder, "--type", "hnsw", "--no-progress")  # a FAISS type: entities.faiss is among the files
    kgc("evaluate", folder, "--no-progress")
    return folder


def test_any_damaged_file_of_a_finished_run_ends_in_kgcerror_or_the_right_answer(finished, tmp_path_factory):
    """The finished-run counterpart of tests/test_own_graph.py's malformed-dataset property: any file of the run
    (recipe.yaml, best.pt, backbone/*, index/*, metrics.jsonl, results.json …) truncated or with bytes flipped, then
    ``kgc.load(copy).predict(…)``: a KGCError, or the undamaged run's answer — never another exception, never
    another answer. Except for recipe.yaml: damage that leaves it a valid recipe saying something else is an edit
    (a run's recipe may be edited), so there only the exception type is checked."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import kgc as api
    from kgc.recipe import load_recipe

    files = sorted(str(f.relative_to(finished)) for f in finished.rglob("*") if f.is_file() and f.stat().st_size)
    assert {"recipe.yaml", "best.pt", "backbone/tokenizer.json", "index/entities.npy", "index/entities.faiss",
            "index/meta.json", "results.json", "train_summary.json"} <= set(files)
    recipe = load_recipe(finished / "recipe.yaml", saved=True).model_dump()
    expected = api.load(finished, echo=None).predict("e_dog", "hypernym", top_k=5)
    counts = {"error": 0, "answer": 0}

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(files), how=st.sampled_from(["truncate", "flip"]), at=st.floats(0, 1),
           length=st.integers(1, 16), xor=st.integers(1, 255))
    def check(name, how, at, length, xor):
        copy = shutil.copytree(finished, tmp_path_factory.mktemp("damaged") / "run")
        f = copy / name
        data = bytearray(f.read_bytes())
        offset = min(int(at * len(data)), len(data) - 1)
        if how == "truncate":
            del data[offset:]
        else:
            for i in range(offset, min(offset + length, len(data))):
                data[i] ^= xor
        f.write_bytes(bytes(data))
        try:
            answer = api.load(copy, echo=None).predict("e_dog", "hypernym", top_k=5)
        except KGCError:
            counts["error"] += 1
            return
        counts["answer"] += 1
        if name == "recipe.yaml":
            try:
                edited = load_recipe(f, saved=True).model_dump() != recipe
            except KGCError:
                edited = False
            if edited:
                return
        assert list(answer["entity"]) == list(expected["entity"]), (name, how, offset)
        assert np.allclose(answer["score"], expected["score"], atol=1e-5), (name, how, offset)

    check()
    assert counts["error"] >= 5 and counts["answer"] >= 5, counts  # both outcomes were exercised


def test_resume_takes_the_lock_before_reading_anything(copy, held):
    (copy / "checkpoints").mkdir(exist_ok=True)
    (copy / "checkpoints" / "last.pt").write_bytes(b"\x00" * 100)  # unreadable, but the lock is refused first
    held(copy, "building the index")
    res = kgc("train", "--resume", copy, check=False)
    assert res.returncode == 2 and f"{copy} is in use by `" in res.stderr, res
    assert "(building the index; pid" in res.stderr and "unreadable checkpoint" not in res.stderr
