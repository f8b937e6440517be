"""The fault matrix: every command that writes a run, failed at each of its writes in turn.

Rows: the commands — ``kgc train`` (a new run), ``kgc train --resume`` of a run that died young, ``kgc index``
(a first build), ``kgc index --add``, ``kgc evaluate``, ``kgc tune`` and the service's ``POST /entities`` (507, the
index as it was, the server ready). Columns: a full disk (ENOSPC) at its N-th write, for each
N (:func:`kgc.fileio.fault`, ``KGC_FAULT=write:N``), and a kill (SIGKILL, ``KGC_FAULT=kill:N``) at its N-th write
in a real process. Each cell asserts: exit status 2 and one message, no traceback (ENOSPC); the run as it was
before the command, or a state the command's own message names the way out of; then the next command — the same
one again, without the fault — succeeds and leaves no temporary file anywhere (a killed process's leftovers are
swept by the next process that opens the same place). Damage to each file a command wrote is the sweep of
``tests/test_run_errors.py`` (truncated, flipped, emptied: a clear error or the undamaged answer), and of
``tests/test_durability.py`` for the index and the recipe; a study database SQLite cannot write is in
``tests/test_tune.py``.

The suite runs a reduced sweep (the middle write of each command, EIO at each one's last rename; a kill in the
middle of an add); ``make test-faults`` runs every write and every rename of every command and a kill at each
(``KGC_FAULT_SWEEP=full``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

import kgc
from kgc import fileio
from tests.conftest import ROOT, cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)

FULL = os.environ.get("KGC_FAULT_SWEEP") == "full"
STAGED = (".tmp", ".tx", ".partial", ".old", ".replace.json")


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders (a staged write's) and journals anywhere under ``folder``."""
    return sorted(str(f) for f in folder.rglob("*") if f.name.endswith(STAGED) or f.name == fileio.JOURNAL)


