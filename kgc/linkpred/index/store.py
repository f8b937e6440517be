"""Entity index of a run: float32 embeddings (``entities.npy``), plus a FAISS index (``entities.faiss``) for the
approximate types, fingerprinted. The exact type (flat, the default) is ``entities.npy`` alone, searched in torch
(:class:`~kgc.linkpred.index.types.ExactIndex`), so it needs no FAISS; an ``entities.faiss`` left by an older flat
index is not read, and is removed when the index is next written.

The fingerprint is (sha256 of the weights file, sha256 of every entity's token ids). An index whose
fingerprint does not match the run's current weights and texts is refused, never silently used.

The FAISS structure is the recipe's ``index:`` section (``kgc index RUN --type ivf --nprobe 16`` overrides it):
flat (exact, the default), ivf, hnsw, ivfpq or sq (:mod:`kgc.linkpred.index.types`). ``meta.json`` records the type
and its parameters; a search uses the stored ones (``nprobe`` / ``ef_search`` / ``rescore`` are applied at load),
so an index is never read as another type. ``entities.npy`` always holds the exact table: evaluation scores against
it, and an ivfpq index with ``rescore`` re-scores its candidates against it, memory-mapped
(:class:`~kgc.linkpred.index.types.RescoredIndex`; an ivfpq meta.json from before ``rescore`` searches without it
until ``kgc index RUN`` stores the default).

What ``meta.json`` records of the index's files, and how a damaged one is found, is
:mod:`kgc.linkpred.index.records`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch

from kgc.errors import KGCError
from kgc.fileio import Transaction, recover, run_lock, sha256_cached, sha256_file, sweep, write_error, write_text
from kgc.data.graph import KnowledgeGraph, nfc
from kgc.linkpred.index import types as index_types
from kgc.linkpred.index.types import IndexOptions
from kgc.linkpred.index.records import (damage_reason, damaged_error, file_records, fingerprint,
                                       meta_or_damage, read_faiss, read_meta, read_table, stored_params)
from kgc.linkpred.index.added import (ADDED_FILE, NewEntity, added_count, added_stale_reason, check_new, extend_graph,
                                RECORD_FOLDER, copies_of_record, kept_added, prunable, read_new_entities, record_path, stored_entities,
                                tsv)
from kgc.linkpred.model import LinkPredictor
from kgc.training.run import RunDir


def index_params(run: RunDir, model: LinkPredictor) -> dict:
    """The fresh index's type and parameters plus ``exact`` (only flat is), e.g. for results.json to say what
    a search used: ``{"type": "ivf", "nlist": 4000, "train_size": 256000, "nprobe": 32, "exact": False}``."""
    params = stored_params(read_meta(_check_fresh(run, model)))
    return {**params, "exact": params["type"] == "flat"}


def _reusable_table(folder: Path, meta: dict | None, current: dict, entities: int) -> np.ndarray | None:
    """A stored ``entities.npy`` built from the current weights and texts (the graph's rows first, then any added
    with ``kgc index --add``), else None."""
    if meta is None or any(meta.get(k) != current[k] for k in ("weights_sha256", "texts_sha256")):
        return None
    if not (folder / "entities.npy").is_file() or damage_reason(folder, meta, ("entities.npy",)) is not None:
        return None  # a damaged index is rebuilt from scratch
    try:
        table = np.load(folder / "entities.npy")
    except (OSError, ValueError, EOFError):  # unreadable: computed again
        return None
    if table.ndim != 2 or table.shape[0] < entities or table.shape[1] != meta.get("dim") or table.dtype != np.float32:
        return None
    return table


def build_index(run: RunDir, model: LinkPredictor, *, batch_size: int = 256, progress: bool = True,
                config: IndexOptions | None = None, reuse_embeddings: bool = True, faiss_device: str = "auto",
                keep: list[NewEntity] | None = None, sources: list[dict] | None = None, embed=None,
                drop: bool = False) -> dict:
    """Build ``run/index`` from scratch for the graph's entities, as ``config`` says (default: the recipe's
    ``index:`` section). The entity table is reused from a stored ``entities.npy`` made by the same weights
    and texts (only the FAISS structure is rebuilt) unless ``reuse_embeddings`` is false. ``faiss_device``:
    auto (a FAISS GPU when there is one), gpu or cpu. ``keep``: added entities to embed and append in the same
    commit (a rebuild keeps them; ``sources``: where they came from); ``drop``: the index's added list is removed in
    the same commit (``kgc index --drop-added``). ``embed``: what computes the table when it
    is not reused, ``embed(model, batch_size, progress)`` -> (entities, dim) float32 (default: the model's
    ``entity_table``; ``kgc index --nproc N``: :meth:`kgc.linkpred.answer.sharded.Shards.encode`). Returns the new
    ``meta.json``.

    The files are written as one :class:`~kgc.fileio.Transaction`: a failure (a full disk) or a kill at any point
    leaves the previous index as it was, or the new one whole."""
    start = time.perf_counter()
    config = config if config is not None else run.recipe.index
    folder = run.index
    made = not folder.exists()
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:  # a run folder that cannot be written: one message naming it
        raise (write_error(folder, exc) or exc) from None
    try:
        return _build(run, model, folder, start, batch_size=batch_size, progress=progress, config=config,
                      reuse_embeddings=reuse_embeddings, faiss_device=faiss_device, keep=keep or [],
                      sources=sources or [], embed=embed, drop=drop)
    except BaseException:
        if made and not any(folder.iterdir()):  # no empty index/ left behind
            folder.rmdir()
        raise


def _build(run: RunDir, model: LinkPredictor, folder: Path, start: float, *, batch_size: int, progress: bool,
           config: IndexOptions, reuse_embeddings: bool, faiss_device: str, keep: list[NewEntity],
           sources: list[dict], embed=None, drop: bool = False) -> dict:
    sweep(folder)  # staged files of a build or add that never committed
    current = fingerprint(run, model)
    entities = model.bank.graph.num_entities
    stored = _reusable_table(folder, meta_or_damage(folder)[0], current, entities) if reuse_embeddings else None
    source = "reused" if stored is not None else "computed"
    if stored is None and embed is not None:  # e.g. encoded in shards by several processes
        table = embed(model, batch_size, progress)  # (entities, dim)
    elif stored is None:
        table = model.entity_table(batch_size, progress=progress).numpy().astype(np.float32)  # (entities, dim)
    else:  # rows added by `kgc index --add` are dropped here, and embedded again from `keep`
        table = np.ascontiguousarray(stored[:entities])
    params = index_types.resolve(config, *table.shape)  # bad parameters stop here, before anything is touched
    exact = params["type"] == "flat"  # entities.npy is the whole index
    index = info = None
    if not exact:
        index, info = index_types.build(table, params, device=faiss_device)
        index = index_types.to_cpu(index)
    meta = {**current, "entities": int(table.shape[0]), "dim": int(table.shape[1]), "index": params,
            "embeddings": source, "precision": model.precision}  # what the entity table was encoded in
    if not exact:
        meta["faiss"] = {**info, "version": index_types.faiss_module().__version__}
    else:
        meta["exact"] = {"engine": "torch", "factory": index_types.factory_string(params)}
    with Transaction(folder) as tx:
        if keep:
            vectors = _embed_new(run, model, model.bank.graph, [], keep, batch_size=batch_size, progress=progress)
            table, meta = _with_added(meta, table, index, keep, vectors, sources)
        if keep or stored is None or stored.shape[0] != table.shape[0]:
            tx.write_npy("entities.npy", table)
        if drop:
            tx.remove(ADDED_FILE)
        meta["seconds"] = round(time.perf_counter() - start, 2)
        return _commit(tx, run, meta, table, index, keep)


def _embed_new(run: RunDir, model: LinkPredictor, graph: KnowledgeGraph, before: list[NewEntity],
               new: list[NewEntity], *, batch_size: int, progress: bool, guard=None) -> np.ndarray:
    """The tail tower's vectors of ``new`` (entities after the graph's and ``before``), (len(new), dim) float32.
    ``guard``: a context-manager factory each batch runs inside (``kgc serve`` interleaves an add's batches with
    queries, and stops an add it is asked to stop between two batches)."""
    from tqdm.auto import tqdm

    from kgc.encoding.backbone import load_tokenizer

    extended = extend_graph(graph, before + new)
    bank = model.bank.extended(extended, load_tokenizer(run.backbone))  # passed, never swapped into the model
    ids = list(range(graph.num_entities + len(before), extended.num_entities))
    parts = []
    with torch.no_grad():
        for s in tqdm(range(0, len(ids), batch_size), desc="new entities", disable=not progress, leave=False):
            with guard() if guard is not None else contextlib.nullcontext():
                parts.append(model.encode_entities(ids[s: s + batch_size], bank=bank).float().cpu())
    return torch.cat(parts).numpy().astype(np.float32)


def _with_added(meta: dict, table: np.ndarray, index, entities: list[NewEntity], vectors: np.ndarray,
                sources: list[dict]) -> tuple[np.ndarray, dict]:
    """The table (and FAISS index, in place) with ``vectors`` appended, and the meta that records
    ``entities`` (every added entity, the earlier ones first) as the added list."""
    if index is not None:
        index.add(vectors)  # IVF and HNSW indexes take new vectors without retraining
    table = np.concatenate([table, vectors])
    meta = {**meta, "entities": int(table.shape[0]),
            "added_entities": {"count": len(entities), "file": ADDED_FILE, "sources": sources}}
    return table, meta


def _commit(tx: Transaction, run: RunDir, meta: dict, table: np.ndarray, index, added: list[NewEntity]) -> dict:
    """Stage the index's remaining files (the FAISS file, the added list, meta.json) in ``tx`` and commit it."""
    folder = run.index
    if index is None:
        tx.remove("entities.faiss")  # an older flat or an approximate index's: not ours
    else:
        faiss = index_types.faiss_module()
        tmp = tx.write_with("entities.faiss", lambda t: faiss.write_index(index, str(t)),
                            needed=int(table.nbytes))  # at most about the table's size (PQ: less)
        meta["faiss"]["bytes"] = tmp.stat().st_size
    record, made = None, False
    if "added_entities" in meta:
        text = tsv(added)
        tmp = tx.write_text(ADDED_FILE, text)
        meta["added_entities"]["sha256"] = sha = sha256_cached(tmp)  # file_records below reads this hash
        record = record_path(run.path, sha)  # the list of record outside the index, before the commit names it
        if not record.is_file():
            record.parent.mkdir(exist_ok=True)
            write_text(record, text)
            made = True
    try:
        meta["files"] = file_records(folder, tx)
        tx.write_json("meta.json", meta)  # every file of the index, and its description, in one commit
        tx.commit()
    except BaseException:
        if made and not tx.committed:  # a list no commit names: not left to be taken for one (past the commit
            record.unlink(missing_ok=True)  # point the journal names it: the next reader completes the commit)
        raise
    for old in prunable(run.path, record, added):  # earlier lists this one holds whole; nothing else is removed
        old.unlink(missing_ok=True)
    return meta


