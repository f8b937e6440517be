"""Recipe versions: runs and recipes written before version 2 (the flat ``model:`` / ``index:`` / ``structure:``
sections) load, train and answer as they did.

``tests/data/runs_before_recipe_v2.json`` was made with the code of version 1 (commit 2d81c07, the last before the
unions): for each case a tiny run (the 2-layer random BERT of conftest, the toy graph, 2 epochs) was trained and
kept its saved ``recipe.yaml`` (as version 1 wrote it: every key, with its default), its test MRR, its ranks and
its top 3 answers to (e_dog, hypernym, ?). Here the same run is trained with today's code (the same MRR and ranks:
the recipe resolves to the same settings), then its recipe.yaml is replaced by the one version 1 saved, and the
run must load from it and answer the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, write_toy
from kgc.errors import KGCError
from kgc.migrations import CURRENT

BEFORE = json.loads((ROOT / "tests" / "data" / "runs_before_recipe_v2.json").read_text())
COMMON = ["data.neighbor_text=false", "data.max_tokens=16", "train.batch_size=4", "train.epochs=2",
          "train.warmup_steps=1", "train.lr=1e-3", "eval.validate_every_epoch=false", "train.num_threads=1",
          "train.check_memory=false"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return write_toy(tmp_path_factory.mktemp("versions") / "TOY")


def _v1_recipe(text: str, toy: Path, bert: Path) -> str:
    """The saved version-1 recipe.yaml with the paths of this machine's toy graph and tiny BERT."""
    tree = yaml.safe_load(text)
    tree["data"]["path"], tree["model"]["backbone"] = str(toy), str(bert)
    return yaml.safe_dump(tree, sort_keys=False)


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_a_run_saved_before_version_2_trains_loads_and_answers_the_same(case, toy, tiny_bert, tmp_path):
    import kgc
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    before = BEFORE[case]
    run = tmp_path / case
    recipe = load_recipe(None, [f"data.path={toy}", f"model.backbone={tiny_bert}"] + COMMON + before["sets"]
                         + [f"name={case}"])
    train(recipe, out=run, progress=False, echo=lambda m: None)
    loaded = kgc.load(run, echo=None)
    loaded.evaluation("test")
    results = json.loads((run / "results.json").read_text())
    assert results["both"]["realistic"]["inverse_harmonic_mean_rank"] == pytest.approx(before["mrr"], abs=1e-6)
    assert [line.split("\t")[:4] for line in (run / "ranks.tsv").read_text().splitlines()] == \
        [line.split("\t")[:4] for line in before["ranks"].splitlines()]
    saved_now = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved_now["version"] == CURRENT

    # the recipe.yaml version 1 saved for this run: upgraded on loading to what today's code saved
    old = _v1_recipe(before["recipe_yaml"], toy, tiny_bert)
    assert "version" not in yaml.safe_load(old)
    (run / "recipe.yaml").write_text(old)
    assert load_recipe(run / "recipe.yaml", saved=True).model_dump() == recipe.model_dump()
    answers = kgc.load(run, echo=None).predict("e_dog", "hypernym", top_k=3)
    assert [[e, round(float(s), 5)] for e, s in zip(answers["entity"], answers["score"])] == \
        [[e, pytest.approx(s, abs=2e-5)] for e, s in before["answers"]]


def test_version_1_recipes_upgrade_and_newer_ones_are_refused(tmp_path):
    from kgc.recipe import load_recipe

    # version 1 listed every conditioner's keys at their defaults: dropped; a changed one is still refused
    flat = tmp_path / "flat.yaml"
    flat.write_text("model: {conditioner: router, rank: null, dropout: 0.1, case_dim: null, router_layers: 2}\n"
                    "index: {type: hnsw, nlist: 100, nprobe: 8, ef_search: 16}\n"
                    "structure: {model: rules, dim: 50, rule_length: 1}\n")
    recipe = load_recipe(flat)
    assert recipe.version == CURRENT and recipe.model.router_layers == 2 and "rank" not in recipe.model.model_dump()
    assert recipe.index.model_dump() == {"type": "hnsw", "hnsw_m": 32, "ef_search": 16, "ef_construction": 40}
    assert recipe.structure.is_rules and recipe.structure.rule_length == 1
    assert "dim" not in recipe.structure.model_dump()
    assert yaml.safe_load(recipe.to_yaml())["version"] == CURRENT
    flat.write_text("model: {conditioner: router, rank: 8}\n")
    with pytest.raises(KGCError, match=r"model.rank: not read by model.conditioner=router \(only by hypernet\)"):
        load_recipe(flat)
    # a version-2 recipe has no foreign keys to drop: the member's keys only
    flat.write_text("version: 2\nindex: {type: hnsw, nprobe: 8}\n")
    with pytest.raises(KGCError, match=r"index.nprobe: not read by index.type=hnsw \(only by ivf, ivfpq\)"):
        load_recipe(flat)
    flat.write_text(f"version: {CURRENT + 1}\n")
    with pytest.raises(KGCError, match=f"a version {CURRENT + 1} recipe, newer than this kgc reads"):
        load_recipe(flat)
    flat.write_text("version: two\n")
    with pytest.raises(KGCError, match="is not a recipe version"):
        load_recipe(flat)


