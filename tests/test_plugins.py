"""A package outside kgc adds a conditioner, an index type, a kind of structural model, a tracker, a dataset and a
graph format through entry points, and recipes use them all: tests/plugin_demo/ (a whole package: pyproject.toml with its entry
points) is installed by pip into a temporary folder and put on ``PYTHONPATH`` of real ``kgc`` processes. Without it the
same recipe is refused, naming what is registered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
DEMO = ROOT / "tests" / "plugin_demo"


def install(site: Path) -> Path:
    """The demo package, whole (tests/plugin_demo/pyproject.toml with its entry points), installed by pip into
    ``site`` as a user's `pip install` would (from a copy: the build leaves nothing in the checkout)."""
    source = site.parent / f"{site.name}-source"
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "kgc_demo_plugin-0.1.dist-info" / "entry_points.txt").is_file()
    return site


def kgc(*args, site: Path | None, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {}), "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + ([str(site)] if site is not None else []))}
    return subprocess.run([sys.executable, "-m", "kgc", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


KIT = ("from kgc.testing import check_conditioner, check_tracker\n"
       "from kgc.linkpred.testing import check_index_type, check_structure_kind\n"
       "check_conditioner('gated'); check_conditioner('gated', gate_scale=3.0)\n"
       "check_index_type('sq8'); check_index_type('sq8', bits=4, min_recall=0.5)\n"
       "check_structure_kind('popularity', smoothing=0.5)\n"
       "check_tracker('jsonl_copy')\n"
       "print('passed')\n")  # kgc's own checks of its families (kgc.testing), on the plugin's members


def test_a_plugins_conditioner_index_type_and_tracker_train_index_and_answer(tiny_bert, tmp_path, data_home):
    site = install(tmp_path / "site")
    recipe = tmp_path / "plugged.yaml"
    recipe.write_text(
        "name: plugged\n"
        "data: {dataset: umls, neighbor_text: false, max_tokens: 16}\n"
        f"model: {{backbone: {tiny_bert}, conditioner: gated}}\n"
        "loss: {pre_batch: 0}\n"
        "train: {batch_size: 32, max_steps: 3, lr: 1.0e-3, warmup_steps: 1, log_every: 1, num_threads: 1, "
        "trackers: [jsonl_copy, csv]}\n"
        "eval: {batch_size: 128, dev_queries: 40}\n"
        "index: {type: sq8}\n"
        "structure: {model: popularity, smoothing: 0.5, alphas: [0.0, 0.5, 1.0]}\n")
    kit = subprocess.run([sys.executable, "-c", KIT], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])})
    assert kit.returncode == 0 and kit.stdout.strip() == "passed", kit.stderr[-3000:]  # as a built-in member does
    keys = kgc("recipes", "keys", "model.conditioner", site=site, cwd=tmp_path)
    assert keys.returncode == 0 and "gated" in keys.stdout, keys.stderr
    trained = kgc("train", recipe, "--out", "run", "--no-progress", site=site, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "plugin_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # the plugin tracker got every logged row
    assert (run / "metrics.csv").is_file()  # beside a built-in one
    indexed = kgc("index", "run", "--no-progress", site=site, cwd=tmp_path)
    assert indexed.returncode == 0, indexed.stderr[-3000:]
    meta = json.loads((run / "index" / "meta.json").read_text())
    assert meta["index"]["type"] == "sq8" and meta["faiss"]["factory"] == "SQ8" and meta["entities"] == 135
    helped = kgc("index", "--help", site=site, cwd=tmp_path, env={"COLUMNS": "200"})
    assert "--bits" in helped.stdout and "sq8: bits a dimension" in helped.stdout, helped.stdout  # its own flag
    rebuilt = kgc("index", "run", "--bits", 4, "--no-progress", site=site, cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    meta = json.loads((run / "index" / "meta.json").read_text())
    assert meta["index"]["bits"] == 4 and meta["faiss"]["factory"] == "SQ4", meta
    wrong = kgc("index", "run", "--bits", 5, "--no-progress", site=site, cwd=tmp_path)
    assert wrong.returncode == 2 and "8, 6 or 4 bits" in wrong.stderr, wrong.stderr  # checked by its model
    answer = kgc("predict", "run", "--head", "virus", "--relation", "location of", "--top-k", 3, "--json",
                 site=site, cwd=tmp_path)
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert len(json.loads(answer.stdout)["predictions"]) == 3
    assert json.loads((run / "structure" / "meta.json").read_text())["params"]["smoothing"] == 0.5
    evaluated = kgc("evaluate", "run", "--no-progress", site=site, cwd=tmp_path)  # fused with the plugin's kind
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    fused = json.loads((run / "results.json").read_text())["kgc"]["structure"]
    assert fused["model"] == "popularity" and fused["alpha"] in (0.0, 0.5, 1.0), fused

    # kgc compare describes a run of the plugin's conditioner with the options it trained with (not the defaults)
    compared = kgc("compare", recipe, "--set", "model.gate_scale=3.0", "--out", "cmp", "--no-progress", site=site,
                   cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert "gated (plugin, scale=3)" in (tmp_path / "cmp" / "compare.md").read_text()

    alone = kgc("recipes", "check", recipe, "--no-data", "-q", site=None, cwd=tmp_path)  # the plugin not installed
    assert alone.returncode == 2 and "'gated'" in alone.stderr and "hadamard" in alone.stderr, alone.stderr


def test_a_plugins_dataset_and_graph_format_are_listed_fetched_checked_and_trained_on(tiny_bert, tmp_path):
    site = install(tmp_path / "site")
    home = tmp_path / "home"
    env = {"KGC_DATA_HOME": str(home)}
    listed = kgc("data", "list", site=site, cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == ["pets", "missing"] for line in listed.stdout.splitlines()), listed.stdout
    fetched = kgc("data", "fetch", "pets", "--dest", home, site=site, cwd=tmp_path, env=env)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    assert sorted(p.name for p in (home / "Pets").iterdir()) == ["dev.tsv", "entity2text.txt", "relation2text.txt",
                                                                 "test.tsv", "train.tsv"]
    checked = kgc("data", "check", "pets", site=site, cwd=tmp_path, env=env)
    assert checked.returncode == 0 and "no problems found" in checked.stdout, checked.stdout
    assert "/home/Pets (KG-BERT" in checked.stdout and checked.stdout.split("entities")[1].split()[0] == "6"
    trained = kgc("train", "recipes/umls_biencoder.yaml", "--out", tmp_path / "run", "--no-progress", "--set",
                  "data.dataset=pets", "--set", f"model.backbone={tiny_bert}", "--set", "train.max_steps=2",
                  "--set", "train.batch_size=4", "--set", "data.neighbor_text=false", site=site, cwd=ROOT, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "finished 2 steps" in trained.stdout
    from tests.test_graph_formats import ROWS, write_jsonl

    folder = write_jsonl(tmp_path / "jsonl", ROWS)  # the demo's graph format (its kgc.graph_formats entry point)
    checked = kgc("data", "check", folder, site=site, cwd=tmp_path, env=env)
    assert checked.returncode == 0 and f"{folder} (JSON lines; graph.jsonl)" in checked.stdout, checked.stdout
    assert kgc("data", "check", folder, site=None, cwd=tmp_path, env=env).returncode != 0  # not installed: no reader
    unknown = kgc("data", "fetch", "pets", "--dest", home, site=None, cwd=tmp_path, env=env)  # not installed
    assert unknown.returncode == 2 and "pets" in unknown.stderr, unknown.stderr


def test_a_plugin_that_fails_to_load_is_one_message_naming_it(tmp_path):
    site = tmp_path / "site"
    (site / "broken_plugin").mkdir(parents=True)
    (site / "broken_plugin" / "__init__.py").write_text("raise ImportError('no module named torch_geometric')\n")
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kgc.conditioners]\nbroken = broken_plugin\n")
    res = kgc("recipes", "check", "umls_biencoder", "--no-data", "-q", site=site, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "the conditioner plugin 'broken' (broken_plugin, from the package broken-plugin, entry point group " \
           "kgc.conditioners) failed to load: ImportError: no module named torch_geometric" in res.stderr


def test_a_plugin_class_registers_as_a_built_in_does(tmp_path):
    """A conditioner class named by its entry point goes through the built-ins' registration: its options are
    recorded (kgc compare describes a run with the values it trained with, not the defaults), `kgc plugins` lists
    it with its package and version, and a class whose name disagrees with its Options is one message naming the
    package (it used to install silently, after which neither name trained)."""
    site = install(tmp_path / "site")
    described = subprocess.run(
        [sys.executable, "-c", "import kgc; from kgc.compare import describe_conditioner; "
         "r = kgc.resolve_recipe({'model': {'conditioner': 'gated', 'gate_scale': 3.0}}); "
         "print(describe_conditioner(r)); from kgc.registry import CONDITIONERS; print(CONDITIONERS['gated'].options)"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}, capture_output=True,
        text=True, timeout=300)
    assert described.returncode == 0, described.stderr[-2000:]
    assert described.stdout.splitlines() == ["gated (plugin, scale=3)", "('gate_scale',)"]
    listed = kgc("plugins", site=site, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert rows["gated"] == "kgc-demo-plugin 0.1" and rows["sq8"] == "kgc-demo-plugin 0.1"
    assert rows["jsonl_copy"] == "kgc-demo-plugin 0.1" and rows["hadamard"] == "kgc" and rows["pets"] == "kgc-demo-plugin 0.1"
    keys = kgc("recipes", "keys", "train.trackers", site=site, cwd=tmp_path)  # the tracker help: what is installed
    assert "jsonl_copy (kgc-demo-plugin 0.1)" in keys.stdout and "csv (kgc)" in keys.stdout, keys.stdout
    as_json = json.loads(kgc("plugins", "--json", site=site, cwd=tmp_path).stdout)
    assert {"family": "conditioner", "key": "model.conditioner", "name": "gated", "source": "kgc-demo-plugin 0.1",
            "entry_points": "kgc.conditioners"} in as_json

    bad = tmp_path / "bad"
    (bad / "misnamed_plugin").mkdir(parents=True)
    (bad / "misnamed_plugin" / "__init__.py").write_text(
        "from typing import Literal\nfrom pydantic import Field\n"
        "from kgc.conditioning.base import ConditionerOptions\nfrom kgc.conditioning.pooled import Hadamard\n"
        "class FilmOptions(ConditionerOptions):\n    conditioner: Literal['film'] = Field('film')\n"
        "class Film(Hadamard):\n    name = 'FiLM'\n    Options = FilmOptions\n")
    info = bad / "misnamed_plugin-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: misnamed-plugin\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[kgc.conditioners]\nfilm = misnamed_plugin:Film\n")
    res = kgc("recipes", "check", "umls_biencoder", "--no-data", "-q", site=bad, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert ("the conditioner plugin 'film' (misnamed_plugin:Film, from the package misnamed-plugin 2.0) cannot be "
            "registered: Film.Options declares conditioner 'film', not 'FiLM'") in res.stderr, res.stderr


@pytest.mark.parametrize("body, said", [("raise ImportError('no module named torch_geometric')\n",
                                         "failed to load: ImportError: no module named torch_geometric"),
                                        ("raise SystemExit(3)\n", "failed to load: SystemExit: 3")])
def test_a_task_plugin_that_fails_on_import_leaves_help_working(tmp_path, body, said):
    """A kgc.tasks plugin that raises (or exits) on import: `kgc --help` and a command's --help still answer; a
    command that uses the tasks says the failure in one message naming the package (an exit used to end `kgc
    predict` silently)."""
    site = tmp_path / "site"
    (site / "broken_task").mkdir(parents=True)
    (site / "broken_task" / "__init__.py").write_text(body)
    info = site / "broken_task-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-task\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kgc.tasks]\nbroken = broken_task\n")
    helped = kgc("--help", site=site, cwd=tmp_path)
    assert helped.returncode == 0 and "train" in helped.stdout and "bench" in helped.stdout, helped.stderr
    assert kgc("bench", "--help", site=site, cwd=tmp_path).returncode == 0
    res = kgc("recipes", "check", "umls_biencoder", "--no-data", "-q", site=site, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"the task plugin 'broken' (broken_task, from the package broken-task, entry point group kgc.tasks) {said}" \
        in res.stderr, res.stderr