def index_plan(run: RunDir, model: LinkPredictor, config: IndexOptions | None = None) -> tuple[str, str]:
    """What ``kgc index`` has to do for ``config``: ``("build", why)``, ``("search", why)`` (only nprobe /
    ef_search / rescore differ: meta.json is updated, nothing rebuilt) or ``("none", "up to date")``."""
    config = config if config is not None else run.recipe.index
    reason = stale_reason(run, model)
    if reason is not None:
        return "build", reason
    meta = read_meta(run.index)
    have = stored_params(meta)
    want = index_types.resolve(config, model.bank.graph.num_entities, int(meta["dim"]))
    if index_types.build_params(have) != index_types.build_params(want):
        return "build", f"it is {_describe(have)}, asked for {_describe(want)}"
    if index_types.search_params(have) != index_types.search_params(want):
        return "search", f"{_describe(have, search_only=True)} -> {_describe(want, search_only=True)}"
    return "none", f"up to date ({_describe(have)})"


def _describe(params: dict, *, search_only: bool = False) -> str:
    """``ivf (nlist=4000, train_size=256000, nprobe=32)``, or with ``search_only`` just ``nprobe=32``."""
    shown = index_types.search_params(params) if search_only else {k: v for k, v in params.items() if k != "type"}
    inner = ", ".join(f"{k}={v}" for k, v in shown.items())
    if search_only:
        return inner
    return f"{params['type']} ({inner})" if inner else params["type"]


