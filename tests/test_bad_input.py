"""Bad input ends in one clear message naming the file/line or key and the fix."""

from __future__ import annotations

import pytest

from kgc.data.formats import read_graph
from kgc.errors import KGCError
from kgc.recipe import load_recipe
from tests.conftest import cli


def test_malformed_tsv_line_names_file_and_line(toy_dir):
    with open(toy_dir / "train.tsv", "a") as fh:
        fh.write("e_dog\t_hypernym\n")
    with pytest.raises(KGCError, match=r"train\.tsv:7: expected 3 tab-separated fields"):
        read_graph(toy_dir)


def test_unknown_entity_names_file_and_line(toy_dir):
    (toy_dir / "test.tsv").write_text("e_dog\t_hypernym\te_animal\ne_wolf\t_hypernym\te_animal\n")
    with pytest.raises(KGCError, match=r"test\.tsv:2: unknown entity 'e_wolf'"):
        read_graph(toy_dir)


def test_bad_recipe_key_lists_valid_ones(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 1e-4\n  epochz: 3\n")
    with pytest.raises(KGCError, match=r"unknown key 'train.epochz'.*train.epochs"):
        load_recipe(recipe)
    with pytest.raises(KGCError, match=r"--set train.lrr: unknown recipe key.*train.lr"):
        load_recipe(None, ["train.lrr=1"])
    with pytest.raises(KGCError, match=r"'train.batch_size'"):
        load_recipe(None, ["train.batch_size=-3"])
    r = load_recipe(None, ["train.lr=3e-5", "loss.pre_batch=2", "eval.rerank.enabled=true"])
    assert (r.train.lr, r.loss.pre_batch, r.eval.rerank.enabled) == (3e-5, 2, True)


def test_cli_reports_errors_without_traceback(tmp_path, monkeypatch):
    """A bad recipe key: exit 2 and the one message on stderr, nothing on stdout, no run directory.
    (tests/test_cli_smoke.py checks in a real process that kgc.cli.main prints no traceback.)"""
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  conditionerr: biencoder\n")
    res = cli("train", recipe, check=False)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and "unknown key 'model.conditionerr'" in res.stderr
    assert "model.conditioner" in res.stderr  # the valid key is named
    assert "Traceback" not in res.stderr and not (tmp_path / "runs").exists()


def test_atomic_dir_publishes_whole_folders_only(tmp_path, monkeypatch):
    """export, inductive-split, data fetch and wikidata5m build their folder beside the target and rename it."""
    import os

    from kgc.fileio import atomic_dir, write_text

    mask = os.umask(0)
    os.umask(mask)
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as d:
            write_text(d / "a.txt", "x")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temp folder left
    target.mkdir()  # an empty folder is taken over
    with atomic_dir(target) as d:
        write_text(d / "a.txt", "one")
    assert (target / "a.txt").read_text() == "one"
    assert target.stat().st_mode & 0o777 == 0o777 & ~mask  # a plain mkdir's mode, not mkdtemp's 0700
    assert (target / "a.txt").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600
    with pytest.raises(OSError):  # a non-empty folder is replaced only when asked
        with atomic_dir(target) as d:
            write_text(d / "b.txt", "two")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    with atomic_dir(target, replace=True) as d:
        write_text(d / "b.txt", "two")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]

    def refuse(src, dst):
        raise OSError("rename refused")

    with pytest.raises(OSError, match="rename refused"):
        with atomic_dir(target, replace=True) as d:
            write_text(d / "c.txt", "three")
            monkeypatch.setattr(os, "replace", refuse)  # the final rename fails: the old folder comes back
    monkeypatch.undo()
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"] and [p.name for p in tmp_path.iterdir()] == ["out"]
