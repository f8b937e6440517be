"""Entity index types (flat, ivf, hnsw, ivfpq, sq): neighbours vs brute force, the fingerprint in meta.json, rebuilds
when the type changes, the bench, and bad parameters. Fast: small synthetic sets, a stand-in run and model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import faiss
import numpy as np
import pytest
import torch

from kgc.linkpred.bench.retrieval import bench_index, clustered_unit_vectors, index_table
from kgc.errors import KGCError
from kgc.linkpred.index import types as index_types
from kgc.linkpred.answer.entities import EntityIndex
from kgc.linkpred.index.records import stored_config
from kgc.linkpred.index.store import (build_index, index_params, index_plan, load_embeddings, load_index,
                                      update_search_params)
from kgc.linkpred.index.types import TYPES, index_config, resolve, search_index
from kgc.linkpred.index.types import index_options
from kgc.recipe import load_recipe

# recall@10 each type must reach on 5k × 32 clustered vectors with its default parameters
MIN_RECALL = {"flat": 0.999, "ivf": 0.95, "hnsw": 0.95, "ivfpq": 0.4, "sq": 0.99}
SCORE_ATOL = {"sq": 2e-3}  # fp16 codes: cosines within fp16's rounding (the others store float32 vectors)


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
    if kind != "ivfpq":  # vectors not product-quantised: the scores are the cosines of the returned entities
        np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, base[ids]), atol=SCORE_ATOL.get(kind, 1e-5))
    one_scores, one_ids = search_index(index, queries[0], 3)  # one query as a vector
    assert one_ids.shape == (1, 3) and list(one_ids[0]) == list(ids[0, :3])


def test_defaults_scale_with_the_entity_count():
    assert index_types.default_nlist(1_000_000) == 4000
    assert index_types.default_nlist(5000) == 128  # at most N / 39 (FAISS's training points per cell)
    assert index_types.default_nlist(100) == 2 and index_types.default_nlist(10) == 1
    assert index_types.default_pq_bytes(384) == 48 and index_types.default_pq_bytes(32) == 4
    p = resolve(index_config(None, type="ivfpq"), 1_000_000, 384)
    assert p == {"type": "ivfpq", "nlist": 4000, "pq_bytes": 48, "train_size": 256_000, "nprobe": 32, "rescore": 10}
    assert resolve(index_options({"type": "ivfpq", "rescore": None}), 5000, 32)["rescore"] == 1  # null: off
    assert resolve(index_config(None, type="ivf", nprobe=500), 5000, 32)["nprobe"] == 128  # capped at nlist
    assert resolve(index_options(), 10, 4) == {"type": "flat"}


# ---------------------------------------------------------------- a run's index (stand-in run and model)


class StandInModel:
    """What the index reads of a LinkPredictor: the entity table, the text fingerprint, the entity count, the
    precision the table is encoded in."""

    precision = "fp32"

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
    with pytest.raises(KGCError, match=r"index.type 'annoy': unknown. Choose one of flat, hnsw, ivf, ivfpq, sq"):
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
    with pytest.raises(KGCError, match=r"'index.type': unknown \('annoy'\). Choose one of 'flat', 'hnsw', 'ivf', 'ivfpq', 'sq'"):
        load_recipe(None, ["index.type=annoy"])
    with pytest.raises(KGCError, match="read only by task linkpred"):
        load_recipe(None, ["task=csts", "data.dataset=synth-csts", "index.type=ivf"])
    with pytest.raises(KGCError, match="--types annoy: unknown index type. Choose from flat, hnsw, ivf, ivfpq, sq"):
        bench_index(entities=100, dim=8, queries=5, types=("flat", "annoy"))
    with pytest.raises(KGCError, match="dim 32"):
        search_index(faiss.IndexFlatIP(32), vectors[1][:, :16], 10)


def test_recipe_round_trip_keeps_the_index_section():
    recipe = load_recipe(None, ["index.type=hnsw", "index.ef_search=100"])
    assert "index:" in recipe.to_yaml() and recipe.index.ef_search == 100
    assert "index:" not in load_recipe(None, ["task=csts", "data.dataset=synth-csts"]).to_yaml()


def test_bench_rows(tmp_path):
    result = bench_index(entities=2000, dim=16, queries=50, types=("flat", "ivf", "hnsw", "ivfpq"), nprobe=(2, 8),
                         ef_search=(16,), rescore=(1, 10), clusters=20, repeats=1, echo=lambda m: None)
    assert [(r["label"], r["params"].get("nprobe", r["params"].get("ef_search")), r["params"].get("rescore"))
            for r in result["rows"]] == [
        ("flat", None, None), ("ivf", 2, None), ("ivf", 8, None), ("hnsw", 16, None), ("ivfpq", 2, 1),
        ("ivfpq+rescore", 2, 10), ("ivfpq", 8, 1), ("ivfpq+rescore", 8, 10)]
    keys = {"type", "label", "params", "factory", "device", "build_seconds", "train_seconds", "add_seconds",
            "index_bytes", "bytes_per_entity", "mmap_bytes_per_entity", "search_seconds", "queries_per_s",
            "speedup_vs_flat", "recall_at_10"}
    assert all(set(r) == keys for r in result["rows"])
    flat = result["rows"][0]
    assert flat["recall_at_10"] == 1.0 and flat["speedup_vs_flat"] == 1.0 and flat["bytes_per_entity"] >= 16 * 4
    assert all(0 <= r["recall_at_10"] <= 1 and r["queries_per_s"] > 0 for r in result["rows"])
    plain, rescored = result["rows"][-2:]
    assert rescored["type"] == "ivfpq" and rescored["bytes_per_entity"] == plain["bytes_per_entity"] \
        < flat["bytes_per_entity"]  # ivfpq compresses; re-scoring reads the table from disk, not RAM
    assert (plain["mmap_bytes_per_entity"], rescored["mmap_bytes_per_entity"]) == (0, 16 * 4)
    assert rescored["recall_at_10"] > plain["recall_at_10"]
    table = index_table(result)
    assert table.count("\n") == 1 + len(result["rows"]) and "| ivf | nlist=51, train_size=2000, nprobe=8 |" in table
    assert "| ivfpq+rescore | nlist=51, pq_bytes=2, train_size=2000, nprobe=8, rescore=10 |" in table


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
    res = CliRunner().invoke(app, ["bench", "index", "--entities", "600", "--dim", "8", "--queries", "20",
                                   "--types", "ivfpq", "--nprobe", "15", "--rescore", "1,20", "--repeats", "1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["label"], r["params"]["rescore"]) for r in rows] == [("ivfpq", 1), ("ivfpq+rescore", 20)]
    assert "least RAM at recall@10 >= 0.95: ivfpq (" in res.output and "rescore=20" in res.output


# ---------------------------------------------------------------- ivfpq with exact re-scoring (issue 40)


def _recall_at(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(ids, truth)]))


def test_rescored_ivfpq_finds_the_true_neighbours_with_exact_scores(vectors, tmp_path):
    base, queries = vectors
    params = resolve(index_config(None, type="ivfpq"), *base.shape)  # the defaults: rescore 10
    assert params["rescore"] == 10 and "rescore" in index_types.search_params(params)
    index, _ = index_types.build(base, params, device="cpu")
    np.save(tmp_path / "entities.npy", base)
    table = np.load(tmp_path / "entities.npy", mmap_mode="r")  # as a run's index reads it
    rescored = index_types.with_rescore(index, table, params)
    assert isinstance(rescored, index_types.RescoredIndex) and index_types.type_of(rescored) == "ivfpq"
    assert index_types.with_rescore(index, table, {**params, "rescore": 1}) is index  # 1: off
    truth = brute_force(base, queries, 10)
    _, plain_ids = search_index(index, queries, 10)
    scores, ids = search_index(rescored, queries, 10)
    assert ids.shape == (100, 10) and (ids >= 0).all() and (np.diff(scores, axis=1) <= 0).all()
    plain, exact = _recall_at(plain_ids, truth), _recall_at(ids, truth)
    assert exact >= 0.95 and exact > plain, (plain, exact)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, base[ids]), atol=1e-5)  # exact cosines
    rescored.BLOCK_BYTES = 4 * 100 * 32 * 7  # 7 queries (of 100 candidates) a block: the same answers
    np.testing.assert_array_equal(search_index(rescored, queries, 10)[1], ids)
    assert index_types.index_bytes(rescored) == index_types.index_bytes(index) < base.nbytes  # the table: not RAM


def test_rescore_is_a_search_key_of_ivfpq_and_sq():
    with pytest.raises(KGCError, match=r"index.rescore: not read by index type ivf \(only by ivfpq, sq\). Drop it"):
        index_config(None, type="ivf", rescore=10)
    with pytest.raises(KGCError, match=r"index.rescore: not read by index type hnsw \(only by ivfpq, sq\)"):
        index_config(None, type="hnsw", rescore=10)
    with pytest.raises(KGCError, match=r"index.rescore: Input should be greater than or equal to 1"):
        index_config(None, type="ivfpq", rescore=0)
    with pytest.raises(KGCError, match=r"index.rescore"):
        load_recipe(None, ["index.type=ivf", "index.rescore=10"])
    assert load_recipe(None, ["index.type=ivfpq", "index.rescore=20"]).index.rescore == 20
    from kgc.recipe import key_reference

    row = next(r for r in key_reference() if r["key"] == "index.rescore")
    assert row["default"] == "10" and "exact" in row["description"] and "ivfpq" in row["for"]


@pytest.fixture()
def ivfpq_run(tmp_path, vectors):
    run = StandInRun(tmp_path / "run", {"type": "ivfpq"})  # the defaults: nlist 128, nprobe 32, rescore 10
    run.path.mkdir()
    return run, StandInModel(vectors[0])


def test_a_run_with_ivfpq_answers_through_exact_rescoring(ivfpq_run, vectors):
    from kgc.linkpred.answer.topk import search_many

    run, model = ivfpq_run
    base, queries = vectors
    meta = build_index(run, model, progress=False)
    assert meta["index"] == {"type": "ivfpq", "nlist": 128, "pq_bytes": 4, "train_size": 5000, "nprobe": 32,
                             "rescore": 10}
    index = load_index(run, model)
    assert isinstance(index, index_types.RescoredIndex) and index.factor == 10 and index.index.nprobe == 32
    assert isinstance(index.table, np.memmap) and index.ntotal == 5000  # entities.npy, memory-mapped
    scores, ids = search_index(index, queries, 10)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, base[ids]), atol=1e-5)
    assert _recall_at(ids, brute_force(base, queries, 10)) >= 0.95
    # the run's query path: its EntityIndex reads the index once, kgc predict / serve search it with search_many
    graph = SimpleNamespace(num_entities=5000, entities=[f"e{i}" for i in range(5000)], full_texts=[""] * 5000,
                            names=[""] * 5000)
    entities = EntityIndex(run, torch.device("cpu"), model=lambda: model, graph=lambda: graph, tokenizer=lambda: None,
                           batch_size=8, echo=lambda m: None)
    searched, full, _ = entities.searcher()
    assert isinstance(searched, index_types.RescoredIndex) and full is graph
    answers = search_many(queries[:2], searched, graph, top_ks=[3, 3], excludes=[set(), {int(ids[1, 0])}],
                          knowns=[set(), set()])
    assert [[p.entity for p in row] for row in answers] == [[f"e{i}" for i in ids[0, :3]],
                                                            [f"e{i}" for i in ids[1, 1:4]]]
    np.testing.assert_allclose([p.score for p in answers[0]], scores[0, :3], atol=1e-6)  # exact cosines
    plain = load_index(run, model, rescore=1)  # a search-time override: the FAISS index alone
    assert isinstance(plain, faiss.IndexIVFPQ)


def test_rescore_on_an_ivf_run_is_refused(run_and_model):
    run, model = run_and_model  # an ivf index: rescore is not one of its keys, at load as in the recipe
    run.path.mkdir()
    build_index(run, model, progress=False)
    with pytest.raises(KGCError, match=r"index.rescore: not read by index type ivf \(only by ivfpq, sq\)"):
        load_index(run, model, rescore=10)
    assert isinstance(load_index(run, model), faiss.IndexIVFFlat)  # ivf is searched as before


def test_changing_rescore_needs_no_rebuild(ivfpq_run):
    run, model = ivfpq_run
    build_index(run, model, progress=False)
    faiss_file = run.path / "index" / "entities.faiss"
    before = faiss_file.stat().st_mtime_ns
    stored = stored_config(run)
    off = stored.model_copy(update={"rescore": 1})
    assert index_plan(run, model, off) == ("search", "nprobe=32, rescore=10 -> nprobe=32, rescore=1")
    meta = update_search_params(run, model, off)
    assert meta["index"]["rescore"] == 1 and faiss_file.stat().st_mtime_ns == before
    assert isinstance(load_index(run, model), faiss.IndexIVFPQ) and index_plan(run, model, off)[0] == "none"
    wide = off.model_copy(update={"rescore": 40})
    update_search_params(run, model, wide)
    assert load_index(run, model).factor == 40 and faiss_file.stat().st_mtime_ns == before
    entities = EntityIndex(run, torch.device("cpu"), model=lambda: model, graph=lambda: None, tokenizer=lambda: None,
                           batch_size=8, echo=lambda m: None)
    done = entities.update(rescore=20, progress=False)  # `kgc index RUN --rescore 20`
    assert (done["action"], done["why"]) == ("search", "nprobe=32, rescore=40 -> nprobe=32, rescore=20")
    assert done["meta"]["index"]["rescore"] == 20 and faiss_file.stat().st_mtime_ns == before
    with pytest.raises(KGCError, match=r"index.rescore: Input should be greater than or equal to 1"):
        entities.update(rescore=0, progress=False)
    meta = json.loads((run.path / "index" / "meta.json").read_text())
    del meta["index"]["rescore"]  # an ivfpq index from before rescore: searched as it was, until updated
    (run.path / "index" / "meta.json").write_text(json.dumps(meta))
    assert isinstance(load_index(run, model), faiss.IndexIVFPQ)
    assert index_plan(run, model, stored_config(run))[0] == "search"  # `kgc index RUN` stores the default


def test_added_entities_are_rescored_from_the_grown_table(ivfpq_run, vectors, monkeypatch):
    from kgc.linkpred.index import store
    from kgc.linkpred.index.added import NewEntity

    run, model = ivfpq_run
    base, queries = vectors
    build_index(run, model, progress=False)
    new = queries[:3]  # added entities: the queries themselves, so each is its own nearest neighbour
    monkeypatch.setattr(store, "_embed_new", lambda *a, **k: new.copy())  # the stand-in model has no tail tower
    entities = [NewEntity(f"new{i}", f"new {i}") for i in range(3)]
    store._append(run, model, SimpleNamespace(num_entities=5000), entities, sources=[], batch_size=8, progress=False)
    index = load_index(run, model)
    assert isinstance(index, index_types.RescoredIndex) and index.ntotal == index.table.shape[0] == 5003
    scores, ids = search_index(index, queries[:3], 5)
    assert ids[:, 0].tolist() == [5000, 5001, 5002]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)  # each added row, scored exactly from the new table
    grown = np.concatenate([base, new])
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries[:3], grown[ids]), atol=1e-5)


# ---------------------------------------------------------------- sq: flat's search over 2- or 1-byte codes


@pytest.mark.parametrize("codes, width, recall", [("fp16", 2, 0.99), ("bf16", 2, 0.98), ("8bit", 1, 0.95)])
def test_sq_keeps_the_neighbours_in_half_or_a_quarter_of_flats_ram(codes, width, recall, vectors):
    base, queries = vectors
    flat_params = resolve(index_config(None, type="flat"), *base.shape)
    flat, _ = index_types.build(base, flat_params, device="cpu")
    params = resolve(index_config(None, type="sq", sq_codes=codes), *base.shape)
    assert params == {"type": "sq", "sq_codes": codes, "rescore": 1}
    index, info = index_types.build(base, params, device="cpu")
    assert type(index).__name__ == "IndexScalarQuantizer" and index_types.type_of(index) == "sq"
    assert "sq" in index_types.types_of(index)  # (the plugin demo's sq8 builds the same class: tests/test_plugins.py)
    assert info["factory"] == {"fp16": "SQfp16", "bf16": "SQbf16", "8bit": "SQ8"}[codes]
    per_entity = index_types.index_bytes(index) / len(base)
    assert width * 32 <= per_entity < width * 32 + 1  # 32 dims of `width` bytes, a few header bytes
    assert index_types.index_bytes(flat) == 4 * 32 * len(base)
    truth = brute_force(base, queries, 10)
    scores, ids = search_index(index, queries, 10)
    got = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)])
    assert got >= recall, f"{codes}: recall@10 {got:.3f}"
    exact = np.einsum("qd,qkd->qk", queries, base[ids])
    np.testing.assert_allclose(scores, exact, atol={"fp16": 2e-3, "bf16": 1e-2, "8bit": 3e-2}[codes])
    rescored = index_types.with_rescore(index, base, {**params, "rescore": 10})  # the top 100 re-scored exactly
    r_scores, r_ids = search_index(rescored, queries, 10)
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r_ids, truth)]) >= 0.999
    np.testing.assert_allclose(r_scores, np.einsum("qd,qkd->qk", queries, base[r_ids]), atol=1e-5)


def test_sq_reads_its_codes_and_rescore_only():
    with pytest.raises(KGCError, match=r"index.train_size: not read by index type sq"):
        index_config(None, type="sq", train_size=100)
    with pytest.raises(KGCError, match=r"index.sq_codes"):
        index_config(None, type="sq", sq_codes="int4")


def test_a_run_with_sq_stores_half_the_bytes_and_rescores_on_request(tmp_path, vectors):
    run, model = StandInRun(tmp_path / "run", {"type": "sq"}), StandInModel(vectors[0])
    run.path.mkdir()
    base, queries = vectors
    meta = build_index(run, model, progress=False)
    assert meta["index"] == {"type": "sq", "sq_codes": "fp16", "rescore": 1}
    assert meta["faiss"]["factory"] == "SQfp16" and 2 * 32 * 5000 <= meta["faiss"]["bytes"] < 4 * 32 * 5000
    assert (run.index / "entities.faiss").stat().st_size < (run.index / "entities.npy").stat().st_size * 0.51
    index = load_index(run, model)
    assert isinstance(index, faiss.IndexScalarQuantizer)
    rescored = load_index(run, model, rescore=10)  # a search-time override: exact cosines from entities.npy
    assert isinstance(rescored, index_types.RescoredIndex) and isinstance(rescored.table, np.memmap)
    scores, ids = search_index(rescored, queries, 10)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, base[ids]), atol=1e-5)
    assert index_plan(run, model, index_config(None, type="sq", sq_codes="8bit"))[0] == "build"  # a build key
