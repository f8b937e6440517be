"""`kgc compare` and `kgc bench` on a tiny random BERT: what they report is right (no timing claims here)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli as kgc
from tests.test_end_to_end import write_recipe

pytestmark = pytest.mark.slow


def test_compare_tabulates_each_recipe(tiny_bert, tmp_path, data_home, monkeypatch):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    a = write_recipe(tmp_path / "a.yaml", tiny_bert)
    b = write_recipe(tmp_path / "b.yaml", tiny_bert, {"conditioner": "hadamard", "shared_towers": True})
    for path, name in ((a, "tiny_bi"), (b, "tiny_had")):
        path.write_text(path.read_text().replace("name: tiny", f"name: {name}"))
    out = tmp_path / "cmp"
    res = kgc("compare", a, b, "--set", "train.max_steps=2", "--out", out, "--no-progress")
    table = (out / "compare.md").read_text().splitlines()
    assert table[0].startswith("| recipe | conditioner | pooling | MRR") and len(table) == 4
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["tiny_bi", "tiny_had"]
    assert rows[0]["conditioner"] == "biencoder" and rows[1]["conditioner"] == "hadamard"
    for r in rows:  # each row is that run's own results and summary
        results = json.loads((out / r["recipe"] / "results.json").read_text())
        assert r["MRR"] == results["both"]["realistic"]["inverse_harmonic_mean_rank"]
        summary = json.loads((out / r["recipe"] / "train_summary.json").read_text())
        assert summary["steps"] == 2 and r["total params"] == summary["total_params"]
    assert rows[1]["total params"] < rows[0]["total params"]  # one shared tower vs two
    assert "| tiny_had | hadamard |" in res.stdout


def test_bench_reports_each_conditioners_passes(tiny_bert, tmp_path, data_home, monkeypatch):
    from kgc.linkpred.bench.speed import bench_inference, bench_train

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    result = bench_inference(dataset="umls", limit=20, overrides=[f"model.backbone={tiny_bert}"],
                             conditioners=("biencoder", "hadamard", "hypernet", "router", "router:cross_attend=top",
                                           "router:cross_attend=all,scorer=cls_attention"),
                             echo=lambda m: None, progress=False)
    rows = {r["conditioner"]: r for r in result["rows"]}
    assert rows["biencoder"]["passes"]["queries_full"] == 40 and rows["biencoder"]["speedup_vs_biencoder"] == 1.0
    assert rows["router"]["passes"]["queries_top_layers"] == 40 and rows["router"]["passes"]["sentences"] == 135
    assert rows["router:cross_attend=top"]["passes"]["queries_top_layers"] == 40
    assert rows["router:cross_attend=all,scorer=cls_attention"]["passes"]["queries_full"] == 40  # nothing cached
    for name in ("hadamard", "hypernet"):  # the cached entity table serves as h_s: only relations are encoded
        assert rows[name]["passes"] == {"sentences": 0, "conditions": 92, "queries_full": 0, "queries_top_layers": 0}
    recipe = write_recipe(tmp_path / "r.yaml", tiny_bert, {"conditioner": "router"})
    result = bench_train(recipe, trainable_layers=1, steps=2, batch_size=8, echo=lambda m: None)
    full, top = result["rows"]
    assert full["trainable_layers"] == "all" and full["cache_layer"] is None
    assert top["trainable_layers"] == 1 and top["cache_layer"] == 1 and top["trainable_params"] < full["trainable_params"]
    # the per-step profile: every part of a step is timed, the parts fit inside the step, cache reads only with one
    for row in (full, top):
        parts = row["seconds_per_step"]
        assert {"step", "query tower forward", "tail tower forward", "loss", "backward (trained towers, loss)",
                "optimiser (AdamW)"} <= set(parts)
        own = sum(v for k, v in parts.items() if k not in ("step", "layer cache lookup (misses computed)"))
        assert 0 < own <= parts["step"] * 1.001
    assert "layer cache lookup (misses computed)" in top["seconds_per_step"]
    assert "layer cache lookup (misses computed)" not in full["seconds_per_step"]
    alone = bench_train(recipe, trainable_layers=1, steps=2, batch_size=8, full=False, echo=lambda m: None)
    assert [r["trainable_layers"] for r in alone["rows"]] == [1] and alone["speedup"] is None  # the recipe's own pace


def test_bench_loss_times_both_masks_on_the_recipes_graph(tiny_bert, tmp_path, data_home):
    """`kgc bench loss`: the objective with the binary-search masks and with torch.isin's, on the recipe's train
    keys (with and without the entity-table block); the losses must agree or the bench fails."""
    from kgc.linkpred.bench.speed import bench_loss

    recipe = write_recipe(tmp_path / "r.yaml", tiny_bert)
    plain = bench_loss(recipe, steps=3, batch_size=8, echo=lambda m: None)
    table = bench_loss(recipe, steps=3, batch_size=8, overrides=["loss.table_negatives=100", "loss.table_tails=true"],
                       echo=lambda m: None)
    assert plain["table"] is False and table["table"] is True
    for result in (plain, table):
        assert result["batch_size"] == 8 and result["entities"] == 135 and result["train_keys"] > 0
        assert set(result["ms_per_step"]) == {"binary search", "torch.isin"} and result["speedup"] > 0


def test_compare_table_prints_shares_and_metrics_to_their_digits():
    """The head-above-gold share keeps three decimals (0.8933 once printed as 0.9), metrics four, params in M/k."""
    from kgc.compare import markdown_table

    row = {"recipe": "r", "conditioner": "router", "pooling": "mean", "MRR": 0.231397, "H@1": 0.0788, "H@3": 0.3133,
           "H@10": 0.523, "head above gold": 0.8933, "dev MRR": 0.2246, "trainable params": 7097857,
           "total params": 45130753, "train triples/s": 26.26, "train seconds": 4537.5, "eval seconds": 232.007,
           "query seconds": 9.145, "cache bytes": 5784786032}
    header, rule, line = markdown_table([row]).splitlines()
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in line.strip("|").split("|")]))
    assert cells["head above gold"] == "0.893" and cells["MRR"] == "0.2314" and cells["H@10"] == "0.5230"
    assert cells["trainable params"] == "7.10M" and cells["train seconds"] == "4537.5"
    assert cells["cache bytes"] == "5516.8 MiB"


def test_bench_inputs_times_both_assemblies_and_checks_them_equal(tiny_bert, tmp_path, data_home, monkeypatch):
    """`kgc bench inputs`: a step's token inputs built one entity at a time, as before in the step, and prepared a
    step ahead (distinct rows in length groups), on the recipe's train triples; a difference is an error, not a
    figure. Then steps with a tiny BERT, inputs in the step against prefetched: the prefetched step waits less for
    its inputs than the step spends building them."""
    from kgc.data.texts import TextBank
    from kgc.errors import KGCError
    from kgc.linkpred.bench.steps import bench_inputs

    recipe = write_recipe(tmp_path / "r.yaml", tiny_bert)
    result = bench_inputs(recipe, steps=2, batch_size=64, echo=lambda m: None)
    assert result["batch_size"] == 64 and result["entities"] == 135 and result["steps"] == 2
    assert set(result["ms_per_step"]) == {"one at a time", "before (in the step)", "prepared (a step ahead)"}
    assert result["speedup"] > 0
    positions = result["token_positions"]
    assert 0 < positions["length_groups"] <= positions["padded"]  # less where lengths vary (WN18RR: a third)
    inline, ahead = result["step_ms"]["inputs in the step"], result["step_ms"]["prefetched"]
    assert set(inline) == {"inputs", "towers", "loss", "backward", "optimizer", "step", "outside_model"}
    assert ahead["inputs"] < inline["inputs"]
    real = TextBank.entity_batch
    monkeypatch.setattr(TextBank, "entity_batch", lambda self, e, x=None: real(self, e, None))  # exclusion lost
    with pytest.raises(KGCError, match="other inputs than the reference"):  # the tokens prepared differ
        bench_inputs(recipe, steps=2, batch_size=64, echo=lambda m: None)