def snapshot(folder: Path) -> dict[str, bytes]:
    """The published files under ``folder`` (staged ones and the lock's aside: a kill leaves the former, the next
    writer sweeps them; they are checked by :func:`leftovers`)."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name not in (".lock", ".lock.json") and not f.name.endswith(STAGED)
            and f.name != fileio.JOURNAL and not any(p.name.endswith(STAGED) for p in f.relative_to(folder).parents)}


@dataclass
class Command:
    name: str
    prepare: Callable[[Path], list]  # a fresh place in tmp -> the command's arguments
    before: Callable[[Path], object]  # the state the command must leave when it fails
    after_failure: Callable[[Path, object], None]  # asserts what a failed command left
    done: Callable[[Path], None]  # asserts the state after the next command (the same, no fault)


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory, data_home) -> Path:
    out = tmp_path_factory.mktemp("matrix") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=2, echo=None)
    return out


@pytest.fixture(scope="module")
def commands(trained, tiny_bert) -> dict[str, Command]:
    recipe = yaml.safe_load((trained / "recipe.yaml").read_text())
    recipe["train"].update(max_steps=2, keep="all", checkpoint_every=1)

    def new_run(tmp: Path) -> list:
        f = tmp / "recipe.yaml.in"
        f.write_text(yaml.safe_dump(recipe))
        return ["train", f, "--out", tmp / "run", "--no-progress"]

    def young(tmp: Path) -> list:
        run = tmp / "run"
        run.mkdir()
        shutil.copy(trained / "recipe.yaml", run / "recipe.yaml")
        shutil.copytree(trained / "backbone", run / "backbone")
        return ["train", "--resume", run, "--no-progress"]

    def copy(tmp: Path, index: bool) -> Path:
        run = tmp / "run"
        shutil.copytree(trained, run)
        if index:
            cli("index", run, "--no-progress")
        return run

    def added(tmp: Path) -> list:
        run = copy(tmp, True)
        (tmp / "new.tsv").write_text("".join(f"m{i}\tmatrix thing {i}\ta thing of the matrix\n" for i in range(3)))
        return ["index", run, "--add", tmp / "new.tsv", "--no-progress"]

    def no_run_or_young(tmp: Path, _before) -> None:
        """No run; a run that died young (a recipe, no weights); or one with a whole last checkpoint to resume."""
        from kgc.training.run import RunDir, load_checkpoint

        run = tmp / "run"
        if run.exists() and (run / "recipe.yaml").exists() and not RunDir.died_young(run):
            assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] >= 1

    def same(folder: str):
        return lambda tmp, before: _same(tmp / "run" / folder, before)

    def study(tmp: Path) -> list:
        from tests.test_tune import write_tune_recipe

        f = write_tune_recipe(tmp / "umls_matrix.yaml", tiny_bert, pruner="none",
                              space={"train.lr": {"low": 1e-4, "high": 3e-3, "log": True}}, budget="4 steps")
        return ["tune", f, "--out", tmp / "study", "--trials", "1"]

    def study_kept(tmp: Path, _before) -> None:  # whatever the study recorded, it still opens
        if (tmp / "study" / "study.db").exists():
            import optuna

            optuna.load_study(study_name=None, storage=f"sqlite:///{tmp / 'study' / 'study.db'}")

    def trained_whole(tmp: Path) -> None:
        run = tmp / "run"
        assert (run / "train_summary.json").is_file()
        assert (run / "best.pt").is_file() or (run / "checkpoints" / "last.pt").is_file()

    def forced(tmp: Path) -> list:
        return ["index", copy(tmp, True), "--force", "--no-progress"]

    def restructure(tmp: Path) -> list:  # a second structural model over the first: structure/ replaced whole
        run = copy(tmp, False)
        cli("structure", run, "--set", "structure.model=rules", "--no-progress")
        return ["structure", run, "--set", "structure.model=rules", "--set", "structure.rule_length=1",
                "--no-progress"]

    def structure_whole(tmp: Path) -> None:  # the next evaluation fuses it (never the text model alone, unsaid)
        out = cli("evaluate", tmp / "run", "--no-progress")
        assert "structure" in out.stdout.lower() and (tmp / "run" / "structure" / "meta.json").is_file(), out

    def reexport(tmp: Path) -> list:
        run = copy(tmp, False)
        cli("export", run, tmp / "export")
        return ["export", run, tmp / "export", "--force"]

    def exported(tmp: Path) -> None:
        assert (tmp / "export" / "kgc.json").is_file()

    def recipe_copy(tmp: Path) -> list:
        (tmp / "mine.yaml").write_text("# an earlier copy\n")
        return ["recipes", "copy", "umls_biencoder", tmp / "mine.yaml", "--force"]

    def recipe_written(tmp: Path) -> None:
        assert "umls" in (tmp / "mine.yaml").read_text()

    return {c.name: c for c in [
        Command("train", new_run, lambda tmp: None, no_run_or_young, trained_whole),
        Command("force", forced, lambda tmp: snapshot(tmp / "run" / "index"), same("index"),
                lambda tmp: _index_rows(tmp / "run", 135)),
        Command("structure", restructure, lambda tmp: snapshot(tmp / "run" / "structure"), same("structure"),
                structure_whole),
        Command("export", reexport, lambda tmp: snapshot(tmp / "export"),
                lambda tmp, before: _same(tmp / "export", before), exported),
        Command("recipes-copy", recipe_copy, lambda tmp: (tmp / "mine.yaml").read_bytes(),
                lambda tmp, before: (tmp / "mine.yaml").read_bytes() == before or pytest.fail("changed"),
                recipe_written),
        Command("resume-young", young, lambda tmp: snapshot(tmp / "run" / "backbone"), same("backbone"),
                trained_whole),
        Command("index", lambda tmp: ["index", copy(tmp, False), "--no-progress"], lambda tmp: None,
                lambda tmp, _: _no_index(tmp / "run"), lambda tmp: _index_rows(tmp / "run", 135)),
        Command("add", added, lambda tmp: snapshot(tmp / "run" / "index"), same("index"),
                lambda tmp: _index_rows(tmp / "run", 138)),
        Command("tune", study, lambda tmp: None, study_kept,
                lambda tmp: (tmp / "study" / "best.yaml").is_file() or pytest.fail("no best.yaml")),
        Command("evaluate", lambda tmp: ["evaluate", copy(tmp, True), "--no-progress"],
                lambda tmp: snapshot(tmp / "run"), same(""),
                lambda tmp: (tmp / "run" / "results.json").is_file() or pytest.fail("no results.json")),
    ]}


def _same(folder: Path, before) -> None:
    assert snapshot(folder) == before


def _no_index(run: Path) -> None:
    assert not (run / "index" / "meta.json").exists()


def _index_rows(run: Path, n: int) -> None:
    import json

    meta = json.loads((run / "index" / "meta.json").read_text())
    assert meta["entities"] == n, meta["entities"]


def count_of(command: Command, tmp: Path, counter) -> int:
    """How many writes (renames) the command makes in a clean run of it, here: the sweep's points."""
    tmp.mkdir()
    args = command.prepare(tmp)
    start = counter()
    cli(*args)
    return counter() - start