def test_each_member_owns_its_keys():
    """A key exists only under the member that reads it, and the recipe module names no member."""
    from kgc.recipe import load_recipe

    assert "rank" not in load_recipe(None, ["model.conditioner=router"]).model.model_dump()
    assert load_recipe(None, ["model.conditioner=hypernet", "model.rank=4"]).model.rank == 4
    with pytest.raises(KGCError, match=r"model.scorer: not read by model.conditioner=case \(only by router\)"):
        load_recipe(None, ["model.conditioner=case", "model.scorer=paper"])
    with pytest.raises(KGCError, match=r"model.conditioner 'nope': unknown conditioner. Available: biencoder, "):
        load_recipe(None, ["model.conditioner=nope"])
    with pytest.raises(KGCError, match=r"structure.rule_length: not read by structure.model=pykeen \(only by rules\)"):
        load_recipe(None, ["structure.model=RotatE", "structure.rule_length=1"])
    with pytest.raises(KGCError, match=r"loss.mse_weight: read only by task csts"):
        load_recipe(None, ["loss.mse_weight=2"])
    with pytest.raises(KGCError, match=r"model.shared_towers: read only by task linkpred, and this recipe has task "
                                       r"csts"):
        load_recipe(None, ["task=csts", "data.dataset=synth-csts", "model.shared_towers=true"])


def test_link_prediction_owns_its_model_keys(tmp_path):
    """shared_towers and tail_map_rank are link prediction's (LinkPredModelKeys) under every conditioner, not in a
    C-STS recipe; a version-2 C-STS recipe that listed them at their defaults loads (migration 2 -> 3), one that set
    them is refused as version 2 refused it."""
    from kgc.recipe import load_recipe

    for cond in ("biencoder", "router", "hypernet"):
        lp = load_recipe(None, [f"model.conditioner={cond}", "model.shared_towers=true", "model.tail_map_rank=3"])
        assert lp.model.shared_towers is True and lp.model.tail_map_rank == 3
        assert not {"shared_towers", "tail_map_rank"} & set(lp.model.options())  # not a conditioner's option
    cs = load_recipe(None, ["task=csts", "data.dataset=synth-csts"])
    assert not {"shared_towers", "tail_map_rank"} & set(cs.model.model_dump())
    assert "shared_towers" not in cs.to_yaml()
    old = tmp_path / "csts_v2.yaml"
    old.write_text("version: 2\ntask: csts\ndata: {dataset: synth-csts}\n"
                   "model: {conditioner: hadamard, shared_towers: false, tail_map_rank: null}\n")
    recipe = load_recipe(old)
    assert recipe.version == CURRENT and "shared_towers" not in recipe.model.model_dump()
    old.write_text("version: 2\ntask: csts\ndata: {dataset: synth-csts}\nmodel: {shared_towers: true}\n")
    with pytest.raises(KGCError, match=r"model.shared_towers: read only by task linkpred"):
        load_recipe(old)
    current = tmp_path / "lp_v3.yaml"  # the keys' own place today: a link-prediction recipe keeps them, any version
    for version in (2, CURRENT):
        current.write_text(f"version: {version}\nmodel: {{shared_towers: true, tail_map_rank: 2}}\n")
        assert load_recipe(current).model.tail_map_rank == 2


# ---------------------------------------------------------------- runs saved at efc2a8e (before issue 53) and f3c8230
#                                                                   (before issue 65)

SAVED = {commit: json.loads((ROOT / "tests" / "data" / f"runs_at_{commit}.json").read_text())
         for commit in ("efc2a8e", "f3c8230")}


def _make_runs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_runs", ROOT / "tests" / "data" / "make_saved_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("commit, case", [(c, case) for c in SAVED for case in sorted(SAVED[c]["cases"])])
def test_a_run_saved_before_loads_and_answers_the_same(commit, case, toy, tiny_bert, tmp_path):
    """tests/data/runs_at_COMMIT.json (tests/data/make_saved_runs.py): a run that commit trained. Today's code
    trains the same weights, tensor by tensor (so best.pt is the file that commit wrote); the run's files as that
    commit wrote them (recipe.yaml, train_summary.json but its record of best.pt's bytes, the index's meta, the
    rules) replace today's, and the run loads, answers the same top 3 and evaluates to the same MRR."""
    import kgc
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    saved = SAVED[commit]
    before = saved["cases"][case]
    run = tmp_path / case
    recipe = load_recipe(None, [f"data.path={toy}", f"model.backbone={tiny_bert}"] + saved["common"] + before["sets"]
                         + [f"name={case}"])
    train(recipe, out=run, progress=False, echo=lambda m: None)
    make_runs = _make_runs()
    if saved["cpu"] == make_runs.cpu_key():  # the weights that commit wrote, every tensor and entry: bit for bit on a CPU
        assert make_runs.digest(run / "best.pt") == before["best"]  # of the model and kernel flags that wrote them
    else:  # another CPU's kernels round otherwise: the same tensors at least, and below: the same answers and MRR
        assert {k: v[:2] for k, v in make_runs.digest(run / "best.pt")["model"].items()} == \
            {k: v[:2] for k, v in before["best"]["model"].items()}
    files_now = json.loads((run / "train_summary.json").read_text())["files"]
    for name, text in before["files"].items():  # the run as that commit left it, with this machine's paths
        text = text.replace(before["paths"]["data"], str(toy)).replace(before["paths"]["backbone"], str(tiny_bert))
        if name == "train_summary.json":  # best.pt's sha256 and size: of this file (a staged write's archive
            text = json.dumps({**json.loads(text), "files": files_now})  # names differ from one save to the next)
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    loaded = kgc.load(run, echo=None)
    answers = loaded.predict("e_dog", "hypernym", top_k=3)
    assert [[e, round(float(s), 5)] for e, s in zip(answers["entity"], answers["score"])] == \
        [[e, pytest.approx(s, abs=2e-5)] for e, s in before["answers"]]
    results = loaded.evaluate("test")
    assert results["both"]["realistic"]["inverse_harmonic_mean_rank"] == pytest.approx(before["mrr"], abs=1e-6)
