"""Structure beside text: a tiny PyKEEN model trained at the end of `kgc train`, fused with the text scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kgc.errors import KGCError


def kgc(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "kgc.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check and proc.returncode != 0:
        raise AssertionError(f"kgc {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


STRUCTURE = {"model": "TransE", "dim": 8, "epochs": 2, "batch_size": 512, "lr": 0.01, "negatives": 2, "seed": 1,
             "alphas": [0.0, 0.5, 1.0]}


@pytest.fixture(scope="module")
def fused_run(tiny_bert, tmp_path_factory, data_home):
    tmp = tmp_path_factory.mktemp("structure")
    recipe = tmp / "tiny.yaml"
    recipe.write_text(
        "name: tiny\n"
        "data: {dataset: umls, neighbor_text: false, max_tokens: 16}\n"
        f"model: {json.dumps({'backbone': str(tiny_bert), 'conditioner': 'biencoder'})}\n"
        "train: {epochs: 1, max_steps: 2, batch_size: 64, lr: 1.0e-3, warmup_steps: 1, num_threads: 1}\n"
        "eval: {batch_size: 256, validate_every_epoch: false}\n"
        f"structure: {json.dumps(STRUCTURE)}\n")
    run = tmp / "run"
    out = kgc("train", recipe, "--out", run, "--no-progress")
    assert "structural model trained" in out.stdout
    return run


def test_structure_trained_and_saved(fused_run):
    meta = json.loads((fused_run / "structure" / "meta.json").read_text())
    assert meta["model"] == "TransE" and meta["params"]["dim"] == 8 and meta["entities"] == 135
    assert meta["train_seconds"] >= 0 and meta["pykeen_version"] and len(meta["losses"]) == 2
    assert (fused_run / "structure" / "model.pt").is_file()


def _loaded(run_dir):
    from kgc.linkpred.model import Run
    from kgc.linkpred.structure import load_structure

    run = Run(run_dir)
    model, graph = run.load("cpu")
    return run, model, graph, load_structure(run)


def test_fused_scores_by_hand_and_relation_mapping(fused_run):
    from kgc.linkpred.structure import fused_scores

    run, model, graph, st = _loaded(fused_run)
    r = graph.num_relations
    trip = graph.splits["test"][:3]
    heads = np.concatenate([trip[:, 0], trip[:, 2]])
    rels = np.concatenate([trip[:, 1], trip[:, 1] + r])  # tail queries, then kgc's inverse (head) queries
    s = st.scores(heads, rels)  # (6, 135)
    with torch.no_grad():
        table = model.entity_table(64)
        text = model.encode_queries(heads, rels).float() @ table.t()
        # by hand, straight from pykeen's scoring of full triples; trained with inverse triples, PyKEEN's own
        # relation ids are 2r (forward) and 2r + 1 (inverse), and (?, r, t) is scored as (t, r⁻¹, ?)
        assert st.model.use_inverse_triples
        for i, (hh, rr, tt) in enumerate(trip.tolist()):
            tails = torch.tensor([[hh, 2 * rr, e] for e in range(135)])
            assert torch.allclose(s[i], st.model.score_hrt(tails).squeeze(1), atol=1e-5)
            heads_ = torch.tensor([[tt, 2 * rr + 1, e] for e in range(135)])
            assert torch.allclose(s[3 + i], st.model.score_hrt(heads_).squeeze(1), atol=1e-5)
    z = lambda x: (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True, unbiased=False)  # noqa: E731
    for a in (0.0, 0.3, 1.0):
        assert torch.allclose(fused_scores(text, s, a), a * z(text) + (1 - a) * z(s), atol=1e-5)
    # entities the structural model never saw (ids >= its count) fall back to text alone
    wider = torch.cat([text, torch.randn(6, 4)], 1)
    f = fused_scores(wider, s, 0.3, heads=heads, num_structural=135)
    assert torch.allclose(f[:, 135:], z(wider)[:, 135:], atol=1e-5)


def test_alpha_one_is_text_alpha_zero_is_structure(fused_run):
    from pykeen.evaluation import RankBasedEvaluator

    from kgc.linkpred.evaluate import evaluate
    from kgc.linkpred.structure import _factory, evaluate_grid

    run, model, graph, st = _loaded(fused_run)
    res, rows = evaluate_grid(model, graph, st, "test", [0.0, 1.0], batch_size=256)
    text = evaluate(model, graph, "test", batch_size=256)
    assert [x["rank"] for x in rows[1.0]] == pytest.approx([x["rank"] for x in text.ranks])
    mrr = lambda d: d["both"]["realistic"]["inverse_harmonic_mean_rank"]  # noqa: E731
    assert mrr(res[1.0]) == pytest.approx(text.metric(), abs=1e-6)
    # α = 0: pykeen's own filtered evaluation of the structural model on the same test triples
    ev = RankBasedEvaluator(filtered=True)
    own = ev.evaluate(st.model, _factory(graph.splits["test"], graph).mapped_triples, batch_size=256,
                      additional_filter_triples=[torch.as_tensor(graph.splits[s]) for s in ("train", "dev")],
                      use_tqdm=False).to_dict()
    for side in ("head", "tail", "both"):
        assert res[0.0][side]["realistic"]["inverse_harmonic_mean_rank"] == pytest.approx(
            own[side]["realistic"]["inverse_harmonic_mean_rank"], rel=1e-4)


def test_evaluate_and_predict_cli(fused_run):
    out = kgc("evaluate", fused_run, "--no-progress")
    assert "text only" in out.stdout and "structure only (TransE)" in out.stdout and "fused, alpha" in out.stdout
    res = json.loads((fused_run / "results.json").read_text())
    info = res["kgc"]["structure"]
    assert info["alpha"] in STRUCTURE["alphas"] and [g["alpha"] for g in info["grid"]] == STRUCTURE["alphas"]
    assert info["model"] == "TransE" and set(res["kgc"]["components"]) == {"text", "structure"}
    assert 0 < res["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1
    choice = json.loads((fused_run / "structure" / "alpha.json").read_text())
    assert choice["alpha"] == info["alpha"]
    pred = kgc("predict", fused_run, "--head", "acquired_abnormality", "--relation", "location_of", "--top-k", "5",
               "--json", "--no-progress")
    assert len(json.loads(pred.stdout)["predictions"]) == 5


def test_kgc_structure_retrains(fused_run, tmp_path):
    out = kgc("structure", fused_run, "--set", "structure.model=DistMult", "--set", "structure.epochs=1",
              "--no-progress")
    meta = json.loads((fused_run / "structure" / "meta.json").read_text())
    assert meta["model"] == "DistMult" and meta["params"]["epochs"] == 1 and meta["params"]["dim"] == 8
    assert "DistMult" in out.stdout and not (fused_run / "structure" / "alpha.json").exists()
    bad = kgc("structure", fused_run, "--set", "structure.bogus=1", check=False)
    assert bad.returncode != 0 and "structure.bogus" in bad.stdout + bad.stderr


def test_bad_structure_keys(tmp_path):
    from kgc.recipe import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text("structure: {model: RotatE, dimm: 200}\n")
    with pytest.raises(KGCError, match=r"unknown key 'structure.dimm'.*structure.dim"):
        load_recipe(p)
    p.write_text("structure: {model: NoSuchModel}\n")
    with pytest.raises(KGCError, match=r"not a PyKEEN model.*RotatE"):
        load_recipe(p)
    p.write_text("task: csts\ndata: {dataset: synth-csts}\nstructure: {model: RotatE}\n")
    with pytest.raises(KGCError, match="structure.*read only by task linkpred"):
        load_recipe(p)
    assert load_recipe(None, ["structure.epochs=3"]).structure.epochs == 3
    assert load_recipe(None).structure is None


def test_python_api_predicts_with_the_fused_score(fused_run):
    """kgc.Run.predict answers as `kgc predict` does: with the structural model fused in, not text alone."""
    import kgc as api

    pred = kgc("predict", fused_run, "--head", "acquired_abnormality", "--relation", "location_of", "--top-k", "5",
               "--json", "--no-progress")
    cli = [(p["entity"], p["score"]) for p in json.loads(pred.stdout)["predictions"]]
    rows = api.load(fused_run).predict("acquired_abnormality", "location_of", top_k=5)
    assert list(rows["entity"]) == [e for e, _ in cli]
    np.testing.assert_allclose(rows["score"].to_numpy(), [s for _, s in cli], rtol=1e-5)  # text alone differs


def test_bench_structure_is_pykeen_alone(tmp_path):
    """`kgc bench structure`: PyKEEN's own pipeline on its own copy of the dataset, with the recipe's settings —
    the same figures as calling pykeen.pipeline by hand with them."""
    from pykeen.pipeline import pipeline

    from kgc.bench import bench_structure, structure_table

    recipe = tmp_path / "nations.yaml"
    recipe.write_text("data: {dataset: nations}\n"
                      "structure: {model: TransE, dim: 8, epochs: 2, batch_size: 256, lr: 0.01}\n")
    result = bench_structure(recipe, seeds=[3], progress=False, echo=lambda m: None)
    by_hand = pipeline(dataset="Nations", dataset_kwargs={"create_inverse_triples": True}, model="TransE",
                       model_kwargs={"embedding_dim": 8}, optimizer="Adam", optimizer_kwargs={"lr": 0.01},
                       training_loop="lcwa", training_kwargs={"num_epochs": 2, "batch_size": 256, "use_tqdm": False},
                       evaluation_kwargs={"use_tqdm": False}, random_seed=3, device="cpu")
    mrr = float(by_hand.metric_results.get_metric("both.realistic.inverse_harmonic_mean_rank"))
    assert result["dataset"] == "Nations" and result["rows"][0]["mrr"] == pytest.approx(mrr, abs=1e-4)
    run_results = {"both": {"realistic": {"inverse_harmonic_mean_rank": 0.5, "hits_at_1": 0.25, "hits_at_3": 0.5,
                                          "hits_at_10": 1.0}}}
    table = structure_table(result, run_results).splitlines()
    assert table[2].startswith("| PyKEEN alone: pipeline on its Nations (1 seed) | " + f"{mrr:.4f}")
    assert table[3] == "| kgc run | 0.5000 | 0.2500 | 0.5000 | 1.0000 |"
    recipe.write_text("data: {dataset: wn18rr}\nstructure: {model: TransE}\n")
    with pytest.raises(KGCError, match="not one PyKEEN ships in its wheel"):
        bench_structure(recipe, echo=lambda m: None)
    recipe.write_text("data: {dataset: nations}\n")
    with pytest.raises(KGCError, match="no `structure:` section"):
        bench_structure(recipe, echo=lambda m: None)