def writes_of(command: Command, tmp: Path) -> int:
    return count_of(command, tmp, fileio.writes_so_far)


def one_fault_then_again(command: Command, place: Path, fault: str, n: int, where: str, says: tuple[str, ...], *,
                         strict: bool) -> None:
    """One cell: the command with ``fault`` at its n-th point fails with one message (one of ``says`` in it), no
    traceback, what it replaces as before and nothing staged left (``strict``; else a failure past a commit point
    may leave what the next reader completes); the same command again succeeds and nothing staged is left."""
    place.mkdir()
    args = command.prepare(place)
    before = command.before(place)
    fileio._FAULTS.clear()
    fileio._FAULTS[fault] = n
    try:
        out = cli(*args, check=False)
    finally:
        fileio._FAULTS.clear()
    assert out.exit_code == 2, (where, out)
    assert out.stderr.count("error:") == 1 and any(s in out.stderr for s in says), (where, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout, where
    if strict or "committed" not in out.stderr:  # past a commit point the next reader completes it instead
        command.after_failure(place, before)
    if strict:
        assert not leftovers(place), (where, leftovers(place))
    again = cli(*_again(args, place), check=False)
    assert again.exit_code == 0, (where, again)
    command.done(place)
    assert not leftovers(place), (where, leftovers(place))


def points(n: int) -> list[int]:
    return list(range(1, n + 1)) if FULL else [(n + 1) // 2]


NAMES = ["train", "resume-young", "index", "add", "evaluate", "tune"]


@pytest.mark.parametrize("name", NAMES)
def test_a_full_disk_at_each_write(commands, name, tmp_path):
    command = commands[name]
    total = writes_of(command, tmp_path / "count")
    assert total >= 1
    for n in points(total):
        one_fault_then_again(command, tmp_path / f"at{n}", "write", n, f"{name}, ENOSPC at write {n} of {total}",
                             ("No space left",), strict=True)


def _again(args: list, place: Path) -> list:
    """The next command after a failure: the same one — or, for a new run that died young (a recipe, no
    weights), what every message names: `kgc train --resume RUN`."""
    if args[0] == "train" and args[1] != "--resume" and (place / "run" / "recipe.yaml").exists():
        return ["train", "--resume", place / "run", "--no-progress"]
    return args


@pytest.mark.parametrize("name", [n for n in NAMES if n != "tune"] if FULL else ["add"])
def test_a_kill_at_each_write(commands, name, tmp_path):
    command = commands[name]
    total = writes_of(command, tmp_path / "count")
    for n in (points(total) if FULL else [(total + 1) // 2]):
        place = tmp_path / f"at{n}"
        place.mkdir()
        args = command.prepare(place)
        before = command.before(place)
        env = {**os.environ, "KGC_FAULT": f"kill:{n}", "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", "kgc", *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        where = f"{name}, SIGKILL at write {n} of {total}"
        assert proc.returncode == -9, (where, proc.returncode, proc.stderr[-2000:])
        if name != "train" or not (place / "run" / "recipe.yaml").exists():
            command.after_failure(place, before)
        again = subprocess.run([sys.executable, "-m", "kgc", *map(str, _again(args, place))], cwd=ROOT,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        assert again.returncode == 0, (where, again.stderr[-2000:])
        command.done(place)
        assert not leftovers(place), (where, leftovers(place))


def test_a_dead_writers_leftovers_are_swept_and_a_live_ones_kept(tmp_path):
    """The names of staged files carry their writer's pid: the next writer of the same place removes a dead
    one's, never a live one's, and never the staged files a pending journal still needs."""
    dead, live = 999_999_999, os.getpid()
    names = [f".best.pt.{dead}.ab_1.tmp", f".backbone.{dead}.x9.partial", f".index.{dead}.q.old",
             f".best.pt.{live}.cd.tmp", ".best.pt.nopid.tmp", "best.pt"]
    for n in names:
        (tmp_path / n).mkdir() if n.endswith((".partial", ".old")) else (tmp_path / n).write_text("x")
    gone = fileio.sweep_leftovers(tmp_path)
    assert sorted(p.name for p in gone) == sorted(names[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[3:])
    journal = tmp_path / "j"
    journal.mkdir()
    (journal / f".meta.json.{dead}.zz.tx").write_text("new")
    (journal / fileio.JOURNAL).write_text('{"replace": [[".meta.json.999999999.zz.tx", "meta.json"]]}')
    fileio.sweep_leftovers(journal)  # the commit is completed first, then nothing is left to sweep
    assert (journal / "meta.json").read_text() == "new" and sorted(p.name for p in journal.iterdir()) == ["meta.json"]


def test_a_folder_is_swept_at_a_process_first_write_into_it_not_at_every_write(tmp_path, monkeypatch):
    """A staged write sweeps its folder the first time this process writes there (a dead writer's leftover goes),
    then only checks for a pending journal: a thousand files written into one cache folder scan it once, not a
    thousand times (quadratic)."""
    dead = 999_999_999
    (tmp_path / f".a.{dead}.ab.tmp").write_text("x")
    scans: list[str] = []
    real = os.scandir
    monkeypatch.setattr(fileio.staging.os, "scandir", lambda p=".": scans.append(str(p)) or real(p))
    for i in range(50):
        fileio.write_text(tmp_path / f"f{i}.txt", str(i))
    assert scans.count(str(tmp_path)) == 1 and not (tmp_path / f".a.{dead}.ab.tmp").exists()
    (tmp_path / f".b.{dead}.cd.tmp").write_text("x")  # left by a writer that died since: the next process sweeps
    (tmp_path / f".c.{dead}.ef.tx").write_text("new")
    (tmp_path / fileio.JOURNAL).write_text(f'{{"replace": [[".c.{dead}.ef.tx", "c"]]}}')
    fileio.write_text(tmp_path / "g.txt", "g")  # a pending journal is completed before any write, every time
    assert (tmp_path / "c").read_text() == "new" and not (tmp_path / fileio.JOURNAL).exists()


def test_a_full_disk_at_each_write_of_a_served_add(trained, tmp_path):
    """`POST /entities` (the service's add) failed at each of its writes: 507 and one message, the index as it
    was, the server ready; the same request again is applied."""
    from fastapi.testclient import TestClient

    from tests.test_serve import ready

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    cli("index", run_dir, "--no-progress")
    body = {"entities": [{"id": f"s{i}", "name": f"served thing {i}"} for i in range(3)]}
    with TestClient(kgc.api.app(kgc.load(run_dir, echo=None), max_wait_ms=1, watch_seconds=0)) as client:
        ready(client)
        probe = tmp_path / "probe"
        shutil.copytree(run_dir, probe)
        with TestClient(kgc.api.app(kgc.load(probe, echo=None), max_wait_ms=1, watch_seconds=0)) as counter:
            ready(counter)
            start = fileio.writes_so_far()
            assert counter.post("/entities", json=body).status_code == 200
            total = fileio.writes_so_far() - start
        before = snapshot(run_dir / "index")
        for n in points(total):
            fileio._FAULTS["write"] = n
            try:
                r = client.post("/entities", json=body)
            finally:
                fileio._FAULTS.clear()
            assert r.status_code == 507 and "Nothing was changed" in r.json()["detail"], (n, total, r.text)
            assert snapshot(run_dir / "index") == before and not leftovers(run_dir), n
            assert client.get("/health").json()["status"] == "ready"
        r = client.post("/entities", json=body)
        assert r.status_code == 200 and r.json()["added"] == 3
    assert not leftovers(run_dir)


# ---------------------------------------------------------------- every rename (issue 63)

RENAMED = ["train", "index", "force", "add", "evaluate", "structure", "export", "recipes-copy"]


def renames_of(command: Command, tmp: Path) -> int:
    """How many renames that publish a file or folder the command makes (a clean run of it): the points."""
    return count_of(command, tmp, fileio.renames_so_far)


@pytest.mark.parametrize("name", RENAMED)
def test_an_io_error_at_each_rename(commands, name, tmp_path):
    """EIO at the N-th rename (a file published, a folder put in place or moved aside, a commit's renames): one
    message, no traceback; what the command replaces is as before (or completed, past a commit point, by the
    next reader); the same command again succeeds and nothing staged is left."""
    command = commands[name]
    total = renames_of(command, tmp_path / "count")
    assert total >= 1
    for n in (points(total) if FULL else [total]):  # make test: the last rename of each row (what publishes)
        one_fault_then_again(command, tmp_path / f"at{n}", "rename-eio", n, f"{name}, EIO at rename {n} of {total}",
                             ("I/O error", "Input/output error"), strict=False)


@pytest.mark.parametrize("name", RENAMED if FULL else ["structure"])
def test_a_kill_at_each_rename(commands, name, tmp_path):
    """SIGKILL at the N-th rename, in a real process: the next command completes or rolls back what was left
    half-renamed (a folder replace: its journal puts the new folder in place) and succeeds; nothing is left."""
    command = commands[name]
    total = renames_of(command, tmp_path / "count")
    for n in (points(total) if FULL else [total - 1, total]):
        place = tmp_path / f"at{n}"
        place.mkdir()
        args = command.prepare(place)
        env = {**os.environ, "KGC_FAULT": f"rename:{n}", "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", "kgc", *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        where = f"{name}, SIGKILL at rename {n} of {total}"
        assert proc.returncode == -9, (where, proc.returncode, proc.stderr[-2000:])
        if name == "structure":  # the data-loss case: the next evaluation used to sweep both hidden copies
            command.done(place)
        again = subprocess.run([sys.executable, "-m", "kgc", *map(str, _again(args, place))], cwd=ROOT,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        assert again.returncode == 0, (where, again.stderr[-2000:])
        command.done(place)
        assert not leftovers(place), (where, leftovers(place))


def test_a_folder_replace_killed_between_its_renames_is_completed(tmp_path):
    """atomic_dir(replace=True) killed after moving the old folder aside and before putting the new one in: the
    next sweep of the parent puts the new folder in place and removes the old (it used to delete both)."""
    dead = 999_999_999
    target = tmp_path / "structure"
    new, old = tmp_path / f".structure.{dead}.a1.partial", tmp_path / f".structure.{dead}.b2.old"
    new.mkdir()
    (new / "meta.json").write_text("new")
    old.mkdir()
    (old / "structure").mkdir()
    (old / "structure" / "meta.json").write_text("old")
    (tmp_path / f".structure.{dead}.replace.json").write_text(
        '{"target": "structure", "new": "%s", "old": "%s"}' % (new.name, old.name))
    fileio.sweep_leftovers(tmp_path)
    assert (target / "meta.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["structure"]
    # killed before the old one moved: the same
    new.mkdir()
    (new / "meta.json").write_text("newer")
    old.mkdir()
    (tmp_path / f".structure.{dead}.replace.json").write_text(
        '{"target": "structure", "new": "%s", "old": "%s"}' % (new.name, old.name))
    fileio.sweep_leftovers(tmp_path)
    assert (target / "meta.json").read_text() == "newer" and sorted(p.name for p in tmp_path.iterdir()) == ["structure"]
