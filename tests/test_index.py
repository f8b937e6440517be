"""Entity index types (flat, ivf, hnsw, ivfpq): neighbours vs brute force, the fingerprint in meta.json, rebuilds
when the type changes, the bench, and bad parameters. Fast: small synthetic sets, a stand-in run and model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import faiss
import numpy as np
import pytest
import torch

from kgc.linkpred.bench import bench_index, clustered_unit_vectors, index_table
from kgc.errors import KGCError
from kgc.linkpred import index_types
from kgc.linkpred.index import (build_index, index_params, index_plan, load_embeddings, load_index, stored_config,
                                update_search_params)
from kgc.linkpred.index_types import TYPES, index_config, resolve, search_index
from kgc.linkpred.index_types import index_options
from kgc.recipe import load_recipe

# recall@10 each type must reach on 5k × 32 clustered vectors with its default parameters
MIN_RECALL = {"flat": 0.999, "ivf": 0.95, "hnsw": 0.95, "ivfpq": 0.4}


@pytest.fixture(scope="module")
def vectors() -> tuple[np.ndarray, np.ndarray]:
    base = clustered_unit_vectors(5000, 32, clusters=100, seed=1)  # (5000, 32)
    queries = clustered_unit_vectors(100, 32, clusters=100, seed=1, stream=1)  # (100, 32), not in base
    return base, queries


def brute_force(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ base.T), axis=1, kind="stable")[:, :k]  # (queries, k)


def test_every_type_has_a_recall_bound():
    assert set(MIN_RECALL) == set(TYPES), "a new index type needs its bound in MIN_RECALL (and passes the test)"


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_type_finds_the_true_neighbours(kind, vectors):
    base, queries = vectors
    params = resolve(index_config(None, type=kind), *base.shape)
    index, info = index_types.build(base, params, device="cpu")
    assert index_types.type_of(index) == kind and index.ntotal == len(base) and info["device"] == "cpu"
    scores, ids = search_index(index, queries, 10)
    assert scores.shape == ids.shape == (100, 10) and (ids >= 0).all()
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
    truth = brute_force(base, queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)])
    assert recall >= MIN_RECALL[kind], f"{kind}: recall@10 {recall:.3f}"
    if kind != "ivfpq":  # uncompressed vectors: the scores are the exact cosines of the returned entities
        np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, base[ids]), atol=1e-5)
    one_scores, one_ids = search_index(index, queries[0], 3)  # one query as a vector
    assert one_ids.shape == (1, 3) and list(one_ids[0]) == list(ids[0, :3])


def test_defaults_scale_with_the_entity_count():
    assert index_types.default_nlist(1_000_000) == 4000
    assert index_types.default_nlist(5000) == 128  # at most N / 39 (FAISS's training points per cell)
    assert index_types.default_nlist(100) == 2 and index_types.default_nlist(10) == 1
    assert index_types.default_pq_bytes(384) == 48 and index_types.default_pq_bytes(32) == 4
    p = resolve(index_config(None, type="ivfpq"), 1_000_000, 384)
    assert p == {"type": "ivfpq", "nlist": 4000, "pq_bytes": 48, "train_size": 256_000, "nprobe": 32}
    assert resolve(index_config(None, type="ivf", nprobe=500), 5000, 32)["nprobe"] == 128  # capped at nlist
    assert resolve(index_options(), 10, 4) == {"type": "flat"}


# ---------------------------------------------------------------- a run's index (stand-in run and model)


class StandInModel:
    """What the index reads of a LinkPredictor: the entity table, the text fingerprint, the entity count."""

    def __init__(self, table: np.ndarray):
        self.table, self.embedded = table, 0
        self.bank = SimpleNamespace(graph=SimpleNamespace(num_entities=len(table)), fingerprint=lambda: "texts-1")

    def entity_table(self, batch_size: int = 256, progress: bool = False) -> torch.Tensor:
        self.embedded += 1
        return torch.from_numpy(self.table.copy())


class StandInRun:
    def __init__(self, path: Path, index: dict | None = None):
        self.path, self.weights = path, "weights-1"
        self.recipe = load_recipe(None, [f"index.{k}={v}" for k, v in (index or {}).items()])

    @property
    def index(self) -> Path:  # RunDir.index
        return self.path / "index"

    def weights_fingerprint(self) -> str:
        return self.weights

    def weights_file(self) -> Path:
        return Path("best.pt")


@pytest.fixture()
def run_and_model(tmp_path, vectors):
    return StandInRun(tmp_path / "run", {"type": "ivf", "nlist": 32, "nprobe": 4}), StandInModel(vectors[0])


def test_meta_records_type_and_parameters(run_and_model):
    run, model = run_and_model
    run.path.mkdir()
    meta = build_index(run, model, progress=False)  # the recipe's index: section
    assert meta["index"] == {"type": "ivf", "nlist": 32, "train_size": 2048, "nprobe": 4}
    assert meta["faiss"]["factory"] == "IVF32,Flat" and meta["faiss"]["device"] == "cpu"
    assert meta["faiss"]["bytes"] > 5000 * 32 * 4 and meta["embeddings"] == "computed"
    assert json.loads((run.path / "index" / "meta.json").read_text()) == meta
    index = load_index(run, model)
    assert isinstance(index, faiss.IndexIVFFlat) and index.nprobe == 4 and index.nlist == 32
    assert index_params(run, model) == {**meta["index"], "exact": False}
    assert load_index(run, model, nprobe=16).nprobe == 16  # a search-time override, nothing rebuilt
    np.testing.assert_array_equal(load_embeddings(run, model), model.table)  # the exact table, for evaluation
    with pytest.raises(KGCError, match="index.ef_search: not read by index type ivf"):
        load_index(run, model, ef_search=32)


def test_changed_type_is_detected_and_rebuilt_from_stored_embeddings(run_and_model):
    run, model = run_and_model
    run.path.mkdir()
    build_index(run, model, progress=False, config=index_options())  # flat
    assert index_plan(run, model, index_options()) == ("none", "up to date (flat)")
    action, why = index_plan(run, model, index_config(None, type="hnsw", hnsw_m=16))
    assert action == "build" and "it is flat, asked for hnsw (hnsw_m=16" in why
    meta = build_index(run, model, progress=False, config=index_config(None, type="hnsw", hnsw_m=16))
    assert model.embedded == 1 and meta["embeddings"] == "reused"  # only the FAISS structure was rebuilt
    assert meta["index"] == {"type": "hnsw", "hnsw_m": 16, "ef_construction": 40, "ef_search": 64}
    index = load_index(run, model)
    assert isinstance(index, faiss.IndexHNSWFlat) and index.hnsw.efSearch == 64

    wider = index_config(None, type="hnsw", hnsw_m=16, ef_search=200)  # search-time only: no rebuild
    assert index_plan(run, model, wider) == ("search", "ef_search=64 -> ef_search=200")
    update_search_params(run, model, wider)
    assert load_index(run, model).hnsw.efSearch == 200 and index_plan(run, model, wider)[0] == "none"

    run.weights = "weights-2"  # retrained: stale whatever the type, and the entities are embedded again
    assert index_plan(run, model, wider) == ("build", "it was built from other model weights")
    with pytest.raises(KGCError, match="stale"):
        load_index(run, model)
    assert stored_config(run) == wider  # what rebuilds the stale index as the type it was
    assert build_index(run, model, progress=False, config=wider)["embeddings"] == "computed" and model.embedded == 2


def test_index_file_that_disagrees_with_meta_is_refused(run_and_model):
    run, model = run_and_model
    run.path.mkdir()
    build_index(run, model, progress=False)
    folder = run.path / "index"
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "index": {"type": "hnsw", "hnsw_m": 32,
                                                                    "ef_construction": 40, "ef_search": 64}}))
    with pytest.raises(KGCError, match=r"meta.json records a hnsw .* entities.faiss holds ivf.*kgc index"):
        load_index(run, model)
    old = {k: v for k, v in meta.items() if k not in ("index", "faiss", "embeddings", "files")}  # before index types
    (folder / "meta.json").write_text(json.dumps(old))
    index = load_index(run, model)  # an index from before index types is flat: entities.npy, searched in torch
    assert index_types.type_of(index) == "flat" and index.ntotal == 5000  # (entities.faiss is not read)
    np.save(folder / "entities.npy", model.table[:10])
    with pytest.raises(KGCError, match="holds 10 entities, the graph has 5000"):
        load_index(run, model)


def test_bad_parameters_name_the_key_and_the_fix(vectors):
    with pytest.raises(KGCError, match=r"index.type 'annoy': unknown. Choose one of flat, ivf, hnsw, ivfpq"):
        index_config(None, type="annoy")
    with pytest.raises(KGCError, match=r"index.pq_bytes=5 does not divide the embedding dim 32.*1, 2, 4, 8, 16, 32"):
        resolve(index_config(None, type="ivfpq", pq_bytes=5), 5000, 32)
    with pytest.raises(KGCError, match=r"index.nprobe: not read by index type hnsw \(only by ivf, ivfpq\). Drop it"):
        index_config(None, type="hnsw", nprobe=8)
    with pytest.raises(KGCError, match=r"index.nlist=900 is more cells than the 500 entities.*nlist <= 12"):
        resolve(index_config(None, type="ivf", nlist=900), 500, 32)
    with pytest.raises(KGCError, match=r"index.train_size=10 is too few to train 32 cells.*>= 32"):
        resolve(index_config(None, type="ivf", nlist=32, train_size=10), 5000, 32)
    with pytest.raises(KGCError, match="ivfpq needs at least 256 entities.*index.type=flat"):
        resolve(index_config(None, type="ivfpq"), 100, 32)
    with pytest.raises(KGCError, match=r"index.hnsw_m: Input should be greater than or equal to 2"):
        index_config(None, type="hnsw", hnsw_m=1)
    with pytest.raises(KGCError, match=r"'index.type': unknown \('annoy'\). Choose one of 'flat', 'ivf', 'hnsw', 'ivfpq'"):
        load_recipe(None, ["index.type=annoy"])
    with pytest.raises(KGCError, match="read only by task linkpred"):
        load_recipe(None, ["task=csts", "data.dataset=synth-csts", "index.type=ivf"])
    with pytest.raises(KGCError, match="--types annoy: unknown index type. Choose from flat, ivf, hnsw, ivfpq"):
        bench_index(entities=100, dim=8, queries=5, types=("flat", "annoy"))
    with pytest.raises(KGCError, match="dim 32"):
        search_index(faiss.IndexFlatIP(32), vectors[1][:, :16], 10)


def test_recipe_round_trip_keeps_the_index_section():
    recipe = load_recipe(None, ["index.type=hnsw", "index.ef_search=100"])
    assert "index:" in recipe.to_yaml() and recipe.index.ef_search == 100
    assert "index:" not in load_recipe(None, ["task=csts", "data.dataset=synth-csts"]).to_yaml()


def test_bench_rows(tmp_path):
    result = bench_index(entities=2000, dim=16, queries=50, types=("flat", "ivf", "hnsw", "ivfpq"), nprobe=(2, 8),
                         ef_search=(16,), clusters=20, repeats=1, echo=lambda m: None)
    assert [(r["type"], r["params"].get("nprobe", r["params"].get("ef_search"))) for r in result["rows"]] == [
        ("flat", None), ("ivf", 2), ("ivf", 8), ("hnsw", 16), ("ivfpq", 2), ("ivfpq", 8)]
    keys = {"type", "params", "factory", "device", "build_seconds", "train_seconds", "add_seconds", "index_bytes",
            "bytes_per_entity", "search_seconds", "queries_per_s", "speedup_vs_flat", "recall_at_10"}
    assert all(set(r) == keys for r in result["rows"])
    flat = result["rows"][0]
    assert flat["recall_at_10"] == 1.0 and flat["speedup_vs_flat"] == 1.0 and flat["bytes_per_entity"] >= 16 * 4
    assert all(0 <= r["recall_at_10"] <= 1 and r["queries_per_s"] > 0 for r in result["rows"])
    assert result["rows"][-1]["bytes_per_entity"] < flat["bytes_per_entity"]  # ivfpq compresses
    table = index_table(result)
    assert table.count("\n") == 1 + len(result["rows"]) and "| ivf | nlist=51, train_size=2000, nprobe=8 |" in table


def test_bench_cli(tmp_path):
    from typer.testing import CliRunner

    from kgc.cli import app

    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "index", "--entities", "600", "--dim", "8", "--queries", "20",
                                   "--types", "ivf", "--nprobe", "1,15", "--repeats", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["type"] for r in rows] == ["ivf", "ivf"] and rows[1]["recall_at_10"] == 1.0  # every cell visited
    bad = CliRunner().invoke(app, ["bench", "index", "--entities", "600", "--nprobe", "8,x"])
    assert isinstance(bad.exception, KGCError) and "--nprobe '8,x'" in str(bad.exception)