def update_search_params(run: RunDir, model: LinkPredictor, config: IndexOptions | None = None) -> dict:
    """Store ``config``'s nprobe / ef_search / rescore in a fresh index's meta.json (no rebuild), holding the run's
    lock; returns the meta."""
    with run_lock(run.path, "updating the index's search parameters"):
        folder = _check_fresh(run, model)
        meta = read_meta(folder)
        have = stored_params(meta)
        want = index_types.resolve(config if config is not None else run.recipe.index,
                                   model.bank.graph.num_entities, int(meta["dim"]))
        if index_types.build_params(have) != index_types.build_params(want):
            raise KGCError(f"{folder} is {_describe(have)}, not {_describe(want)}: rebuild it with "
                           f"`kgc index {run.path}`")
        meta["index"] = {**have, **index_types.search_params(want)}
        with Transaction(folder) as tx:
            tx.write_json("meta.json", meta)
            tx.commit()
        return meta


NO_INDEX = "there is no index yet"


def stale_reason(run: RunDir, model: LinkPredictor) -> str | None:
    """Why the run's index cannot serve ``model`` (its own graph): missing, stale or damaged (a file that does not
    match meta.json's record of it: :func:`damage_reason`); None when it is fresh."""
    folder = run.index
    meta = read_meta(folder)
    if meta is None:
        return NO_INDEX
    current = fingerprint(run, model)
    stale = [k for k in ("weights_sha256", "texts_sha256") if meta.get(k) != current[k]]
    if stale:
        what = " and ".join("model weights" if k.startswith("weights") else "entity texts" for k in stale)
        return f"it was built from other {what}"
    damage = damage_reason(folder, meta)
    if damage is not None:
        return damage
    return added_stale_reason(folder, meta)  # an index with added entities: the added file must match too


