"""Nothing of a run is lost or mixed when a write fails (a full disk) or a process dies mid-commit.

Faults are injected two ways: ``KGC_FAULT=write:N`` (:func:`kgc.fileio.fault`) makes the N-th file write of a
process fail as a full disk does, at every N in turn; and a real file-size limit (``RLIMIT_FSIZE``, what ``ulimit
-f`` sets) makes the C++ writers (torch.save, FAISS, safetensors) themselves fail, in a subprocess. A kill at each
rename of a commit (``KGC_FAULT=commit:N``) checks that a reader then sees the old state or the new one, whole.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kgc
from kgc import fileio
from kgc.errors import DiskFull, KGCError
from kgc.fileio import Transaction, recover
from tests.conftest import cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_faults():
    fileio._FAULTS.clear()
    yield
    fileio._FAULTS.clear()


def fail_at(n: int) -> None:
    """The n-th file write of this process from now fails with ENOSPC."""
    fileio._FAULTS.clear()
    fileio._FAULTS["write"] = n


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every visible file under ``folder`` (relative path -> bytes); the lock's holder file left out."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name not in (".lock", ".lock.json")}


def stray(folder: Path) -> list[str]:
    """Temporary files a failed write left behind (there must be none)."""
    return [str(f) for f in folder.rglob("*") if f.name.endswith((".tx", ".tmp")) or f.name == fileio.JOURNAL]


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory, data_home) -> Path:
    out = tmp_path_factory.mktemp("durable") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=2, echo=None)
    return out


@pytest.fixture()
def run_dir(trained, tmp_path) -> Path:
    """A copy of the trained run with its index, for one test to damage."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    cli("index", out, "--no-progress")
    return out


def new_entities(tmp_path: Path, n: int = 3, prefix: str = "new") -> Path:
    f = tmp_path / f"{prefix}.tsv"
    f.write_text("".join(f"{prefix}_{i}\tthing {i}\ta new kind of thing number {i}\n" for i in range(n)))
    return f


# ---------------------------------------------------------------- the transaction itself


def test_transaction_commits_all_or_nothing(tmp_path):
    (tmp_path / "a").write_text("old a")
    (tmp_path / "gone").write_text("old")
    with Transaction(tmp_path) as tx:
        tx.write_text("a", "new a")
        tx.write_text("b", "new b")
        tx.remove("gone")
        assert (tmp_path / "a").read_text() == "old a"  # nothing visible before the commit
        tx.commit()
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"}
    with pytest.raises(RuntimeError), Transaction(tmp_path) as tx:  # an error before the commit: nothing
        tx.write_text("a", "newer")
        raise RuntimeError("boom")
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"} and not stray(tmp_path)
    fail_at(2)  # the second staged file hits a full disk
    with pytest.raises(DiskFull, match=r"needs 5 bytes.*Nothing was changed") as err, Transaction(tmp_path) as tx:
        tx.write_text("a", "third")
        tx.write_text("b", "third")
    assert str(tmp_path) in str(err.value)
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"} and not stray(tmp_path)
    fileio._FAULTS["eio"] = 1  # a failing disk: its own message, the same guarantee
    with pytest.raises(KGCError, match=r"I/O error\. Nothing was changed"), Transaction(tmp_path) as tx:
        tx.write_text("a", "fourth")
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"} and not stray(tmp_path)


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4, 5])
def test_a_kill_at_each_rename_of_a_commit_is_completed_by_the_next_reader(tmp_path, kill_at):
    (tmp_path / "x").write_text("old x")
    (tmp_path / "y").write_text("old y")
    script = ("from kgc.fileio import Transaction\n"
              f"with Transaction({str(tmp_path)!r}) as tx:\n"
              "    tx.write_text('x', 'new x'); tx.write_text('y', 'new y'); tx.write_text('z', 'new z')\n"
              "    tx.commit()\n")
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "KGC_FAULT": f"commit:{kill_at}"},
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr  # killed mid-commit
    if kill_at == 1:  # before the journal: not committed; the next writer sweeps what it staged
        assert not recover(tmp_path)
        fileio.sweep(tmp_path)
        assert snapshot(tmp_path) == {"x": b"old x", "y": b"old y"} and not stray(tmp_path)
        return
    assert (tmp_path / fileio.JOURNAL).is_file()
    assert recover(tmp_path)
    assert snapshot(tmp_path) == {"x": b"new x", "y": b"new y", "z": b"new z"} and not stray(tmp_path)


