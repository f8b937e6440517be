"""``kgc bench scale``: the growth exponents (hand-computed), a stage per process (time, its own peak RSS, bytes
written), a failing / killed / timed-out stage reported with its last lines and the stages that need it skipped (short
Python processes stand in for the stages), the graph stage for real through the CLI at two sizes, and the tokenise
stage's timing in process. The whole path at a tiny size costs minutes of process starts (each ``kgc`` process
imports torch: 3 to 5 s here), beyond this suite's budget: docs/scale.md has the command."""

from __future__ import annotations

import json
import math
import random
import sys

import pytest

from kgc.linkpred.bench import scale, workload
from tests.conftest import cli

# ---------------------------------------------------------------- the pure parts


def test_growth_exponent_by_hand():
    assert workload.growth_exponent(50_000, 10.0, 500_000, 100.0) == 1.0  # 10× entities, 10× time: linear
    assert workload.growth_exponent(50_000, 10.0, 500_000, 1000.0) == 2.0  # 100× time: quadratic
    assert workload.growth_exponent(50_000, 7.0, 500_000, 7.0) == 0.0  # constant
    # 1 GiB -> 2 GiB over 10x entities: log 2 / log 10
    assert workload.growth_exponent(50_000, 2 ** 30, 500_000, 2 ** 31) == round(math.log(2) / math.log(10), 2) == 0.3
    assert workload.growth_exponent(500_000, 30.0, 5_000_000, 60.0) == 0.3
    for bad in ((50_000, None, 500_000, 1.0), (50_000, 0.0, 500_000, 1.0), (50_000, 1.0, 50_000, 2.0)):
        assert workload.growth_exponent(*bad) is None


def _row(name, status="ok", seconds=None, rss=None):
    return {"name": name, "status": status, "seconds": seconds, "peak_rss_bytes": rss}


def test_add_growth_between_consecutive_sizes():
    sizes = [{"entities": 50_000, "stages": [_row("index", seconds=20.0, rss=500 * 2 ** 20),
                                             _row("serve", seconds=10.0, rss=400 * 2 ** 20)]},
             {"entities": 500_000, "stages": [_row("index", seconds=200.0, rss=1000 * 2 ** 20),
                                              _row("serve", "failed", seconds=3.0, rss=900 * 2 ** 20)]},
             {"entities": 5_000_000, "stages": [_row("index", seconds=6000.0, rss=1000 * 2 ** 20),
                                                _row("serve", seconds=1000.0, rss=4000 * 2 ** 20)]}]
    workload.add_growth(sizes)
    first, second, third = ({r["name"]: r for r in s["stages"]} for s in sizes)
    assert first["index"]["time_exponent"] is None and first["index"]["memory_exponent"] is None
    assert second["index"]["time_exponent"] == 1.0
    assert second["index"]["memory_exponent"] == round(math.log(2) / math.log(10), 2)
    assert second["index"]["marginal_rss_bytes_per_entity"] == round(500 * 2 ** 20 / 450_000, 1)
    assert third["index"]["time_exponent"] == round(math.log(30) / math.log(10), 2) == 1.48
    assert third["index"]["memory_exponent"] == 0.0
    assert second["serve"]["time_exponent"] is None  # failed at 500k: no growth there ...
    assert third["serve"]["time_exponent"] == 1.0  # ... and 5M grows from the last size it completed at (50k)
    assert third["serve"]["memory_exponent"] == 0.5