def _check_fresh(run: RunDir, model: LinkPredictor) -> Path:
    folder = run.index
    reason = stale_reason(run, model)
    if reason == NO_INDEX:
        raise KGCError(f"{run.path}: no index yet. Build it with `kgc index {run.path}`.")
    if reason and (" is damaged" in reason or " is missing" in reason):
        raise KGCError(f"{folder}: {reason}. Rebuild it with `kgc index {run.path} --force`.")
    if reason:
        raise KGCError(f"{folder} is stale: {reason}. Rebuild it with `kgc index {run.path}`.")
    return folder


def load_embeddings(run: RunDir, model: LinkPredictor, *, added: bool = False) -> np.ndarray | None:
    """(entities, dim) from a fresh index — the run's graph's rows, then with ``added`` those of the entities added
    to it — or None when there is none (a stale one is an error)."""
    if not (run.index / "meta.json").is_file():
        return None
    _check_fresh(run, model)
    table = read_table(run)
    if table.ndim != 2 or table.shape[0] < model.bank.graph.num_entities:
        raise damaged_error(run, "entities.npy", ValueError(f"shape {table.shape}"))
    return table if added else table[: model.bank.graph.num_entities]


def load_index(run: RunDir, model: LinkPredictor, *, nprobe: int | None = None, ef_search: int | None = None,
               rescore: int | None = None, faiss_device: str = "auto"):
    """The run's fresh index with the search parameters stored in meta.json (``nprobe`` / ``ef_search`` /
    ``rescore`` override them for this load), on a GPU when there is one (``faiss_device``: auto, gpu or cpu): for
    flat an :class:`~kgc.linkpred.index.types.ExactIndex` over entities.npy (torch's GPU); for ivfpq with rescore
    > 1 a :class:`~kgc.linkpred.index.types.RescoredIndex` (the FAISS index, its candidates re-scored against
    entities.npy memory-mapped); else the FAISS index (a FAISS GPU). Search it with :func:`search_index` (or
    ``index.search``)."""
    folder = _check_fresh(run, model)
    meta = read_meta(folder)
    params = dict(stored_params(meta))
    if params["type"] == "flat":
        index = index_types.ExactIndex(read_table(run, mmap_mode="r"))  # memory-mapped: processes share its pages
        found = "flat"
    else:
        index = read_faiss(run)
        found = params["type"] if params["type"] in index_types.types_of(index) else index_types.type_of(index)
    if found != params["type"] or ("nlist" in params and
                                   index_types.faiss_module().extract_index_ivf(index).nlist != params["nlist"]):
        raise KGCError(f"{folder}: meta.json records a {_describe(params)} index, entities.faiss holds "
                       f"{found or type(index).__name__}. Rebuild it with `kgc index {run.path}`.")
    added = added_count(meta)  # entities added with `kgc index --add` follow the graph's
    if index.ntotal != model.bank.graph.num_entities + added:
        raise KGCError(f"{folder}: holds {index.ntotal} entities, the graph has {model.bank.graph.num_entities} "
                       f"(+ {added} added). Rebuild it with `kgc index {run.path}`.")
    overrides = {k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search), ("rescore", rescore))
                 if v is not None}
    if overrides:  # validated like the recipe keys (a key the stored type does not read is an error)
        config = index_types.index_config(index_types.index_options({"type": params["type"]}), **overrides)
        params.update({k: getattr(config, k) for k in overrides})
        if "nprobe" in overrides:
            params["nprobe"] = min(params["nprobe"], params["nlist"])
    index, _ = index_types.to_device(index, params["type"], faiss_device)
    index_types.set_search_params(index, params)
    table = None
    if (params.get("rescore") or 1) > 1:  # the exact table for re-scoring: memory-mapped, read row by row
        table = read_table(run, mmap_mode="r")
        if table.shape != (index.ntotal, index.d) or table.dtype != np.float32:
            raise damaged_error(run, "entities.npy", ValueError(f"{table.dtype} {table.shape}, the index holds "
                                                           f"{index.ntotal} × {index.d}"))
    return index_types.with_rescore(index, table, params)


