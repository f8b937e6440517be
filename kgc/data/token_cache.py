"""A large graph's entity texts tokenised once: the :class:`~kgc.data.texts.TextBank` arrays kept under
``$KGC_CACHE_HOME/tokens`` and memory-mapped by every later command with the same texts and tokenizer.

Tokenising 5 million "name: description" texts and names takes minutes on two cores; every command that loads a
run builds a TextBank (``kgc serve`` at start, ``kgc evaluate``, ``kgc index``). With this cache the arrays are
memory-mapped (several server processes share one page cache) and the bank's fingerprint — a hash over every
entity's token ids, what an index is checked against — is read, not recomputed. Only graphs of at least
:data:`~kgc.data.graph_cache.MIN_ENTITIES` entities use it.

The key is the sha256 of the tokenizer's vocabulary, the short-description rule and every entity's name and
description, so other texts or another tokenizer never read these arrays. Written whole or not at all
(:func:`kgc.fileio.atomic_dir`); ``KGC_GRAPH_CACHE=0`` turns it off with the graph cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from kgc.data import graph_cache
from kgc.data.ragged import Ragged
from kgc.fileio import cache_home

_ARRAYS = ("base", "base_colon", "name_ids")


def texts_key(graph: Any, tokenizer_hash: str, short_description_words: int) -> str:
    h = hashlib.sha256(f"{graph_cache.FORMAT}\0{tokenizer_hash}\0{short_description_words}\0".encode())
    for texts in (graph.names, graph.descriptions):
        for start in range(0, len(texts), 1_000_000):
            h.update("\n".join(texts[start:start + 1_000_000]).encode("utf-8"))
            h.update(b"\n")
        h.update(b"\0")
    return h.hexdigest()


def _folder(key: str) -> Path:
    return cache_home() / "tokens" / key[:32]


def wanted(graph: Any) -> bool:
    return graph_cache._enabled() and graph.num_entities >= graph_cache.MIN_ENTITIES


def load(key: str) -> dict | None:
    """{"base", "base_colon", "name_ids": Ragged (memory-mapped), "short": bool array, "fingerprints": dict}, or
    None when there is no cache under ``key``."""
    where = _folder(key)
    try:
        meta = json.loads((where / "meta.json").read_text(encoding="utf-8"))
        if meta.get("key") != key:
            return None
        out: dict = {name: Ragged(np.load(where / f"{name}.values.npy", mmap_mode="r"),
                                  np.load(where / f"{name}.offsets.npy", mmap_mode="r")) for name in _ARRAYS}
        out["short"] = np.load(where / "short.npy")
        out["fingerprints"] = dict(meta.get("fingerprints", {}))
    except (OSError, ValueError, KeyError):
        return None
    return out


def store(key: str, arrays: dict) -> None:
    """Write the bank's arrays under ``key`` (nothing when they are there already, or the write fails)."""
    from kgc.fileio import atomic_dir

    where = _folder(key)
    if (where / "meta.json").is_file():
        return
    try:
        with atomic_dir(where, replace=True) as tmp:
            for name in _ARRAYS:
                np.save(tmp / f"{name}.values.npy", np.ascontiguousarray(arrays[name].values))
                np.save(tmp / f"{name}.offsets.npy", np.ascontiguousarray(arrays[name].offsets))
            np.save(tmp / "short.npy", arrays["short"])
            (tmp / "meta.json").write_text(json.dumps({"key": key, "fingerprints": {}}), encoding="utf-8")
    except OSError:
        pass


def store_fingerprint(key: str, neighbors: str, fingerprint: str) -> None:
    """Remember the bank's fingerprint under ``neighbors`` (the neighbour rule it was computed with)."""
    from kgc.fileio import write_json

    meta_file = _folder(key) / "meta.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("key") != key:
            return
        meta.setdefault("fingerprints", {})[neighbors] = fingerprint
        write_json(meta_file, meta)
    except (OSError, ValueError):
        pass