def test_misspellings_and_requests(tmp_path):
    rng = random.Random(0)
    for name in ("Lisbon", "Marble Harbour", "ab", "Old Oak Tree"):
        typo = workload.misspelt(name, rng)
        assert typo != name and abs(len(typo) - len(name)) <= 1
    graph = tmp_path / "g"
    graph.mkdir()
    (graph / "entity2text.txt").write_text("".join(f"E{i}\tName {i}, a thing number {i}\n" for i in range(200)))
    (graph / "relation2text.txt").write_text("R1\tpart of\nR2\tnear\n")
    reqs = workload.head_requests(graph, 40)
    assert len(reqs) == 40 and sum(r["kind"] == "typo" for r in reqs) == 10
    assert all(r["head"].startswith("Name ") for r in reqs if r["kind"] == "name")
    assert {r["relation"] for r in reqs} <= {"R1", "R2"}
    out = workload.write_added(graph, tmp_path / "added.tsv", 30)
    lines = out.read_text().splitlines()
    assert len(lines) == 30 and all(len(x.split("\t")) == 3 for x in lines)
    assert lines[0].startswith("kgc-scale-added-0\tName ") and len({x.split("\t")[0] for x in lines}) == 30


# ---------------------------------------------------------------- stages as processes (cheap stand-ins)


FAKE = {  # each stage a short python process: what it does decides what the bench must report
    "synth": "import os; os.makedirs('graph', exist_ok=True); open('graph/g.bin', 'wb').write(b'x' * 300_000)",
    "check": "pass",
    "tokenise": "import json; b = bytearray(50 * 2**20); print(json.dumps({'read_seconds': 0.1, "
                "'tokenise_seconds': 0.2}))",
    "train": "import os; os.makedirs('run', exist_ok=True); open('run/best.pt', 'wb').write(b'x' * 100_000)",
    "index": "import sys; print('indexing'); sys.stderr.write('error: out of luck\\n'); sys.exit(3)",
    "evaluate": "pass", "serve": "pass", "add": "pass",
}


def _fake(monkeypatch, programs):
    monkeypatch.setattr(scale._Size, "argv", lambda self, stage: [sys.executable, "-c", programs[stage]])
    monkeypatch.setattr(scale._Size, "prepare", lambda self, stage: None)


def test_a_failing_stage_is_reported_and_its_dependants_skipped(monkeypatch, tmp_path):
    _fake(monkeypatch, FAKE)
    lines: list[str] = []
    result = scale.bench_scale(entities=[1000], work=tmp_path / "w", keep=True, model="none", echo=lines.append)
    (size,) = result["sizes"]
    rows = {r["name"]: r for r in size["stages"]}
    assert [r["name"] for r in size["stages"]] == list(scale.STAGE_NAMES)
    for name in ("synth", "check", "tokenise", "train"):
        r = rows[name]
        assert r["status"] == "ok" and r["seconds"] > 0 and r["peak_rss_bytes"] > 0, r
        assert r["rss_bytes_per_entity"] == round(r["peak_rss_bytes"] / 1000, 1)
    assert rows["synth"]["disk_bytes"] >= 300_000 and rows["synth"]["disk_bytes_per_entity"] >= 300
    assert rows["train"]["disk_bytes"] >= 100_000 and rows["check"]["disk_bytes"] == 0
    # each stage's own peak, not the bench's (pytest here: hundreds of MB, which a forked child would report)
    assert rows["check"]["peak_rss_bytes"] < 60 * 2 ** 20
    assert rows["tokenise"]["peak_rss_bytes"] > rows["check"]["peak_rss_bytes"] + 40 * 2 ** 20  # its 50 MiB
    assert rows["tokenise"]["detail"] == {"read_seconds": 0.1, "tokenise_seconds": 0.2}
    index = rows["index"]
    assert index["status"] == "failed" and index["error"].startswith("exit 3; its last lines:")
    assert "error: out of luck" in index["error"] and "indexing" in index["error"]
    for name in ("evaluate", "serve", "add"):
        assert rows[name]["status"] == "skipped" and rows[name]["error"] == "needs index (failed)"
    assert size["failed"] == ["index"]
    assert any("index: failed" in x and "out of luck" in x for x in lines)
    table = scale.scale_table(result)
    assert "| 1,000 | index | failed |" in table and "| 1,000 | serve | skipped |" in table
    assert (tmp_path / "w" / "n1000" / "logs" / "index.log").read_text().count("out of luck") == 1


