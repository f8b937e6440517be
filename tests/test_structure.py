"""Structure beside text: a tiny PyKEEN model trained at the end of `kgc train`, fused with the text scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kgc.errors import KGCError
from tests.conftest import cli as kgc


STRUCTURE = {"model": "TransE", "dim": 8, "epochs": 2, "batch_size": 512, "lr": 0.01, "negatives": 2, "seed": 1,
             "alphas": [0.0, 0.5, 1.0]}


def train_fused(tiny_bert, folder, structure: dict):
    """`kgc train` of a 2-step UMLS bi-encoder on ``tiny_bert`` with ``structure`` as its structure: section, into
    ``folder``/run; returns (run, the command's stdout)."""
    recipe = folder / "tiny.yaml"
    recipe.write_text(
        "name: tiny\n"
        "data: {dataset: umls, neighbor_text: false, max_tokens: 16}\n"
        f"model: {json.dumps({'backbone': str(tiny_bert), 'conditioner': 'biencoder'})}\n"
        "train: {epochs: 1, max_steps: 2, batch_size: 64, lr: 1.0e-3, warmup_steps: 1, num_threads: 1}\n"
        "eval: {batch_size: 256, validate_every_epoch: false}\n"
        f"structure: {json.dumps(structure)}\n")
    out = kgc("train", recipe, "--out", folder / "run", "--no-progress")
    return folder / "run", out.stdout


@pytest.fixture(scope="module")
def fused_run(tiny_bert, tmp_path_factory, data_home):
    run, out = train_fused(tiny_bert, tmp_path_factory.mktemp("structure"), STRUCTURE)
    assert "structural model trained" in out
    return run


def test_structure_trained_and_saved(fused_run):
    meta = json.loads((fused_run / "structure" / "meta.json").read_text())
    assert meta["model"] == "TransE" and meta["params"]["dim"] == 8 and meta["entities"] == 135
    assert meta["train_seconds"] >= 0 and meta["pykeen_version"] and len(meta["losses"]) == 2
    assert (fused_run / "structure" / "model.pt").is_file()


def _loaded(run_dir):
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.linkpred.structure.kinds import load_structure

    run = LinkPredRun(run_dir, device="cpu", echo=None)
    return run, run.predictor.model(), run.predictor.graph(), load_structure(run.dir.structure)


def test_fused_scores_by_hand_and_relation_mapping(fused_run):
    from kgc.linkpred.structure.pykeen import fused_scores

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

    from kgc.linkpred.evaluation.scoring import evaluate
    from kgc.linkpred.structure.pykeen import _factory, fused_scorer

    run, model, graph, st = _loaded(fused_run)
    fused = {a: evaluate(model, graph, "test", batch_size=256, scorer=fused_scorer(st, [a])) for a in (0.0, 1.0)}
    res = {a: ev.variants[a] for a, ev in fused.items()}
    both = evaluate(model, graph, "test", batch_size=256, scorer=fused_scorer(st, [0.0, 1.0]))  # one pass, two α
    mrr = lambda d: d["both"]["realistic"]["inverse_harmonic_mean_rank"]  # noqa: E731
    assert [mrr(both.variants[a]) for a in (0.0, 1.0)] == [mrr(res[a]) for a in (0.0, 1.0)]
    assert both.ranks == fused[0.0].ranks  # the first α is the main result
    text = evaluate(model, graph, "test", batch_size=256)
    assert [x["rank"] for x in fused[1.0].ranks] == pytest.approx([x["rank"] for x in text.ranks])
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

    from kgc.linkpred.bench.structure import bench_structure, structure_table

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


def test_compare_on_a_fused_recipe_and_one_results_layout(fused_run, tiny_bert, tmp_path):
    """`kgc compare` on a fused recipe beside a text-only one (the README's `kgc compare recipes/umls_*.yaml`
    stopped with KeyError: 'cache_bytes' when the fused evaluation wrote its own layout): both runs' results.json
    hold the same keys, and the fused row is the fused result."""
    text_recipe = tmp_path / "text.yaml"
    fused_recipe = tmp_path / "fused.yaml"
    base = ("data: {dataset: umls, neighbor_text: false, max_tokens: 16}\n"
            f"model: {json.dumps({'backbone': str(tiny_bert), 'conditioner': 'biencoder'})}\n"
            "train: {epochs: 1, max_steps: 2, batch_size: 64, lr: 1.0e-3, warmup_steps: 1, num_threads: 1}\n"
            "eval: {batch_size: 256, validate_every_epoch: false}\n")
    text_recipe.write_text("name: text\n" + base)
    fused_recipe.write_text("name: fused\n" + base + f"structure: {json.dumps(STRUCTURE)}\n")
    out = tmp_path / "cmp"
    res = kgc("compare", text_recipe, fused_recipe, "--out", out, "--no-progress")
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["text", "fused"] and "| fused | biencoder |" in res.stdout
    text, fused = (json.loads((out / name / "results.json").read_text()) for name in ("text", "fused"))
    assert set(text) == set(fused) and set(text["kgc"]) == set(fused["kgc"])  # one layout
    assert text["kgc"]["structure"] is None and fused["kgc"]["structure"]["alpha"] in STRUCTURE["alphas"]
    mrr = lambda d: d["both"]["realistic"]["inverse_harmonic_mean_rank"]  # noqa: E731
    assert rows[1]["MRR"] == pytest.approx(mrr(fused)) and rows[1]["cache bytes"] == fused["kgc"]["cache_bytes"] > 0
    # the text-only component of the fused run is the text model of the same weights, evaluated alone
    assert mrr(fused["kgc"]["components"]["text"]) == pytest.approx(mrr(text), abs=1e-6)
