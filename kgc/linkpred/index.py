"""Entity index of a run: float32 embeddings (``.npy``) + a FAISS ``IndexFlatIP``, fingerprinted.

The fingerprint is (sha256 of the weights file, sha256 of every entity's token ids). An index whose
fingerprint does not match the run's current weights and texts is refused, never silently used.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import faiss
import numpy as np

from kgc.errors import KGCError
from kgc.fileio import write_json, write_with
from kgc.linkpred.model import LinkPredictor, Run


def fingerprint(run: Run, model: LinkPredictor) -> dict[str, str]:
    return {"weights_sha256": run.weights_fingerprint(), "texts_sha256": model.bank.fingerprint(),
            "weights_file": run.weights_file().name}


def build_index(run: Run, model: LinkPredictor, *, batch_size: int = 256, progress: bool = True) -> dict:
    start = time.perf_counter()
    table = model.entity_table(batch_size, progress=progress).numpy().astype(np.float32)  # (entities, dim)
    index = faiss.IndexFlatIP(table.shape[1])
    index.add(table)
    folder = run.path / "index"
    folder.mkdir(exist_ok=True)
    write_with(folder / "entities.npy", lambda tmp: np.save(open(tmp, "wb"), table))
    write_with(folder / "entities.faiss", lambda tmp: faiss.write_index(index, str(tmp)))
    meta = {**fingerprint(run, model), "entities": int(table.shape[0]), "dim": int(table.shape[1]),
            "seconds": round(time.perf_counter() - start, 2)}
    write_json(folder / "meta.json", meta)  # written last: an index without meta.json is incomplete
    return meta


def _check_fresh(run: Run, model: LinkPredictor) -> Path:
    folder = run.path / "index"
    if not (folder / "meta.json").is_file():
        raise KGCError(f"{run.path}: no index yet. Build it with `kgc index {run.path}`.")
    meta = json.loads((folder / "meta.json").read_text())
    current = fingerprint(run, model)
    stale = [k for k in ("weights_sha256", "texts_sha256") if meta.get(k) != current[k]]
    if stale:
        what = " and ".join("model weights" if k.startswith("weights") else "entity texts" for k in stale)
        raise KGCError(f"{folder} is stale: it was built from other {what}. Rebuild it with `kgc index {run.path}`.")
    return folder


def load_embeddings(run: Run, model: LinkPredictor) -> np.ndarray | None:
    """(entities, dim) from a fresh index, or None when there is none (a stale one is an error)."""
    if not (run.path / "index" / "meta.json").is_file():
        return None
    return np.load(_check_fresh(run, model) / "entities.npy")


def load_index(run: Run, model: LinkPredictor) -> faiss.Index:
    folder = _check_fresh(run, model)
    index = faiss.read_index(str(folder / "entities.faiss"))
    if index.ntotal != model.bank.graph.num_entities:
        raise KGCError(f"{folder}: holds {index.ntotal} entities, the graph has {model.bank.graph.num_entities}. "
                       f"Rebuild it with `kgc index {run.path}`.")
    return index