# ---------------------------------------------------------------- added entities (kgc index --add)


def _meta(run: RunDir) -> dict:
    """The index's meta.json ({} when there is none; an unreadable one is a clear error)."""
    return read_meta(run.index) or {}


def added_graph(run: RunDir, graph: KnowledgeGraph) -> KnowledgeGraph:
    """``graph`` with the index's added entities appended (ids ``>= graph.num_entities`` in index order): the
    graph a search over the index answers in, where an added entity can be a query head."""
    count = added_count(_meta(run))
    if not count:
        return graph
    entities = stored_entities(run.index)
    if len(entities) != count:
        raise KGCError(f"{run.index}: meta.json records {count} added entities, {ADDED_FILE} has "
                       f"{len(entities)}. Rebuild the index with `kgc index {run.path} --force`.")
    return extend_graph(graph, entities)


def _append(run: RunDir, model: LinkPredictor, graph: KnowledgeGraph, new: list[NewEntity], *, sources: list[dict],
            batch_size: int, progress: bool, guard=None) -> dict:
    """Embed ``new`` with the tail tower and append them after the index's current rows: the added list, the table,
    the FAISS file and ``meta.json`` in one :class:`~kgc.fileio.Transaction` (they move together, or none does)."""
    folder, meta = run.index, _meta(run)
    before = stored_entities(folder) if meta.get("added_entities") else []
    vectors = _embed_new(run, model, graph, before, new, batch_size=batch_size, progress=progress, guard=guard)
    if guard is not None:
        with guard():  # a last chance to stop it: past here it is written and committed whatever happens
            pass
    table = read_table(run, mmap_mode="r")  # read once, by the concatenate below
    exact = stored_params(meta)["type"] == "flat"  # entities.npy is the whole index
    index = None if exact else read_faiss(run)
    expected = graph.num_entities + len(before)
    if table.shape[0] != expected or (not exact and index.ntotal != expected):
        held = f"entities.npy holds {table.shape[0]} rows" if exact else \
            f"entities.faiss holds {index.ntotal} vectors and entities.npy {table.shape[0]} rows"
        raise KGCError(f"{folder}: {held}; expected {expected}. Rebuild it with `kgc index {run.path} --force`.")
    table, meta = _with_added(meta, table, index, before + new, vectors, sources)
    with Transaction(folder) as tx:
        tx.write_npy("entities.npy", table)
        return _commit(tx, run, meta, table, index, before + new)


