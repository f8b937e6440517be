"""New entities without retraining: append them to a run's index, and evaluate on entities never trained on.

A text model is inductive by construction: an entity is its text, so an entity that did not exist at
training time is embedded by the same tail tower (``kgc index RUN --add new.tsv``) and asked about through
the same query tower (``kgc predict RUN --head <new id>``).

Added entities live in the run's index folder:

* ``index/added_entities.tsv`` — ``id<TAB>name<TAB>description`` of every added entity, in index order; their
  rows follow the graph's entities in ``entities.npy`` and the FAISS index (row ``num_entities + i``);
* ``meta.json``'s ``added_entities`` — their count, the sha256 of ``added_entities.tsv`` and of every
  file they came from. The index is fresh when its base fingerprint (weights, graph texts) matches *and*
  ``added_entities.tsv`` is the one recorded; rebuilding the index (``kgc index RUN``) re-embeds the added
  entities from that file, so they survive a retrained or edited run. To drop them, delete the file and
  rebuild.

Their text follows the graph's rules (``name: description``, a description prefix repeating the name
dropped); they have no train-graph neighbours, so no neighbour names are appended.

Inductive evaluation (``kgc evaluate RUN --entities-from FOLDER``) ranks the test triples of a folder whose
entities the run never saw, over that folder's entities (:mod:`kgc.data.inductive` says which).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph, _strip_name_prefix
from kgc.errors import KGCError
from kgc.fileio import sha256_file, write_json, write_npy, write_text, write_tsv, write_with
from kgc.linkpred.model import LinkPredictor, Run

ADDED_FILE = "added_entities.tsv"


@dataclass(frozen=True)
class NewEntity:
    id: str
    name: str
    description: str = ""


# ---------------------------------------------------------------- the TSV of new entities


def read_new_entities(path: str | Path) -> list[tuple[int, NewEntity]]:
    """``(line number, entity)`` for every line ``id<TAB>name<TAB>description`` (the description may be empty)."""
    path = Path(path)
    if not path.is_file():
        raise KGCError(f"{path}: no such file. Give a TSV with one new entity per line: id<TAB>name<TAB>description.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise KGCError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}). Save it as UTF-8.") from None
    rows, first_line = [], {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("\t")]
        if len(parts) < 2:
            raise KGCError(f"{path}:{lineno}: expected id<TAB>name<TAB>description, got {len(parts)} field: "
                           f"{line[:80]!r}. Separate the fields with tabs (the description may be empty).")
        ent_id, name, desc = parts[0], parts[1], " ".join(p for p in parts[2:] if p)
        if not ent_id or not name:
            what = "id" if not ent_id else "name"
            raise KGCError(f"{path}:{lineno}: empty {what} in {line[:80]!r}. Every new entity needs an id and a name.")
        if ent_id in first_line:
            raise KGCError(f"{path}:{lineno}: id {ent_id!r} repeats line {first_line[ent_id]}. Keep one line per "
                           "entity.")
        first_line[ent_id] = lineno
        rows.append((lineno, NewEntity(ent_id, name, desc)))
    if not rows:
        raise KGCError(f"{path}: no entities. Give one per line: id<TAB>name<TAB>description.")
    return rows


def _tsv(entities: list[NewEntity]) -> str:
    return "".join(f"{e.id}\t{e.name}\t{e.description}\n" for e in entities)


def extend_graph(graph: KnowledgeGraph, entities: list[NewEntity]) -> KnowledgeGraph:
    """``graph`` with ``entities`` appended (ids ``num_entities …``); splits unchanged (they have no triples)."""
    if not entities:
        return graph
    return KnowledgeGraph(entities=graph.entities + [e.id for e in entities],
                          names=graph.names + [e.name for e in entities],
                          descriptions=graph.descriptions + [_strip_name_prefix(e.name, e.description)
                                                             for e in entities],
                          relations=graph.relations, relation_texts=graph.relation_texts, splits=graph.splits,
                          source=graph.source)


# ---------------------------------------------------------------- the index folder


def _folder(run: Run) -> Path:
    return run.path / "index"


def _meta(run: Run) -> dict:
    """The index's meta.json ({} when there is none; an unreadable one is a clear error)."""
    from kgc.linkpred.index import _read_meta

    return _read_meta(_folder(run)) or {}


def stored_entities(run: Run) -> list[NewEntity]:
    """Every entity in ``index/added_entities.tsv`` (none when there is no such file)."""
    f = _folder(run) / ADDED_FILE
    return [e for _, e in read_new_entities(f)] if f.is_file() else []


