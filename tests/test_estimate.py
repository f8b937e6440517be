"""A run says what it will need before it starts (kgc/training/estimate.py): the memory of a training step, estimated
within a stated factor of a measured one, a refusal before the run folder exists that names a batch size that fits,
the escape hatch, and the pace with the end time, said once."""

from __future__ import annotations

import ctypes
import gc
import json
import random
from pathlib import Path

import pytest

from tests.conftest import cli as kgc, save_tiny_bert

FACTOR = 1.5  # the estimate of the step's own memory is within this factor of the measured one (either way)


def write_graph(folder: Path, tokenizer, *, entities: int = 300, triples: int = 1200, words: int = 60) -> Path:
    """A KG-BERT folder whose texts all run past any max_tokens used here (every batch pads to max_tokens, no two
    texts alike): the shape the estimate assumes."""
    rng = random.Random(0)
    vocab = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) > 2)
    folder.mkdir(parents=True, exist_ok=True)
    ents = [f"e{i}" for i in range(entities)]
    (folder / "entity2text.txt").write_text("".join(f"{e}\t{' '.join(rng.choices(vocab, k=words))}\n" for e in ents))
    (folder / "relation2text.txt").write_text("".join(f"r{i}\trelation {vocab[i]}\n" for i in range(5)))
    rows: set[tuple[str, str, str]] = set()
    while len(rows) < triples + 20:
        h, t = rng.sample(ents, 2)
        rows.add((h, f"r{rng.randrange(5)}", t))
    rows_list = sorted(rows)
    rng.shuffle(rows_list)
    for name, part in (("train", rows_list[:triples]), ("dev", rows_list[triples:triples + 10]),
                       ("test", rows_list[triples + 10:])):
        (folder / f"{name}.tsv").write_text("".join("\t".join(r) + "\n" for r in part))
    return folder


@pytest.fixture(scope="module")
def graph(tmp_path_factory, tokenizer) -> Path:
    return write_graph(tmp_path_factory.mktemp("estimate") / "SYN", tokenizer)


