"""The flat index without FAISS: :class:`ExactIndex` returns what FAISS's ``IndexFlatIP`` returns on the same
vectors (in blocks of queries, and after ``add``), and kgc trains, indexes, evaluates, predicts and adds entities
with a flat index in a process where ``import faiss`` fails, as on a machine without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kgc.linkpred.index.types import ExactIndex, search_index
from tests.conftest import ROOT, SHARED_DATA, write_toy
from tests.test_cli_smoke import toy_recipe


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_exact_index_returns_what_faiss_flat_returns(monkeypatch):
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(3)
    base, queries, more = (_unit(rng.standard_normal((n, 48))) for n in (2000, 37, 300))
    ref = faiss.IndexFlatIP(48)
    ref.add(base)
    exact = ExactIndex(base)
    monkeypatch.setattr(ExactIndex, "BLOCK_SCORES", 5 * 2000)  # 5 queries a block: 8 blocks, the last of 2
    for _ in range(2):
        scores, ids = exact.search(queries, 10)
        want_scores, want_ids = ref.search(queries, 10)
        assert ids.dtype == np.int64 and ids.shape == (37, 10) and exact.ntotal == ref.ntotal
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
        exact.add(more)  # then the same after adding rows
        ref.add(more)
    _, one = search_index(exact, queries[3], 4)  # one query as a vector, through the module's search
    assert one.tolist() == [want_ids[3, :4].tolist()]
    assert exact.search(queries[:0], 5)[1].shape == (0, 5)


NO_FAISS = textwrap.dedent("""
    import json, sys
    sys.modules["faiss"] = None  # `import faiss` raises ImportError, as where it is not installed
    import kgc
    from kgc.errors import KGCError

    recipe, out, new = sys.argv[1:]
    run = kgc.train(recipe, out, progress=False, echo=None)
    results = run.evaluate("test", progress=False)
    meta = run.index(progress=False)["meta"]
    answers = run.predict("e_dog", "hypernym", top_k=3)
    added = run.add_entities(new, progress=False)
    try:
        run.index(type="hnsw", progress=False)
        refused = ""
    except KGCError as exc:
        refused = str(exc)
    print(json.dumps({"mrr": results["both"]["realistic"]["inverse_harmonic_mean_rank"],
                      "files": sorted(p.name for p in (run.path / "index").iterdir()),
                      "engine": meta.get("exact"), "answers": answers["entity"].tolist(),
                      "added": added["entities"],
                      "refused": refused, "faiss": sys.modules["faiss"] is None}))
""")


@pytest.mark.slow
def test_kgc_runs_a_flat_index_without_faiss(tiny_bert, tmp_path):
    data = write_toy(tmp_path / "TOY")
    recipe = toy_recipe(tmp_path / "r.yaml", tiny_bert, data, {"conditioner": "biencoder"}, max_steps=1)
    new = tmp_path / "new.tsv"
    new.write_text("e_quito\tQuito\tcapital of Ecuador\n")
    env = {**os.environ, "KGC_DATA_HOME": str(SHARED_DATA), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "KGC_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", NO_FAISS, recipe, tmp_path / "run", new], capture_output=True,
                         text=True, env=env, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["faiss"], "faiss was imported after all"
    assert 0 < out["mrr"] <= 1
    assert out["files"] == ["added_entities.tsv", "entities.npy", "meta.json"]  # no entities.faiss
    assert out["engine"]["engine"] == "torch"
    assert len(out["answers"]) == 3 and "e_dog" not in out["answers"]
    assert out["added"] == 7  # the toy graph's 6 entities and Quito
    assert "need FAISS, which is not installed" in out["refused"] and "index.type=flat" in out["refused"]


def test_a_long_row_is_cut_into_pieces_for_its_top_k(monkeypatch):
    import torch

    import kgc.linkpred.index.exact as index_types

    monkeypatch.setattr(index_types, "SPLIT_TOPK", 100)  # as past 1M entities
    torch.manual_seed(0)
    for n, k in [(3000, 10), (3001, 7), (40_000, 50), (5000, 1)]:
        scores = torch.randn(3, n)
        got, want = index_types._topk(scores, k), torch.topk(scores, k, dim=1)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (n, k)