def added_count(meta: dict | None) -> int:
    """How many added entities an index (its meta.json, None: no index) holds after the graph's own."""
    return int((meta or {}).get("added_entities", {}).get("count", 0))


def added_stale_reason(folder: Path, meta: dict) -> str | None:
    """Why the index's added entities do not match ``added_entities.tsv`` (None when they do)."""
    f, rec = folder / ADDED_FILE, meta.get("added_entities")
    if rec is None:
        return f"{f.name} lists entities the index does not hold" if f.is_file() else None
    if not f.is_file():
        return f"its added entities ({f.name}) are gone"
    if sha256_file(f) != rec.get("sha256"):
        return f"{f.name} changed since the entities were added"
    return None


def attach_added(run: Run, model: LinkPredictor, graph: KnowledgeGraph) -> KnowledgeGraph:
    """The graph with the index's added entities appended, and ``model.bank`` over it (call after load_index).

    Index ids ``>= graph.num_entities`` then name added entities, and an added entity can be a query head."""
    count = added_count(_meta(run))
    if not count:
        return graph
    from kgc.encoding.backbone import load_tokenizer

    entities = stored_entities(run)
    if len(entities) != count:
        raise KGCError(f"{_folder(run)}: meta.json records {count} added entities, {ADDED_FILE} has "
                       f"{len(entities)}. Rebuild the index with `kgc index {run.path} --force`.")
    extended = extend_graph(graph, entities)
    model.bank = model.bank.extended(extended, load_tokenizer(run.backbone))
    return extended


@torch.no_grad()
def _append(run: Run, model: LinkPredictor, graph: KnowledgeGraph, new: list[NewEntity], *, sources: list[dict],
            batch_size: int, progress: bool) -> dict:
    """Embed ``new`` with the tail tower and append them after the index's current rows (atomic files,
    ``meta.json`` last: an interrupted add leaves a stale index, never a wrong one)."""
    import faiss
    from tqdm.auto import tqdm

    from kgc.encoding.backbone import load_tokenizer

    folder, meta = _folder(run), _meta(run)
    before = stored_entities(run) if meta.get("added_entities") else []
    entities = before + new
    extended = extend_graph(graph, entities)
    base_bank = model.bank
    model.bank = base_bank.extended(extended, load_tokenizer(run.backbone))
    try:
        ids = list(range(graph.num_entities + len(before), extended.num_entities))
        parts = [model.encode_entities(ids[s: s + batch_size]).float().cpu()
                 for s in tqdm(range(0, len(ids), batch_size), desc="new entities", disable=not progress,
                               leave=False)]
    finally:
        model.bank = base_bank
    vectors = torch.cat(parts).numpy().astype(np.float32)  # (new, dim)
    table = np.load(folder / "entities.npy", mmap_mode="r")  # read once, by the concatenate below
    index = faiss.read_index(str(folder / "entities.faiss"))
    if not table.shape[0] == index.ntotal == graph.num_entities + len(before):
        raise KGCError(f"{folder}: entities.faiss holds {index.ntotal} vectors and entities.npy {table.shape[0]} "
                       f"rows; expected {graph.num_entities + len(before)}. Rebuild it with "
                       f"`kgc index {run.path} --force`.")
    index.add(vectors)  # flat, IVF and HNSW indexes all take new vectors without retraining
    table = np.concatenate([table, vectors])
    # the list first: once it differs from the sha256 in meta.json the index is stale (and a rebuild embeds
    # every entity it lists), so a kill between the writes below never leaves a "fresh" index of the wrong size
    write_text(folder / ADDED_FILE, _tsv(entities))
    write_npy(folder / "entities.npy", table)
    write_with(folder / "entities.faiss", lambda tmp: faiss.write_index(index, str(tmp)))
    meta["entities"] = int(index.ntotal)
    if "faiss" in meta:  # the index grew
        meta["faiss"]["bytes"] = (folder / "entities.faiss").stat().st_size
    meta["added_entities"] = {"count": len(entities), "file": ADDED_FILE, "sha256": sha256_file(folder / ADDED_FILE),
                              "sources": sources}
    write_json(folder / "meta.json", meta)
    return meta


def _check_new(graph: KnowledgeGraph, rows: list[tuple[int, NewEntity]], where: str, fix: str) -> None:
    for lineno, e in rows:
        if e.id in graph.entity_index:
            raise KGCError(f"{where}:{lineno}: id {e.id!r} is already an entity of the run's graph ({graph.source}). "
                           f"{fix}")


