"""A large graph read once: its ids, texts and splits kept as flat files under ``$KGC_CACHE_HOME/graphs``, so the
next command (``kgc serve``'s start above all) loads it in seconds instead of parsing millions of lines again.

Parsing Wikidata5M-sized text files (4.6M entities, 20M triples) takes a minute even on the array path of
:mod:`kgc.data.graph`; loading the same graph from this cache is a few joins and splits of byte strings and one
``np.load`` per split. Only graphs of at least :data:`MIN_ENTITIES` entities are cached (small ones read faster
than a cache look-up is worth, and tests never write one).

The cache of a folder is keyed by everything the reader depends on: the folder's absolute path, the name, size
and modification time of every file in it, the reader's options and :data:`FORMAT`. Any change to any of them is
another key, so a stale cache is never read; it is simply not found (and replaced when the folder is next read).
A cache is written whole into a temporary folder and renamed into place (:func:`kgc.fileio.atomic_dir`): a kill
or a full disk leaves no half-written cache, and a failure to write one only costs the next read its speed.
``KGC_GRAPH_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from kgc.fileio import cache_home

FORMAT = 1
MIN_ENTITIES = 100_000
_TEXTS = ("entities", "names", "descriptions")


def _enabled() -> bool:
    return os.environ.get("KGC_GRAPH_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_key(folder: Path, options: dict) -> str:
    """sha256 of the folder's path, its files' names, sizes and times, the reader's options and the format."""
    folder = folder.resolve()
    files = sorted((p.name, st.st_size, st.st_mtime_ns) for p in folder.iterdir()
                   if p.is_file() and (st := p.stat()))
    blob = json.dumps({"folder": str(folder), "files": files, "options": options, "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _folder(key: str) -> Path:
    return cache_home() / "graphs" / key[:32]


def load(folder: Path, options: dict) -> dict | None:
    """The cached graph of ``folder`` read with ``options`` as :class:`~kgc.data.graph.KnowledgeGraph`'s fields, or
    None (no cache, another key, unreadable)."""
    if not _enabled():
        return None

    try:
        key = cache_key(folder, options)
        where = _folder(key)
        meta = json.loads((where / "graph.json").read_text(encoding="utf-8"))
        if meta.get("key") != key:
            return None
        texts = {name: _read_lines(where / f"{name}.txt", meta["entities"]) for name in _TEXTS}
        splits = {s: np.load(where / f"{s}.npy").astype(np.int64) for s in meta["splits"]}
    except (OSError, ValueError, KeyError):
        return None
    return dict(**texts, relations=meta["relations"], relation_texts=meta["relation_texts"], splits=splits,
                source=meta["source"], layout=meta["layout"], cache_dir=where,
                notes=meta["notes"] + [f"read from the graph cache {where} (KGC_GRAPH_CACHE=0: from the files)"])


def _read_lines(path: Path, count: int) -> list[str]:
    lines = path.read_bytes().decode("utf-8").split("\n")
    if len(lines) != count:
        raise ValueError(f"{path}: {len(lines)} lines, expected {count}")
    return lines


def store(graph: Any, folder: Path, options: dict) -> Path | None:
    """Write ``graph`` (read from ``folder`` with ``options``) to the cache when it is large enough; the cache
    folder, or None when nothing was written (small graph, cache off, or the write failed: the next read parses)."""
    if not _enabled() or graph.num_entities < MIN_ENTITIES:
        return None
    from kgc.fileio import atomic_dir

    try:
        key = cache_key(folder, options)
        where = _folder(key)
        graph.cache_dir = where
        if (where / "graph.json").is_file():
            return where
        with atomic_dir(where, replace=True) as tmp:
            for name in _TEXTS:
                (tmp / f"{name}.txt").write_bytes("\n".join(getattr(graph, name)).encode("utf-8"))
            small = graph.num_entities < 2 ** 31 and 2 * graph.num_relations < 2 ** 31
            for s, arr in graph.splits.items():
                np.save(tmp / f"{s}.npy", arr.astype(np.int32) if small else arr)
            meta = {"key": key, "entities": graph.num_entities, "relations": graph.relations,
                    "relation_texts": graph.relation_texts, "splits": list(graph.splits), "source": graph.source,
                    "layout": graph.layout, "notes": graph.notes, "folder": str(folder.resolve())}
            (tmp / "graph.json").write_text(json.dumps(meta), encoding="utf-8")
        return where
    except OSError:
        graph.cache_dir = None
        return None


def derived(graph: Any, name: str, compute) -> dict[str, np.ndarray]:
    """Arrays derived from a cached graph (its train neighbours, its answer index), kept beside it and
    memory-mapped on the next read: ``compute()`` returns them as a dict of arrays, the first time only. A graph
    that is not cached (small, or extended with added entities) computes them every time."""
    from kgc.fileio import write_npy, write_text

    folder = None if graph.cache_dir is None else Path(graph.cache_dir) / name
    if folder is not None and (folder / "done").is_file():
        try:
            if (folder / "done").read_text(encoding="utf-8") != str(graph.num_entities):
                raise ValueError("another graph's")
            return {p.name[:-4]: np.load(p, mmap_mode="r") for p in folder.glob("*.npy")}
        except (OSError, ValueError):
            pass
    arrays = compute()
    if folder is not None and (Path(graph.cache_dir) / "graph.json").is_file():
        try:  # each file whole; "done" written last marks the set complete
            folder.mkdir(exist_ok=True)
            for key, value in arrays.items():
                write_npy(folder / f"{key}.npy", np.ascontiguousarray(value))
            write_text(folder / "done", str(graph.num_entities))
        except OSError:
            pass
    return arrays