# ---------------------------------------------------------------- the index: build, --add, at every failing write


def index_state(run: Path) -> tuple[int, list[str]]:
    """(rows of the index as a search loads it, ids of the added entities), read as a fresh process would."""
    from kgc.linkpred.index.store import added_graph, load_index
    from kgc.training.run import RunDir

    loaded = kgc.load(run, echo=None)
    model, graph = loaded.predictor.model(), loaded.predictor.graph()
    index = load_index(RunDir(run), model, faiss_device="cpu")
    full = added_graph(RunDir(run), graph)
    return index.ntotal, full.entities[graph.num_entities:]


def test_add_fails_at_every_write_and_leaves_the_index_as_it_was(run_dir, tmp_path):
    before = snapshot(run_dir / "index")
    rows, added = index_state(run_dir)
    assert added == []
    new = new_entities(tmp_path)
    for n in range(1, 12):  # the lock's holder file, the added list, the table, meta.json, the journal: each in turn
        fail_at(n)
        out = cli("index", run_dir, "--add", new, "--no-progress", check=False)
        if out.exit_code == 0:
            break
        assert out.exit_code == 2 and "cannot be written" in out.stderr and "Nothing was changed" in out.stderr, out
        assert snapshot(run_dir / "index") == before and not stray(run_dir), n
        assert index_state(run_dir) == (rows, [])
    assert out.exit_code == 0 and n > 4, n
    fileio._FAULTS.clear()
    assert index_state(run_dir) == (rows + 3, ["new_0", "new_1", "new_2"])  # the add that succeeded, whole
    again = cli("index", run_dir, "--add", new, "--no-progress")  # it is applied: the same add again changes nothing
    assert "its entities are in the index already, as they are" in again.stdout
    assert index_state(run_dir) == (rows + 3, ["new_0", "new_1", "new_2"])


def test_rebuild_fails_at_every_write_and_keeps_the_old_index(run_dir, tmp_path):
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    before = snapshot(run_dir / "index")
    state = index_state(run_dir)
    for n in range(1, 12):
        fail_at(n)
        out = cli("index", run_dir, "--force", "--no-progress", check=False)
        if out.exit_code == 0:
            break
        assert out.exit_code == 2 and "cannot be written" in out.stderr, out
        assert snapshot(run_dir / "index") == before and not stray(run_dir)
    assert out.exit_code == 0 and n > 4, n
    fileio._FAULTS.clear()
    assert index_state(run_dir) == state  # rebuilt whole, the added entities kept in the same commit


def test_a_first_index_that_fails_leaves_no_folder(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("index"))
    fail_at(1)
    out = cli("index", run, "--no-progress", check=False)
    assert out.exit_code == 2 and "cannot be written" in out.stderr
    assert not (run / "index").exists()