def add_entities(run: Run, model: LinkPredictor, graph: KnowledgeGraph, path: str | Path, *, batch_size: int = 256,
                 progress: bool = False) -> dict:
    """``kgc index RUN --add path``: validate the new entities, embed them, append them to the (fresh) index."""
    from kgc.linkpred.index import stale_reason

    path = Path(path)
    rows = read_new_entities(path)
    if (reason := stale_reason(run, model)) is not None:
        raise KGCError(f"{_folder(run)}: cannot add entities: {reason}. Build it first with `kgc index {run.path}`.")
    meta = _meta(run)
    before = {e.id for e in stored_entities(run)} if meta.get("added_entities") else set()
    _check_new(graph, rows, str(path), "Give the new entity a new id; an existing entity can be queried as it is.")
    for lineno, e in rows:
        if e.id in before:
            raise KGCError(f"{path}:{lineno}: id {e.id!r} was already added to {_folder(run)} ({ADDED_FILE}). "
                           "Give it a new id, or remove its line from that file, rebuild with "
                           f"`kgc index {run.path}` and add it again.")
    sources = meta.get("added_entities", {}).get("sources", []) + [
        {"file": str(path.resolve()), "sha256": sha256_file(path), "count": len(rows)}]
    return _append(run, model, graph, [e for _, e in rows], sources=sources, batch_size=batch_size, progress=progress)


def rebuild_index(run: Run, model: LinkPredictor, graph: KnowledgeGraph, *, progress: bool = True,
                  **build_options) -> dict:
    """Build the run's index from scratch (``build_index(run, model, **build_options)``), keeping the entities
    listed in ``index/added_entities.tsv`` (re-embedded with the current weights). ``model`` is over the run's
    own graph."""
    from kgc.linkpred.index import build_index

    stored = _folder(run) / ADDED_FILE
    keep = read_new_entities(stored) if stored.is_file() else []
    _check_new(graph, keep, str(stored), "Remove that line (the graph has the entity now) and rebuild.")
    sources = _meta(run).get("added_entities", {}).get("sources", [])
    meta = build_index(run, model, progress=progress, **build_options)
    if keep:
        meta = _append(run, model, graph, [e for _, e in keep], sources=sources,
                       batch_size=run.recipe.eval.batch_size, progress=progress)
    return meta


# ---------------------------------------------------------------- inductive evaluation


def evaluate_inductive(run: Run, folder: str | Path, *, split: str = "test", candidates: str = "split",
                       device="cpu", batch_size: int | None = None, rerank: bool | None = None,
                       progress: bool = False, warn: Callable[[str], None] | None = None):
    """Rank ``folder``'s ``split`` triples over its entities with the run's towers; write
    ``results.inductive[.split].json`` and ``ranks.inductive[.split].tsv`` (PyKEEN's layout, as
    ``kgc evaluate``) with ``kgc.inductive`` saying what was ranked."""
    from kgc.data.inductive import read_inductive_folder
    from kgc.linkpred.evaluate import evaluate

    known = run.graph()
    graph, info = read_inductive_folder(folder, known, split=split, candidates=candidates,
                                        long_text=run.recipe.data.long_text)
    if info["seen_in_training"] and warn is not None:
        warn(f"warning: {info['seen_in_training']} of the {info['split_entities']} {split} entities of {folder} "
             f"occur in the run's training triples (e.g. {', '.join(info['seen_examples'])}): this is not an "
             "inductive evaluation for them")
    if info["relation_texts_differ"] and warn is not None:
        warn(f"note: {folder} words relation(s) {', '.join(info['relation_texts_differ'])} differently; the run's "
             "own relation texts are used (the model was trained on them)")
    model, _ = run.load(device, graph=graph)  # the same weights; the TextBank is over the folder's entities
    rr = run.recipe.eval.rerank.model_dump()
    if rerank is not None:
        rr["enabled"] = rerank
    ev = evaluate(model, graph, split, batch_size=batch_size or run.recipe.eval.batch_size, rerank=rr,
                  progress=progress, max_score_bytes=run.recipe.eval.max_score_bytes)
    ev.results["kgc"]["inductive"] = info
    suffix = ".inductive" + ("" if split == "test" else f".{split}")
    write_json(run.path / f"results{suffix}.json", ev.results)
    write_tsv(run.path / f"ranks{suffix}.tsv", ev.ranks)
    return ev