def add_entities(run: RunDir, model: LinkPredictor, graph: KnowledgeGraph, path: str | Path, *, batch_size: int = 256,
                 progress: bool = False, guard=None) -> dict:
    """``kgc index RUN --add path``: validate the new entities, embed them, append them to the (fresh) index,
    holding the run's lock (a second add at the same time is refused: run it again once the first is done)."""
    path = Path(path)
    split: list[int] = []
    rows = read_new_entities(path, split=split)
    with run_lock(run.path, "adding entities to the index"):
        meta = _add_locked(run, model, graph, path, rows, batch_size=batch_size, progress=progress, guard=guard)
    if split:  # as kgc data check notes it for entity2text.txt
        meta["note"] = (f"{path}: {len(split)} line(s) of two fields (the first at line {split[0]}) were split at the "
                        "first \", \" into name and description (KG-BERT's entity2text.txt); a name holding \", \" "
                        "needs the three-field form id<TAB>name<TAB>description")
    return meta


def _add_locked(run: RunDir, model: LinkPredictor, graph: KnowledgeGraph, path: Path,
                rows: list[tuple[int, NewEntity]], *, batch_size: int, progress: bool, guard=None) -> dict:
    sweep(run.index)  # staged files of an add or build that never committed (killed before its journal)
    if (reason := stale_reason(run, model)) is not None:
        raise KGCError(f"{run.index}: cannot add entities: {reason}. Build it first with `kgc index {run.path}`.")
    meta = _meta(run)
    stored = {nfc(e.id): e for e in stored_entities(run.index)} if meta.get("added_entities") else {}
    before = set(stored)
    if stored and all(stored.get(e.id) == e for _, e in rows):  # the same add again (say, after a failed rename
        return {**meta, "already": True}                          # past its commit point): nothing to do
    check_new(graph, rows, str(path), "Give the new entity a new id; an existing entity can be queried as it is.")
    for lineno, e in rows:
        if e.id in before:
            raise KGCError(f"{path}:{lineno}: id {e.id!r} was already added to {run.index} ({ADDED_FILE}). "
                           "Give it a new id, or remove its line from that file, rebuild with "
                           f"`kgc index {run.path}` and add it again.")
    sources = meta.get("added_entities", {}).get("sources", []) + [
        {"file": str(path.resolve()), "sha256": sha256_file(path), "count": len(rows)}]
    return _append(run, model, graph, [e for _, e in rows], sources=sources, batch_size=batch_size, progress=progress,
                   guard=guard)


def rebuild_index(run: RunDir, model: LinkPredictor, graph: KnowledgeGraph, *, progress: bool = True,
                  **build_options) -> dict:
    """Build the run's index from scratch (``build_index(run, model, **build_options)``), keeping the entities
    listed in ``index/added_entities.tsv`` (re-embedded with the current weights, in the same commit), holding the
    run's lock. ``model`` is over the run's own graph."""
    with run_lock(run.path, "building the index"):
        recover(run.index)
        stored = run.index / ADDED_FILE
        meta, damaged = meta_or_damage(run.index)
        keep, note = kept_added(run.path, run.index, meta, damaged)  # the list of record, restored where it was cut
        check_new(graph, list(enumerate(keep, 1)), str(stored),
                  "Remove that line (the graph has the entity now) and rebuild.")
        sources = (meta or {}).get("added_entities", {}).get("sources", [])
        built = build_index(run, model, progress=progress, keep=keep, sources=sources, **build_options)
        return {**built, "note": note} if note else built


def drop_added(run: RunDir, model: LinkPredictor, *, progress: bool = True, **build_options) -> dict:
    """``kgc index RUN --drop-added``: the index rebuilt with the graph's entities only (its type and parameters
    kept), its added list removed in the same commit, then every copy of record in ``RUN/added/`` — the one command
    that removes them. Killed after the commit, the copies are still there and the next rebuild restores them from
    them: run it again. Returns the new meta.json with ``dropped`` (how many entities) and ``note``."""
    with run_lock(run.path, "dropping the added entities"):
        recover(run.index)
        meta, damaged_error = meta_or_damage(run.index)
        copies = sorted(Path(run.path, RECORD_FOLDER).glob("*.tsv"))
        count = max([added_count(meta)] + [len(listed) for _, listed in copies_of_record(run.path)])
        built = build_index(run, model, progress=progress, keep=[], drop=True, **build_options)
        for copy in copies:
            copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (run.path / RECORD_FOLDER).rmdir()
        where = f"; {len(copies)} cop{'y' if len(copies) == 1 else 'ies'} of record removed from " \
            f"{run.path / RECORD_FOLDER}" if copies else ""
        return {**built, "dropped": count, "note": f"dropped {count} added entities{where}"}