@pytest.fixture(scope="module")
def bert(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer, 64-wide random BERT (4 heads, intermediate 256): activations big enough to measure."""
    return save_tiny_bert(tmp_path_factory.mktemp("bert64"), tokenizer, 2, hidden=64, heads=4, intermediate=256)


def recipe_file(path: Path, backbone: Path, graph: Path, **train) -> Path:
    t = {"epochs": 1, "batch_size": 96, "max_steps": 2, "warmup_steps": 1, "num_threads": 1, "log_every": 1, **train}
    path.write_text(
        "name: est\n"
        f"data: {{path: {graph}, neighbor_text: false, max_tokens: 40}}\n"
        f"model: {{backbone: {backbone}, conditioner: biencoder}}\n"
        f"train: {json.dumps(t)}\n"
        "eval: {validate_every_epoch: false}\n")
    return path


def fake_meminfo(monkeypatch, tmp_path: Path, gb: float) -> None:
    """/proc/meminfo saying ``gb`` GB available, and no cgroup limit."""
    from kgc.training import estimate

    f = tmp_path / "meminfo"
    f.write_text(f"MemTotal:       99999999 kB\nMemAvailable:   {int(gb * 1e9 / 1024)} kB\n")
    monkeypatch.setattr(estimate, "MEMINFO", str(f))
    monkeypatch.setattr(estimate, "CGROUP_FILES", ())


def test_the_estimate_of_a_step_is_within_a_factor_of_a_measured_one(bert, graph, tmp_path, monkeypatch):
    """A real training step (kgc's loop) of a 64-wide BERT, batch 96 × 3 sequences of 40 tokens: the resident memory
    it adds once the model is built (its peak minus the resident set before the first step) against the estimate's
    parts for it (activations, gradients, AdamW, scores)."""
    from kgc.recipe import load_recipe
    from kgc.training import estimate, loop, session

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    libc = ctypes.CDLL(None)
    before: list[int] = []
    build = session.Session._build_objective

    def measured_from_here(self):  # the model and optimiser exist: from here on, the step's own memory
        build(self)
        gc.collect()
        libc.malloc_trim(0)  # freed heap goes back, so the step's allocations show in the resident set
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from now
        before.append(estimate.resident_bytes()[0])

    monkeypatch.setattr(session.Session, "_build_objective", measured_from_here)
    run = loop.train(load_recipe(recipe_file(tmp_path / "r.yaml", bert, graph)), out=tmp_path / "run",
                     progress=False, echo=lambda _m: None)
    memory = json.loads((run / "train_summary.json").read_text())["memory"]
    measured = memory["peak_rss_bytes"] - before[0]
    parts = memory["parts"]
    step = sum(parts.get(k, 0) for k in ("activations", "gradients", "optimizer", "scores"))
    assert memory["estimate_bytes"] == sum(parts.values()) and memory["rss_at_check_bytes"] > 0
    assert measured > 100e6, measured  # a step worth measuring (about 250 MB; the estimate said 8-14 % more)
    assert 1 / FACTOR <= step / measured <= FACTOR, (step, measured, parts)


def test_a_run_that_does_not_fit_is_refused_before_its_folder_exists(bert, graph, tmp_path, monkeypatch):
    from kgc.recipe import load_recipe
    from kgc.training import estimate
    from kgc.training.task import make_training

    fake_meminfo(monkeypatch, tmp_path, 1.5)
    recipe = recipe_file(tmp_path / "r.yaml", bert, graph, batch_size=2048)  # every train direction in one batch
    run = tmp_path / "run"
    res = kgc("train", recipe, "--out", run, "--no-progress", check=False)
    assert res.exit_code == 2, res
    assert not run.exists()
    err = res.stderr
    assert "error: this run needs ~" in err and "but 1.5 GB is available (MemAvailable)" in err, err
    assert "--no-memory-check" in err and "Nothing was written" in err
    assert any(line.startswith("memory: ~") and "1.5 GB available" in line for line in res.stdout.splitlines())
    size = int(err.split("train.batch_size=")[1].split("`")[0])
    assert 8 <= size < 2048 and size % 8 == 0
    rec = load_recipe(recipe, [f"train.batch_size={size}"])
    task = make_training(rec).counts
    assert estimate.estimate(rec, task).fits  # the batch it names fits …
    bigger = load_recipe(recipe, [f"train.batch_size={size + 8}"])
    assert not estimate.estimate(bigger, make_training(bigger).counts).fits  # … and is the largest multiple of 8 that does


def test_the_escape_hatch_starts_the_run_and_the_pace_is_said_once(bert, graph, tmp_path, monkeypatch):
    from kgc.training import loop

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "ETA_STEPS", 2)
    fake_meminfo(monkeypatch, tmp_path, 0.01)  # nothing fits in 10 MB
    recipe = recipe_file(tmp_path / "r.yaml", bert, graph, batch_size=8, max_steps=4)
    assert kgc("train", recipe, "--out", tmp_path / "refused", "--no-progress", check=False).exit_code == 2
    run = tmp_path / "run"
    out = kgc("train", recipe, "--out", run, "--no-progress", "--no-memory-check").stdout
    assert "warning: the estimate exceeds 85% of the memory available; going on" in out
    assert "check_memory: false" in (run / "recipe.yaml").read_text()  # a resume goes on too
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 4 and summary["memory"]["available_bytes"] == pytest.approx(0.01e9, rel=1e-3)
    paces = [line for line in out.splitlines() if line.startswith("pace: ")]
    assert len(paces) == 1 and "s/step" in paces[0] and "(4 steps; validation not included)" in paces[0], out
    assert summary["pace"]["measured_at_step"] == 3 and summary["pace"]["total_steps"] == 4


def test_the_end_is_the_steps_or_max_minutes_whichever_comes_first():
    from kgc.training.estimate import pace

    line, record = pace(step=10, total=1010, seconds_per_step=2.0, train_seconds=30.0, max_minutes=None,
                        unit="triples", rate=32.0, now=0.0)
    assert "2.00 s/step (32.0 triples/s) after 10 steps; training ends in about 33 min" in line
    assert record["estimated_seconds_left"] == 2000.0 and record["ends_by"] == "1,010 steps"
    line, record = pace(step=10, total=100_000, seconds_per_step=2.0, train_seconds=30.0, max_minutes=90,
                        unit="triples", rate=32.0, now=0.0)
    assert record["estimated_seconds_left"] == 90 * 60 - 30.0 and "training ends in about 90 min" in line
    assert "train.max_minutes=90, at step ~2,695 of 100,000" in line
