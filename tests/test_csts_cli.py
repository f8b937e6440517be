"""C-STS through the CLI with a tiny random BERT on a small synthetic set: every conditioner trains,
evaluates at its own cost and scores new pairs; S²Sent in both tasks; compare on the official layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.test_csts_data import write_official
from tests.conftest import cli as kgc
from tests.test_end_to_end import assert_resume_reproduces, write_recipe as write_linkpred_recipe

pytestmark = pytest.mark.slow

SYNTH = {"train_pairs": 24, "validation_pairs": 6, "test_pairs": 10, "seed": 5}


def write_recipe(path: Path, backbone: Path, model: dict, encoder: dict | None = None, **train) -> Path:
    t = {"epochs": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 1, "log_every": 1, "num_threads": 1, "keep": "all",
         **train}
    path.write_text(
        "name: tiny_csts\ntask: csts\n"
        f"data: {{dataset: synth-csts, max_tokens: 40, synth: {json.dumps(SYNTH)}}}\n"
        f"model: {json.dumps({'backbone': str(backbone), **model})}\n"
        f"encoder: {json.dumps(encoder or {})}\n"
        "loss: {contrastive: true, contrastive_temperature: 1.5}\n"
        f"train: {json.dumps(t)}\n"
        "eval: {batch_size: 64}\n")
    return path


def read_tsv(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.mark.parametrize("model,encoder", [
    ({"conditioner": "biencoder"}, {}),
    ({"conditioner": "hadamard"}, {}),
    ({"conditioner": "concat"}, {}),
    ({"conditioner": "hypernet", "rank": 4, "pooling": "s2sent", "s2sent_blocks": 2, "s2sent_frequencies": 2,
      "s2sent_reduction": 4}, {}),
    ({"conditioner": "router", "router_layers": 1}, {"trainable_layers": 1}),
    ({"conditioner": "case", "case_dim": 16}, {"trainable_layers": 0}),
], ids=["biencoder", "hadamard", "concat", "hypernet-s2sent", "router-top1-cached", "case-frozen"])
def test_every_conditioner_on_synthetic_csts(model, encoder, tiny_bert, tmp_path, monkeypatch):
    from kgc.csts.data import load_csts
    from kgc.csts.recipe import SynthConfig

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "run"
    kgc("train", write_recipe(tmp_path / "r.yaml", tiny_bert, model, encoder), "--out", run, "--no-progress")
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["task"] == "csts" and summary["conditioner"] == model["conditioner"]
    assert summary["steps"] == 2 * 3 and summary["pairs_per_s"] > 0  # 24 pairs, 8 per batch, 2 epochs
    assert (summary["pooling_params"] > 0) == (model.get("pooling") == "s2sent")
    if encoder:
        assert summary["trainable_params"] < summary["total_params"] and summary["layer_cache"]["misses"] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_spearman" in r] == [3, 6]
    assert (run / "curves.png").is_file() and (run / "best.pt").is_file()

    out = kgc("evaluate", run, "--no-progress")
    assert "Spearman" in out.stdout and "pair accuracy" in out.stdout
    res = json.loads((run / "results.json").read_text())
    preds = read_tsv(run / "predictions.tsv")
    assert res["rows"] == len(preds) == 20 and res["contrast_pairs"] == 10
    sim = np.array([float(p["similarity"]) for p in preds])
    lab = np.array([float(p["label"]) for p in preds])
    assert res["spearman"] == pytest.approx(stats.spearmanr(sim, lab).statistic, abs=1e-5)
    assert res["pearson"] == pytest.approx(stats.pearsonr(sim, lab).statistic, abs=1e-5)

    # each conditioner at its own cost: count the distinct sentences, conditions and pairs of the split
    test = load_csts("synth-csts", synth=SynthConfig(**SYNTH)).split("test")
    sentences = len(set(test.s1.tolist()) | set(test.s2.tolist()))
    pairs = len({(s, c) for s, c in zip(test.s1.tolist() + test.s2.tolist(), test.cond.tolist() * 2)})
    conditions = len(set(test.cond.tolist()))
    passes = res["kgc"]["encoder_passes_by_kind"]
    if model["conditioner"] in ("biencoder", "case"):
        assert passes == {"sentences": 0, "conditions": conditions if model["conditioner"] == "case" else 0,
                          "pairs_full": pairs, "pairs_top_layers": 0}
    elif model["conditioner"] == "router":
        assert passes == {"sentences": sentences, "conditions": conditions, "pairs_full": 0, "pairs_top_layers": pairs}
    else:
        assert passes == {"sentences": sentences, "conditions": conditions, "pairs_full": 0, "pairs_top_layers": 0}

    # kgc similarity: one pair, and a file of many, agree with what evaluate computed through its cached states
    first = preds[0]
    single = json.loads(kgc("similarity", run, "--s1", first["sentence1"], "--s2", first["sentence2"],
                            "--condition", first["condition"], "--json").stdout)["rows"][0]
    assert single["similarity"] == pytest.approx(float(first["similarity"]), abs=2e-3)
    table = tmp_path / "many.tsv"
    table.write_text("sentence1\tsentence2\tcondition\n" + "".join(
        f"{p['sentence1']}\t{p['sentence2']}\t{p['condition']}\n" for p in preds[:5]))
    kgc("similarity", run, "--tsv", table, "--out", tmp_path / "scored.tsv")
    scored = read_tsv(tmp_path / "scored.tsv")
    np.testing.assert_allclose([float(r["similarity"]) for r in scored], sim[:5], atol=2e-3)
    assert all(1 <= float(r["predicted_label"]) <= 5 for r in scored)

    if model["conditioner"] in ("router", "hypernet"):  # kgc explain on a C-STS run: the paper's Figures 5-7
        ex = json.loads(kgc("explain", run, "--sentence", first["sentence1"], "--condition", first["condition"],
                            "--condition", "The colour of the car.", "--json").stdout)
        assert len(ex["conditions"]) == 2 and Path(ex["png"]).is_file()
        if model["conditioner"] == "router":
            assert ex["tokens"][0] == "[CLS]" and ex["tokens"][-1] == "[SEP]"
            for row in ex["weights"].values():
                assert len(row) == len(ex["tokens"]) and sum(row) == pytest.approx(1.0, abs=1e-5)
        else:
            assert all(len(v) == 32 for v in ex["singular_values"].values())


def test_task_mixups_fail_clearly(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "run"
    kgc("train", write_recipe(tmp_path / "r.yaml", tiny_bert, {"conditioner": "hadamard"}, max_steps=1), "--out", run,
        "--no-progress")
    bad = kgc("predict", run, "--head", "a", "--relation", "b", check=False)
    assert bad.returncode == 2 and "is a csts run, not linkpred; use `kgc similarity" in bad.stderr
    bad = kgc("evaluate", run, "--split", "dev", check=False)
    assert bad.returncode == 2 and "a C-STS run has test, validation and train" in bad.stderr
    recipe = tmp_path / "bad.yaml"
    recipe.write_text((tmp_path / "r.yaml").read_text().replace("loss: {", "loss: {pre_batch: 2, "))
    bad = kgc("train", recipe, check=False)
    assert bad.returncode == 2 and "loss.pre_batch: read only by task linkpred" in bad.stderr
    table = tmp_path / "q.tsv"
    table.write_text("sentence1\tsentence2\tcondition\na\tb\tc\nx\t\tz\n")
    bad = kgc("similarity", run, "--tsv", table, check=False)
    assert bad.returncode == 2 and "q.tsv:3: empty sentence2" in bad.stderr


def test_s2sent_pooling_in_link_prediction(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "run"
    model = {"conditioner": "router", "router_layers": 1, "pooling": "s2sent", "s2sent_blocks": 2,
             "s2sent_frequencies": 2, "s2sent_reduction": 4}
    kgc("train", write_linkpred_recipe(tmp_path / "r.yaml", tiny_bert, model, {"trainable_layers": 1}, max_steps=3),
        "--out", run, "--no-progress")
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["pooling_params"] == 2 * (32 * 8 + 8 + 2 * (8 * 32 + 32))  # W1 and two W2 per tower
    kgc("evaluate", run, "--no-progress")
    res = json.loads((run / "results.json").read_text())
    assert 0 < res["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1
    assert res["kgc"]["encoder_passes_by_kind"]["queries_top_layers"] == 1322


def test_compare_on_the_official_layout(tiny_bert, tmp_path, monkeypatch):
    """The six C-STS recipes run as shipped (one epoch) on a folder in the official layout; the official
    test split has no labels, so the table reports the validation split."""
    root = Path(__file__).resolve().parents[1]
    rng = np.random.default_rng(0)
    from kgc.csts.synth import generate_rows

    def rows_csv(rows, hide=False):
        return "sentence1,sentence2,condition,label\n" + "".join(
            f'"{a}","{b}","{c}",{-1 if hide else float(y) + float(rng.choice([0, 0.5])) * (y < 5)}\n'
            for a, b, c, y in rows)

    home = tmp_path / "home"
    write_official(home / "CSTS", train=rows_csv(generate_rows(12, 1)), valid=rows_csv(generate_rows(6, 2)),
                   test=rows_csv(generate_rows(4, 3), hide=True))
    monkeypatch.setenv("KGC_DATA_HOME", str(home))
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipes = [root / "recipes" / f"csts_{c}.yaml" for c in ("biencoder", "hadamard", "concat", "hypercl", "csr",
                                                              "case")]
    out = tmp_path / "cmp"
    res = kgc("compare", *recipes, "--set", "train.epochs=1", "--set", f"model.backbone={tiny_bert}",
              "--set", "train.num_threads=1", "--out", out, "--no-progress")
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["(condition-blind)"] + [p.stem for p in recipes]
    assert rows[0]["data"] == "csts validation" and all(r["Spearman"] is not None for r in rows)
    # the recipes validate, so the split they are reported on is the one best.pt was selected on: the table says so
    assert all(r["data"] == "csts validation (best.pt selected on it)" for r in rows[1:])
    assert rows[0]["pair accuracy"] == 0.5  # blind to the condition: every pair is a tie
    for r in rows[1:]:
        results = json.loads((out / r["recipe"] / "results.validation.json").read_text())
        assert r["Spearman"] == results["spearman"] and r["train pairs/s"] > 0
    table = (out / "compare.md").read_text().splitlines()
    assert table[0].startswith("| recipe | conditioner | pooling | data | Spearman | Pearson | pair accuracy")
    assert len(table) == 2 + 7 and "| csts_case | case (mlp, k=512), frozen encoder |" in res.stdout


def test_csts_resume_reproduces_the_uninterrupted_run(tiny_bert, tmp_path, monkeypatch):
    """The shared loop resumes a C-STS run exactly: batches, schedule and weights as if it never stopped."""
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, {"conditioner": "hypernet", "rank": 4},
                                      max_steps=5, checkpoint_every=2))
    assert_resume_reproduces(recipe, tmp_path, monkeypatch, at_step=2, steps=5)
