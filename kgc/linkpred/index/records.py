"""What an index's ``meta.json`` records, read back: the fingerprint (sha256 of the weights file, sha256 of every
entity's token ids), the type and parameters it was built with, and the byte size and sha256 of every file of the
index (``files``), with the readers of the table and the FAISS file.

A file that does not match its record — truncated, overwritten, flipped bytes — makes the index *damaged*:
:func:`kgc.linkpred.index.store.stale_reason` says so, so whatever can rebuild it (``kgc predict``, ``kgc index``,
``kgc index --add``) does, and whatever cannot (``kgc evaluate``) stops with one message naming the file and
``kgc index RUN --force``. Sizes are checked on every load; a sha256 once per process and version of a file (its
size, time and inode), and only for files up to :data:`HASH_LIMIT` bytes (WN18RR's 63 MB table hashes in ~0.05 s;
a larger file is checked by size alone). An index written before ``files`` existed is checked by what it records
(the FAISS file's size).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kgc.errors import KGCError
from kgc.fileio import Transaction, recover, sha256_cached
from kgc.linkpred.index import types as index_types
from kgc.linkpred.index.added import ADDED_FILE
from kgc.linkpred.index.types import IndexOptions
from kgc.linkpred.model import LinkPredictor
from kgc.training.run import RunDir


def fingerprint(run: RunDir, model: LinkPredictor) -> dict[str, str]:
    return {"weights_sha256": run.weights_fingerprint(), "texts_sha256": model.bank.fingerprint(),
            "weights_file": run.weights_file().name}


def read_meta(folder: Path) -> dict | None:
    recover(folder)  # an add or build killed mid-commit is completed first (its journal names every rename)
    f = folder / "meta.json"
    if not f.is_file():
        return None
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedMeta(f, f"unreadable ({exc})") from None
    kind = (meta.get("index") or {}).get("type", "flat") if isinstance(meta, dict) else None
    if kind not in index_types.TYPES:
        raise DamagedMeta(f, f"not an index description kgc wrote (index type {kind!r})")
    return meta


class DamagedMeta(KGCError):
    """An index's meta.json that cannot be read. The fix rebuilds, never deletes: the index folder holds the
    entities added to the run (``kgc index --force`` keeps them: :func:`kgc.linkpred.index.added.kept_added`)."""

    def __init__(self, path: Path, why: str) -> None:
        self.why = why
        super().__init__(f"{path}: {why}. Rebuild the index with `kgc index {path.parent.parent} --force` (the "
                         "entities added to it are kept; do not delete the folder: it holds them).")


def meta_or_damage(folder: Path) -> tuple[dict | None, str | None]:
    """(meta.json, None), or (None, why) when it is damaged: for the commands that repair it."""
    try:
        return read_meta(folder), None
    except DamagedMeta as exc:
        return None, exc.why


HASH_LIMIT = 1 << 30  # files larger than this are checked by size only (a sha256 of 1 GiB takes ~1 s)
RECORDED = ("entities.npy", "entities.faiss", ADDED_FILE)  # the files meta.json records the size and sha256 of
def file_records(folder: Path, tx: Transaction | None = None) -> dict[str, dict]:
    """``{file: {"bytes", "sha256"}}`` of the index's files that exist (as ``tx`` will leave them), for
    meta.json's ``files``."""
    out = {}
    for name in RECORDED:
        if tx is not None and name in tx.removed and name not in tx.staged:
            continue
        f = tx.path(name) if tx is not None else folder / name
        if f.is_file():
            st = f.stat()
            out[name] = {"bytes": st.st_size, "sha256": sha256_cached(f, st)}
    return out


def damage_reason(folder: Path, meta: dict, names: tuple[str, ...] = RECORDED) -> str | None:
    """Which file of the index does not match what meta.json recorded of it (missing, another size, another
    sha256), e.g. ``"entities.faiss is damaged (size 1234, expected 5678)"``; None when every file (of ``names``)
    matches. An index from before ``files`` was recorded is checked by what its meta.json holds."""
    records = meta.get("files")
    if not isinstance(records, dict):  # an older index: its files must exist, the FAISS file be of its size
        info = meta.get("faiss") if isinstance(meta.get("faiss"), dict) else {}
        records = {"entities.npy": {}, "entities.faiss": {"bytes": info.get("bytes")}}
    for name, rec in records.items():
        if name not in names:
            continue
        f = folder / name
        if not isinstance(rec, dict):
            return f"meta.json's record of {name} is damaged"
        try:
            st = f.stat()
        except OSError:
            if name == ADDED_FILE:
                continue  # said by added_stale_reason (deleting the added entities is how they are dropped)
            return f"{name} is missing"
        if name == ADDED_FILE:
            continue  # an edited list of added entities is re-read by a rebuild (added_stale_reason), not damage
        if rec.get("bytes") is not None and st.st_size != rec["bytes"]:
            return f"{name} is damaged (size {st.st_size}, expected {rec['bytes']})"
        if rec.get("sha256") and st.st_size <= HASH_LIMIT and sha256_cached(f, st) != rec["sha256"]:
            return f"{name} is damaged (its sha256 differs from the one recorded when it was written)"
    return None


def damaged_error(run: RunDir, what: str, exc: BaseException) -> KGCError:
    """A file of the index that cannot be read (a truncated .npy, a broken FAISS file), as one message."""
    detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    return KGCError(f"{run.index / what}: damaged, cannot be read ({detail}). Rebuild the index with "
                    f"`kgc index {run.path} --force`.")


def read_table(run: RunDir, **load) -> np.ndarray:
    """The index's entities.npy (``load``: np.load's options); an unreadable one is :func:`damaged_error`."""
    try:
        return np.load(run.index / "entities.npy", **load)
    except (OSError, ValueError, EOFError) as exc:  # damaged in a way its size and checksum did not show
        raise damaged_error(run, "entities.npy", exc) from None


def read_faiss(run: RunDir):
    """The index's entities.faiss; an unreadable one (truncated, foreign) is :func:`damaged_error`."""
    faiss = index_types.faiss_module()
    try:
        return faiss.read_index(str(run.index / "entities.faiss"))
    except RuntimeError as exc:  # faiss: a truncated or foreign file
        raise damaged_error(run, "entities.faiss", exc) from None


def stored_params(meta: dict) -> dict:
    """The type and parameters an index was built with (indexes from before ``index:`` existed are flat)."""
    return meta.get("index") or {"type": "flat"}


def stored_config(run: RunDir) -> IndexOptions | None:
    """An ``index:`` section that rebuilds the run's current index as it is (its type and parameters, from
    meta.json; a stale one too), or None when there is none: to rebuild a stale index without changing its type."""
    meta = read_meta(run.index)
    if meta is None:
        return None
    params = stored_params(meta)  # resolved: a type may record derived values beside its options (sq8's train_size)
    kind = index_types.TYPES.get(params.get("type"))
    keys = kind.Options.model_fields if kind is not None else params
    return index_types.index_options({k: v for k, v in params.items() if k in keys})