@pytest.mark.parametrize("kill_at", [3])  # between two renames (every step of a commit: the transaction's test)
def test_a_kill_during_an_add_leaves_the_run_consistent(run_dir, tmp_path, kill_at):
    rows, _ = index_state(run_dir)
    new = new_entities(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kgc", "index", str(run_dir), "--add", str(new), "--no-progress"],
                          env={**os.environ, "KGC_FAULT": f"commit:{kill_at}"}, cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == -9, proc.stderr
    if kill_at == 1:  # before the commit point: the add never happened, and can be sent again
        assert index_state(run_dir) == (rows, [])
        cli("index", run_dir, "--add", new, "--no-progress")
    # else the next reader completes the commit: the add is there whole (its journal preceded every rename)
    assert index_state(run_dir) == (rows + 3, ["new_0", "new_1", "new_2"])
    assert not stray(run_dir)
    predicted = cli("predict", run_dir, "--head", "new_1", "--relation", "isa", "--top-k", "2")
    assert "thing 1" in predicted.stdout or "new_1" in predicted.stdout


def _limited(nbytes: int):
    def limit() -> None:  # in the child: files of at most nbytes (SIGXFSZ is ignored by Python: EFBIG instead)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))
    return limit


def test_a_real_file_size_limit_in_the_writers_themselves(run_dir):
    """C-level writers (numpy, FAISS's fwrite) fail for real; the message names the folder and the fix."""
    table = (run_dir / "index" / "entities.npy").stat().st_size
    before = snapshot(run_dir / "index")
    proc = subprocess.run([sys.executable, "-m", "kgc", "index", str(run_dir), "--force", "--type", "hnsw",
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=_limited(table // 2))
    assert proc.returncode == 2, proc.stderr
    assert "cannot be written" in proc.stderr and "ulimit -f" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(run_dir / "index") == before and not stray(run_dir)


# ---------------------------------------------------------------- evaluate, train


def test_evaluate_keeps_results_and_ranks_of_one_evaluation(run_dir):
    cli("evaluate", run_dir, "--no-progress")
    before = {f: (run_dir / f).read_bytes() for f in ("results.json", "ranks.tsv")}
    for n in range(1, 8):
        fail_at(n)
        out = cli("evaluate", run_dir, "--no-progress", check=False)
        if out.exit_code == 0:
            break
        assert out.exit_code == 2 and "cannot be written" in out.stderr and "MRR" in out.stdout + out.stderr
        assert {f: (run_dir / f).read_bytes() for f in before} == before and not stray(run_dir)
    assert out.exit_code == 0 and n >= 3, n


def test_train_on_a_full_disk_is_one_message_then_one_way_forward(trained, tmp_path):
    """torch.save hits a real file-size limit at the first checkpoint: one message, exit 2, no temp files; the
    run (no weights yet) is then started again in place by the command every message names."""
    import yaml

    recipe = yaml.safe_load((trained / "recipe.yaml").read_text())
    recipe["train"].update(keep="all", checkpoint_every=1, max_steps=2)
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    limit = (trained / "best.pt").stat().st_size // 2  # the tokenizer fits, a checkpoint does not
    proc = subprocess.run([sys.executable, "-m", "kgc", "train", str(f), "--out", str(run), "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=_limited(limit))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot be written" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not stray(run) and not (run / "best.pt").exists()
    out = cli("train", "--resume", run, "--no-progress")
    assert "starting it again from step 0" in out.stdout + out.stderr
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "train_summary.json").is_file()


def test_a_run_that_died_young_has_one_way_forward(trained, tmp_path, tiny_bert):
    """recipe.yaml and no weights (killed before the first checkpoint): every command says the same one thing,
    and that one thing works."""
    run = tmp_path / "young"
    run.mkdir()
    shutil.copy(trained / "recipe.yaml", run / "recipe.yaml")
    shutil.copytree(trained / "backbone", run / "backbone")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    fix = f"kgc train --resume {run}"
    for args in (("predict", run, "--head", "virus", "--relation", "causes"), ("evaluate", run),
                 ("train", run / "recipe.yaml", "--out", run)):
        out = cli(*args, check=False)
        assert out.exit_code == 2 and fix in out.stderr and "before" in out.stderr and "first checkpoint" in \
            out.stderr, out
    out = cli("train", "--resume", run, "--no-progress")
    assert "starting it again from step 0" in out.stdout + out.stderr
    assert (run / "best.pt").is_file() or (run / "checkpoints" / "last.pt").is_file()
    cli("predict", run, "--head", "virus", "--relation", "causes", "--top-k", "1")


def test_resuming_a_young_run_on_a_full_disk_keeps_what_it_had(trained, tmp_path):
    """`kgc train --resume` of a run that died young, failing at each of its first writes (a disk too small for
    the backbone): one message each time, and the run keeps its recipe and backbone/ — a failed command deletes only
    what it made itself (it used to delete the run's backbone/)."""
    young = tmp_path / "young"
    young.mkdir()
    shutil.copy(trained / "recipe.yaml", young / "recipe.yaml")
    shutil.copytree(trained / "backbone", young / "backbone")
    before = snapshot(young / "backbone")
    failed = 0
    for n in range(1, 5):
        fail_at(n)
        out = cli("train", "--resume", young, "--no-progress", check=False)
        fileio._FAULTS.clear()
        if out.exit_code == 0:
            break
        failed += 1
        assert out.exit_code == 2 and "Traceback" not in out.stderr and "No space left" in out.stderr, out
        assert (young / "recipe.yaml").is_file() and snapshot(young / "backbone") == before, n
        assert not stray(young)
    assert failed >= 2
    cli("train", "--resume", young, "--no-progress")
    assert (young / "train_summary.json").is_file()


# ---------------------------------------------------------------- added entities: nothing lost (issue 51)


def test_a_damaged_meta_json_never_costs_the_added_entities(run_dir, tmp_path):
    """meta.json damaged on a run with added entities: every command names the file and `kgc index --force`
    (never "delete the folder"); --force rebuilds the index and keeps the entities."""
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    state = index_state(run_dir)
    meta = run_dir / "index" / "meta.json"
    meta.write_text(meta.read_text()[:40])  # cut
    for args in (("predict", run_dir, "--head", "new_1", "--relation", "isa"), ("index", run_dir),
                 ("evaluate", run_dir)):
        out = cli(*args, "--no-progress", check=False)
        assert out.exit_code == 2 and "Traceback" not in out.stderr, out
        assert f"{meta}: unreadable" in out.stderr and "--force" in out.stderr and "Delete" not in out.stderr
    out = cli("index", run_dir, "--force", "--no-progress")
    assert "meta.json was damaged" in out.stdout and "the 3 entities of" in out.stdout
    assert index_state(run_dir) == state  # the same rows, the same added entities
    assert not stray(run_dir)


def test_a_cut_added_list_is_restored_from_its_copy_of_record(run_dir, tmp_path):
    """index/added_entities.tsv cut mid-line (one entity gone, the next one's description cut): a rebuild restores
    the list meta.json recorded from RUN/added/<sha256>.tsv instead of rebuilding the cut one; without that copy
    it refuses, changing nothing."""
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    state = index_state(run_dir)
    listed = run_dir / "index" / "added_entities.tsv"
    whole = listed.read_bytes()
    copies = list((run_dir / "added").glob("*.tsv"))
    assert len(copies) == 1 and copies[0].read_bytes() == whole
    listed.write_bytes(whole[: len(whole) - 12])  # cut inside the last line
    out = cli("index", run_dir, "--force", "--no-progress")
    assert "is cut or unreadable; its 3 entities are restored from" in out.stdout
    assert index_state(run_dir) == state and listed.read_bytes() == whole
    # the copy gone too: refused, nothing changed
    listed.write_bytes(whole[: len(whole) - 12])
    shutil.rmtree(run_dir / "added")
    before = snapshot(run_dir / "index")
    out = cli("index", run_dir, "--force", "--no-progress", check=False)
    assert out.exit_code == 2 and "cut or unreadable" in out.stderr and "nothing was changed" in out.stderr
    assert snapshot(run_dir / "index") == before


def test_a_list_cut_at_a_line_is_restored_and_its_copy_kept(run_dir, tmp_path):
    """`head -n 2` of a list of 3 (whole lines, so it parses) used to be trusted as an edit, and the commit deleted
    the copy it named: it is a prefix of the list of record, so the 3 are restored and the copy stays."""
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    state = index_state(run_dir)
    listed = run_dir / "index" / "added_entities.tsv"
    whole = listed.read_bytes()
    copy = next((run_dir / "added").glob("*.tsv"))
    listed.write_bytes(b"".join(whole.splitlines(keepends=True)[:2]))
    for args in (("index", run_dir, "--force"), ("predict", run_dir, "--head", "new_2", "--relation", "isa")):
        out = cli(*args, "--no-progress")
        assert index_state(run_dir) == state and listed.read_bytes() == whole, out
        assert copy.read_bytes() == whole
        listed.write_bytes(b"".join(whole.splitlines(keepends=True)[:2]))
    assert "holds only the first 2 of the 3 entities recorded" in out.stderr + out.stdout, out


def test_a_list_edited_otherwise_is_refused_naming_its_copy(run_dir, tmp_path):
    """A list with an entity the record lacks (or in another order) is neither trusted nor replaced: one message
    naming both files and the two ways on; nothing changed, the copy of record kept."""
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    listed = run_dir / "index" / "added_entities.tsv"
    lines = listed.read_bytes().splitlines(keepends=True)
    listed.write_bytes(lines[1] + lines[0] + b"other_0\tother\tan entity typed by hand\n")
    before, copies = snapshot(run_dir / "index"), snapshot(run_dir / "added")
    out = cli("index", run_dir, "--force", "--no-progress", check=False)
    assert out.exit_code == 2 and "Traceback" not in out.stderr, out
    copy = run_dir / "added" / next(iter(copies))
    assert "not the list of record" in out.stderr and str(copy) in out.stderr and "--drop-added" in out.stderr
    assert snapshot(run_dir / "index") == before and snapshot(run_dir / "added") == copies


@pytest.mark.parametrize("gone", ["index folder", "added list"])
def test_a_deleted_index_keeps_its_added_entities(run_dir, tmp_path, gone):
    """`rm -r RUN/index` (or its added list alone) used to cost the added entities: the rebuild (kgc predict
    builds a missing index, as a server's watcher does) restores them from RUN/added/, which it keeps."""
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    state = index_state(run_dir)
    copies = snapshot(run_dir / "added")
    if gone == "index folder":
        shutil.rmtree(run_dir / "index")
    else:
        (run_dir / "index" / "added_entities.tsv").unlink()
    out = cli("predict", run_dir, "--head", "new_1", "--relation", "isa", "--no-progress")
    said = "(the index was deleted); its 3 added entities are restored from" if gone == "index folder" else \
        "added_entities.tsv was deleted: its 3 added entities are restored from"
    assert said in out.stderr, out
    assert index_state(run_dir) == state and snapshot(run_dir / "added") == copies
    assert not stray(run_dir)


def test_drop_added_is_the_one_way_to_remove_added_entities(run_dir, tmp_path):
    """`kgc index RUN --drop-added`: the graph's entities only, the list and every copy of record gone; a later
    --add starts a new list. Given with another option it is refused before anything is read."""
    rows = index_state(run_dir)[0]
    cli("index", run_dir, "--add", new_entities(tmp_path), "--no-progress")
    cli("index", run_dir, "--add", new_entities(tmp_path, 2, "more"), "--no-progress")
    assert len(list((run_dir / "added").glob("*.tsv"))) == 1  # the first list is a prefix of the second: pruned
    out = cli("index", run_dir, "--drop-added", "--force", "--no-progress", check=False)
    assert out.exit_code == 2 and "give it alone" in out.stderr
    out = cli("index", run_dir, "--drop-added", "--no-progress")
    assert "dropped 5 added entities; 1 copy of record removed" in out.stdout, out
    assert index_state(run_dir) == (rows, []) and not (run_dir / "added").exists()
    assert not (run_dir / "index" / "added_entities.tsv").exists()
    cli("index", run_dir, "--add", new_entities(tmp_path, 1, "again"), "--no-progress")
    assert index_state(run_dir) == (rows + 1, ["again_0"])


def test_a_refusal_by_the_space_reserve_names_the_reserve(tmp_path, monkeypatch):
    """189 bytes with 15.9 MiB free used to read "needs 189 bytes, 15.9 MiB free" (it fits, by those numbers):
    the reserve that decided is in the message, and the bytes needed count it."""
    monkeypatch.setattr(fileio.space, "free_bytes", lambda folder: fileio.SPACE_MARGIN - (100 << 10))
    with pytest.raises(DiskFull) as err:
        fileio.write_text(tmp_path / "small.json", "x" * 189)
    text = str(err.value)
    assert "kgc keeps 16.0 MiB free beside it" in text and "it needs 16.0 MiB" in text, text
    assert not (tmp_path / "small.json").exists()


def test_a_head_that_is_not_text_is_one_message(run_dir):
    """Bytes that are not UTF-8 on the command line reach Python as a lone surrogate: one message naming it, not the
    tokenizer's TypeError."""
    out = cli("predict", run_dir, "--head", b"caf\xff".decode("utf-8", "surrogateescape"), "--relation", "isa",
              "--no-progress", check=False)  # what Python's argv holds for those bytes
    assert out.exit_code == 2 and "Traceback" not in out.stderr, out
    assert "not valid text (a lone surrogate" in out.stderr and "at character 4" in out.stderr


def test_saving_the_backbone_on_a_full_disk_is_one_message_and_changes_nothing(tiny_bert, tmp_path, monkeypatch):
    """save_pretrained on a full disk raised safetensors' own error (a traceback); the run's backbone/ is now written
    beside and renamed whole, and a full disk is one DiskFull naming the file. A backbone/ already there stays."""
    from transformers import AutoTokenizer, BertModel

    from kgc.recipe import load_recipe
    from kgc.training.setup import save_backbone_files

    recipe = load_recipe(None, [f"model.backbone={tiny_bert}"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    folder = tmp_path / "run" / "backbone"
    save_backbone_files(folder, recipe, tokenizer, weights=True)
    before = snapshot(folder)

    def full(self, *args, **kwargs):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(BertModel, "save_pretrained", full)
    monkeypatch.setattr(fileio.space, "free_bytes", lambda _folder: 1 << 20)  # under LOW_SPACE: the disk is full
    for module in (fileio, fileio.atomic):  # the estimate passed (the run's copy's, each staged file's) ...
        monkeypatch.setattr(module, "ensure_space", lambda *a, **k: None)  # ... the write itself fails
    with pytest.raises(DiskFull, match=r"model\.safetensors: cannot be written .* Nothing was changed"):
        save_backbone_files(folder, recipe, tokenizer, weights=True)
    assert snapshot(folder) == before and not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_half_a_recipe_says_it_is_cut(run_dir):
    """recipe.yaml cut anywhere after its first line: every command names the file and says it is cut (its
    missing keys would otherwise take their defaults silently); a recipe of an older run (no end line promised)
    is read as before."""
    recipe = run_dir / "recipe.yaml"
    whole = recipe.read_text()
    lines = whole.splitlines(keepends=True)
    assert lines[-1] == "# end of recipe\n" and "ends with" in lines[0]
    for cut in (len(lines) // 2, len(lines) - 1):  # half of it; all but its last line
        recipe.write_text("".join(lines[:cut]))
        for args in (("predict", run_dir, "--head", "virus", "--relation", "isa"), ("evaluate", run_dir),
                     ("index", run_dir), ("train", "--resume", run_dir)):
            out = cli(*args, "--no-progress", check=False)
            assert out.exit_code == 2 and "Traceback" not in out.stderr, out
            assert f"{recipe}: cut — it ends at line {cut} without its last line" in out.stderr, out
    recipe.write_text("# kgc train --resume somewhere\n" + "".join(lines[1:-1]))  # an older run's file
    cli("predict", run_dir, "--head", "virus", "--relation", "isa", "--top-k", "1")
    recipe.write_text(whole)


# ---------------------------------------------------------------- one spelling of a name; readers sweep (issue 63)


def test_names_are_compared_in_nfc():
    """"é" as one code point (NFC) or as "e" + a combining accent (NFD) is one entity, relation and id: lookups
    find it either way (a graph spelt in NFD too), and a new entity whose id is the other form of a graph id is
    refused naming it."""
    import unicodedata

    from kgc.data.graph import KnowledgeGraph
    from kgc.linkpred.index.added import NewEntity, check_new

    nfc, nfd = (lambda s: unicodedata.normalize("NFC", s)), (lambda s: unicodedata.normalize("NFD", s))
    for form, other in ((nfc, nfd), (nfd, nfc)):
        graph = KnowledgeGraph(entities=[form("café"), "tea"], names=[form("Café Noir"), "Tea"],
                               descriptions=["", ""], relations=[form("servé_with")], relation_texts=[form("servé with")],
                               splits={"train": np.array([[0, 0, 1]])})
        assert form("café") != other("café")
        assert graph.lookup_entity(other("café")) == 0 and graph.lookup_entity(other("Café Noir")) == 0
        assert graph.lookup_entity(other("café noir")) == 0  # case folded too
        assert graph.find_relation(other("servé with")) == 0 and graph.find_relation(other("servé_with")) == 0
        with pytest.raises(KGCError, match="the same letters in another Unicode form"):
            check_new(graph, [(1, NewEntity(other("café"), "x"))], "new.tsv", "Give it a new id.")


def test_an_added_entity_is_stored_and_found_in_nfc(run_dir, tmp_path):
    """An added list in NFD is stored in NFC; its entity answers to either spelling, and a second add of the other
    form of its id is refused as already added."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "crème_brûlée")
    f = tmp_path / "nfd.tsv"
    f.write_text(f"{nfd}\t{unicodedata.normalize('NFD', 'Crème brûlée')}\ta custard dessert\n", encoding="utf-8")
    cli("index", run_dir, "--add", f, "--no-progress")
    assert index_state(run_dir)[1] == ["crème_brûlée"]  # NFC
    for spelt in ("crème_brûlée", nfd, unicodedata.normalize("NFD", "crème brûlée")):
        out = cli("predict", run_dir, "--head", spelt, "--relation", "isa", "--top-k", "1", "--json")
        assert json.loads(out.stdout)["head"] == "crème_brûlée", out
    g = tmp_path / "nfc.tsv"
    g.write_text("crème_brûlée\tanother\t\n", encoding="utf-8")
    out = cli("index", run_dir, "--add", g, "--no-progress", check=False)
    assert out.exit_code == 2 and "was already added" in out.stderr, out


def test_a_reader_sweeps_a_killed_writers_staged_files(run_dir):
    """A killed server's staged `.entities.npy.PID.….tx` (megabytes) stayed until the next --add: any command that
    opens the run removes a dead writer's staged files in index/ and added/ (a live writer's stay)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    litter = run_dir / "index" / f".entities.npy.{dead}.k2x9.tx"
    alive = run_dir / "index" / f".entities.npy.{os.getpid()}.k2x9.tx"
    for f in (litter, alive):
        f.write_bytes(b"\0" * 4096)
    cli("predict", run_dir, "--head", "virus", "--relation", "isa", "--top-k", "1")
    assert not litter.exists() and alive.exists()
    alive.unlink()


def test_a_file_named_up_to_the_file_systems_limit_is_written(tmp_path):
    """`kgc recipes copy NAME DEST` to a 250–255-byte name failed on its staged file's name (`.NAME.PID.….tmp`
    passed 255 bytes): a long name is cut in the staged name, with a digest, and a dead writer's is still swept."""
    for n in (250, 255):
        dest = tmp_path / ("r" * (n - 5) + ".yaml")
        cli("recipes", "copy", "umls_biencoder", dest)
        assert "umls" in dest.read_text()
    long = tmp_path / ("é" * 120 + ".bin")  # 245 bytes of UTF-8
    fileio.write_text(long, "x")
    dead = f".{fileio._staged_name(long.name)}.999999999.ab.tmp"
    (tmp_path / dead).write_text("x")
    assert [p.name for p in fileio.sweep_leftovers(tmp_path, long.name)] == [dead]


def test_export_on_a_full_disk_is_one_message_and_keeps_the_earlier_export(run_dir, tmp_path, monkeypatch):
    """`kgc export` on a full disk was safetensors' own SafetensorError (a traceback): any library's error for a
    full disk inside a folder being built is one DiskFull naming the folder, and an earlier export stays whole."""
    from transformers import PreTrainedModel

    out = tmp_path / "exported"
    cli("export", run_dir, out)
    before = snapshot(out)

    def full(self, *args, **kwargs):
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                           'left on device" })')  # safetensors' SafetensorError, as it reads

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    result = cli("export", run_dir, out, "--force", check=False)
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result
    assert "No space left" in result.stderr or "os error 28" in result.stderr, result.stderr
    assert str(out) in result.stderr and snapshot(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