def test_killed_and_timed_out_stages(monkeypatch, tmp_path):
    programs = dict.fromkeys(scale.STAGE_NAMES, "pass")
    programs["check"] = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"  # what the OOM killer does
    programs["tokenise"] = "import time; b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"
    programs["train"] = "import time; time.sleep(60)"
    _fake(monkeypatch, programs)
    result = scale.bench_scale(entities=[500], work=tmp_path / "w", model="none", stage_timeout=6,
                               max_memory_gb=0.3, stages=["synth", "check", "tokenise", "train", "index"],
                               echo=lambda _: None)
    rows = {r["name"]: r for r in result["sizes"][0]["stages"]}
    assert rows["check"]["status"] == "failed" and "killed by SIGKILL (out of memory?)" in rows["check"]["error"]
    assert rows["tokenise"]["status"] == "failed" and rows["tokenise"]["seconds"] < 6
    assert "resident memory passed --max-memory (0.3 GB)" in rows["tokenise"]["error"]
    assert rows["train"]["status"] == "timeout" and 6 <= rows["train"]["seconds"] < 20
    assert rows["index"]["error"] == "needs train (timeout)"
    assert rows["evaluate"]["error"] == "not asked (--stages)"
    assert not (tmp_path / "w" / "n500").exists()  # not --keep: the size's folder is gone


def test_bad_options():
    from kgc.errors import KGCError

    with pytest.raises(KGCError, match="--stages nope: unknown stage"):
        scale.bench_scale(entities=[100], stages=["nope"])
    with pytest.raises(KGCError, match="--entities"):
        scale.bench_scale(entities=[5])


# ---------------------------------------------------------------- real stages


def test_real_graph_stage_through_the_cli(tmp_path):
    out = tmp_path / "scale.json"
    res = cli("bench", "scale", "--entities", "300,600", "--queries", "20", "--stages", "synth", "--model", "none",
              "--work", tmp_path / "w", "--keep", "--json", out, "--plot", tmp_path / "scale.png")
    result = json.loads(out.read_text())
    small, large = ({r["name"]: r for r in s["stages"]} for s in result["sizes"])
    for rows in (small, large):
        assert rows["synth"]["status"] == "ok" and rows["synth"]["seconds"] > 0
        assert rows["synth"]["peak_rss_bytes"] > 0
        assert rows["synth"]["disk_bytes_per_entity"] > 50  # entity2text.txt alone is longer than that per entity
        assert rows["check"]["status"] == "skipped"
    assert large["synth"]["time_exponent"] is not None and large["synth"]["memory_exponent"] is not None
    assert [s["graph"]["entities"] for s in result["sizes"]] == [300, 600]
    assert "| 600 | synth | ok |" in res.stdout and (tmp_path / "scale.png").stat().st_size > 0
    again = cli("bench", "scale", "--entities", "300", "--queries", "20", "--stages", "synth", "--model", "none",
                "--work", tmp_path / "w")
    assert "synth: reused the graph of an earlier bench" in again.stdout  # kept with --keep, same parameters


def test_tokenise_stage_times_the_text_bank_apart(tmp_path):
    from kgc.data.synth_graph import synth_graph

    graph = tmp_path / "g"
    synth_graph(graph, entities=300, dev_triples=20, test_triples=20)
    model = workload.save_tiny_bert(tmp_path / "tiny")
    recipe = workload.write_recipe(tmp_path / "r.yaml", graph, str(model), 2)
    got = workload._tokenise(str(recipe), ["data.max_tokens=24"])
    assert got["entities"] == 300
    assert 0 <= got["tokenise_seconds"] <= got["build_model_seconds"]
    assert got["rss_after_tokenise_bytes"] > 0 and got["read_seconds"] >= 0
