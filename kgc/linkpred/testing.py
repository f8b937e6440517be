"""The checks a member of link prediction's own families must pass, for kgc's and for a plugin's alike
(:mod:`kgc.testing` holds the conditioner's and the tracker's):

* :func:`check_index_type`: its options validate with their defaults; built over clustered unit vectors it holds
  them all and finds the true nearest neighbours (recall@10 at least ``min_recall``), best first; a build key it
  declares is in the resolved parameters (a rebuild is detected by them).
* :func:`check_structure_kind`: trained on a small graph into a folder it writes ``meta.json`` (model, entities,
  relations, params), returns that meta, loads back, scores (batch, entities) finite, the same after another load,
  and ranks a split with kgc's filtered protocol.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kgc.conditioning.testing import fail


def check_index_type(name: str, *, n: int = 2000, dim: int = 32, min_recall: float = 0.9, **options: Any) -> None:
    """The contract of index type ``name`` (``kgc.registry.INDEX_TYPES``) with ``options`` (its recipe keys)."""
    from kgc.linkpred.bench.retrieval import clustered_unit_vectors
    from kgc.linkpred.index import types as index_types

    what = f"index type {name!r}"
    if name not in index_types.TYPES:
        fail(what, f"not registered (known: {', '.join(index_types.TYPES)})")
    kind = index_types.TYPES[name]
    defaults = kind.Options()
    if defaults.type != name:
        fail(what, f"its Options' type defaults to {defaults.type!r}")
    for key in (*kind.build, *kind.search):
        if key not in kind.Options.model_fields:
            fail(what, f"build/search key {key!r} is not a field of its Options")
    base = clustered_unit_vectors(n, dim, clusters=20, seed=1)  # what an index meets: entities in topics
    queries = clustered_unit_vectors(100, dim, clusters=20, seed=1, stream=1)  # held out
    params = index_types.resolve(index_types.index_config(None, type=name, **options), n, dim)
    if params.get("type") != name:
        fail(what, f"resolve() gave type {params.get('type')!r}")
    missing = [k for k in kind.build if k not in params]
    if missing:
        fail(what, f"resolve() leaves out its build key(s) {missing} (a rebuild could not be detected)")
    index, _ = index_types.build(base, params, device="cpu")
    if index.ntotal != n:
        fail(what, f"holds {index.ntotal} vectors after building over {n}")
    scores, ids = index_types.search_index(index, queries, 10)
    if scores.shape != (100, 10) or ids.shape != (100, 10):
        fail(what, f"search gave {scores.shape} / {ids.shape}, not (queries, k)")
    if (np.diff(scores, axis=1) > 1e-5).any():
        fail(what, "hits are not best first")
    truth = np.argsort(-(queries @ base.T), axis=1, kind="stable")[:, :10]
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)]))
    if recall < min_recall:
        fail(what, f"recall@10 {recall:.3f} against exact search, below {min_recall}")


TOY = {"train": [("a0", "likes", "b0"), ("a1", "likes", "b1"), ("a2", "likes", "b2"), ("a3", "likes", "b0"),
                  ("b0", "near", "b1"), ("b1", "near", "b2"), ("b2", "near", "b3"), ("a0", "likes", "b3"),
                  ("a1", "near", "a2"), ("a2", "near", "a3"), ("a3", "likes", "b1"), ("c0", "likes", "b0"),
                  ("c0", "near", "a0"), ("c1", "likes", "b2"), ("c1", "near", "c0"), ("b3", "near", "b0")],
       "dev": [("a1", "likes", "b2"), ("c1", "near", "a1")],
       "test": [("a2", "likes", "b0"), ("c0", "near", "c1"), ("a3", "near", "a0")]}


def toy_graph(folder: Path):
    """A 12-entity, 2-relation KG-BERT folder written into ``folder``, read as kgc reads a dataset."""
    from kgc.data.formats import read_graph
    from kgc.fileio import write_text

    folder.mkdir(parents=True, exist_ok=True)
    ents = sorted({e for rows in TOY.values() for h, _, t in rows for e in (h, t)} | {"d0", "d1"})
    write_text(folder / "entity2text.txt", "".join(f"{e}\tentity {e}\n" for e in ents))
    write_text(folder / "relation2text.txt", "likes\tlikes\nnear\tis near\n")
    for split, rows in TOY.items():
        write_text(folder / f"{split}.tsv", "".join("\t".join(r) + "\n" for r in rows))
    return read_graph(folder)


def check_structure_kind(model: str, **options: Any) -> None:
    """The contract of the structural model kind that ``structure.model: MODEL`` selects (``kgc.registry.STRUCTURES``:
    ``rules``, a PyKEEN model name such as ``DistMult``, a plugin's), trained with ``options``."""
    import torch

    from kgc.linkpred.structure.kinds import kind_named
    from kgc.linkpred.structure.pykeen import rank_structure

    kind = kind_named(model)
    what = f"structure kind {kind.name!r} (model {model!r})"
    if not kind.selects(model):
        fail(what, f"does not select {model!r}, which named it")
    config = kind.Options(model=model, **options)
    with tempfile.TemporaryDirectory() as tmp:
        graph = toy_graph(Path(tmp) / "toy")
        folder = Path(tmp) / "structure"
        folder.mkdir()
        meta = kind.train(config, graph, folder, seed=0, device="cpu", progress=False, echo=lambda m: None)
        saved = json.loads((folder / "meta.json").read_text())
        for key in ("model", "entities", "relations", "params"):
            if key not in saved:
                fail(what, f"meta.json lacks {key!r}")
        if saved["entities"] != graph.num_entities or saved["relations"] != graph.num_relations:
            fail(what, "meta.json's entities/relations are not the graph's")
        if meta != saved:
            fail(what, "train() returned another meta than the meta.json it wrote")
        structure = kind.load(folder, saved, "cpu", "train it again")
        queries = graph.both_directions("test")
        scores = structure.scores(queries[:, 0], queries[:, 1])
        if tuple(scores.shape) != (len(queries), graph.num_entities) or not torch.isfinite(scores).all():
            fail(what, f"scores are {tuple(scores.shape)} (finite: {bool(torch.isfinite(scores).all())}), not "
                        f"({len(queries)}, {graph.num_entities}) finite numbers")
        again = kind.load(folder, saved, "cpu", "train it again").scores(queries[:, 0], queries[:, 1])
        if not torch.allclose(scores, again):
            fail(what, "another load scores differently")
        mrr = rank_structure(structure, graph, "test")["both"]["realistic"]["inverse_harmonic_mean_rank"]
        if not 0 < mrr <= 1:
            fail(what, f"kgc's filtered ranking of its scores gave MRR {mrr}")


