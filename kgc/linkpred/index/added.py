"""Entities added to a run without retraining (``kgc index RUN --add new.tsv``): reading them, and the record of
them kept in the run's index folder. The index store (:mod:`kgc.linkpred.index.store`) embeds and appends them.

A text model is inductive by construction: an entity is its text, so an entity that did not exist at
training time is embedded by the same tail tower and asked about through the same query tower
(``kgc predict RUN --head <new id>``).

Added entities live in the run's index folder:

* ``index/added_entities.tsv`` — ``id<TAB>name<TAB>description`` of every added entity, in index order; their
  rows follow the graph's entities in ``entities.npy`` and the FAISS index (row ``num_entities + i``);
* ``meta.json``'s ``added_entities`` — their count, the sha256 of ``added_entities.tsv`` and of every
  file they came from;
* ``RUN/added/<sha256>.tsv`` — a copy of the list of record, written before the index commits it, outside the
  index folder: a rebuild (``kgc index RUN --force``) restores a cut list from it, or keeps the added entities when
  meta.json itself is damaged (:func:`kept_added`). The index is fresh when its base fingerprint (weights, graph texts) matches *and*
  ``added_entities.tsv`` is the one recorded; rebuilding the index (``kgc index RUN``) re-embeds the added
  entities from that file, so they survive a retrained or edited run. To drop them, delete the file and
  rebuild.

Their text follows the graph's rules (``name: description``, a description prefix repeating the name
dropped); they have no train-graph neighbours, so no neighbour names are appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kgc.data.graph import KnowledgeGraph, _strip_name_prefix, text_lines
from kgc.errors import KGCError
from kgc.fileio import sha256_file

ADDED_FILE = "added_entities.tsv"
# the longest id, name and description an added entity may have (characters; ``kgc index --add`` and POST /entities):
# a text is cut to data.max_tokens tokens when embedded, so a longer one only grows every later start of the run
MAX_ID, MAX_NAME, MAX_DESCRIPTION = 256, 1_000, 10_000


@dataclass(frozen=True)
class NewEntity:
    id: str
    name: str
    description: str = ""


# ---------------------------------------------------------------- the TSV of new entities


def read_new_entities(path: str | Path, *, split: list[int] | None = None) -> list[tuple[int, NewEntity]]:
    """``(line number, entity)`` for every line, read as ``entity2text.txt`` is: ``id<TAB>name<TAB>description``
    (the description may be empty; further tabs belong to it) or ``id<TAB>name, description`` (one text field,
    split at its first ``", "``: ``Quito, capital of Ecuador`` is the name Quito with a description). ``split``:
    a list the line numbers of the lines split so are appended to (``kgc index --add`` says how many)."""
    path = Path(path)
    if not path.is_file():
        raise KGCError(f"{path}: no such file. Give a TSV with one new entity per line: id<TAB>name<TAB>description.")
    rows, first_line = [], {}
    for lineno, line in text_lines(path):  # not UTF-8, binary: one KGCError naming the line
        parts = [p.strip() for p in line.split("\t")]
        if len(parts) < 2:
            raise KGCError(f"{path}:{lineno}: expected id<TAB>name<TAB>description, got {len(parts)} field: "
                           f"{line[:80]!r}. Separate the fields with tabs (the description may be empty).")
        if len(parts) == 2:  # KG-BERT's id<TAB>text: "name, description", as entity2text.txt is read
            name, _, desc = (p.strip() for p in parts[1].partition(", "))
            ent_id = parts[0]
            if split is not None and desc:
                split.append(lineno)
        else:
            ent_id, name, desc = parts[0], parts[1], " ".join(p for p in parts[2:] if p)
        if not ent_id or not name:
            what = "id" if not ent_id else "name"
            raise KGCError(f"{path}:{lineno}: empty {what} in {line[:80]!r}. Every new entity needs an id and a name.")
        for what, value, most in (("id", ent_id, MAX_ID), ("name", name, MAX_NAME),
                                  ("description", desc, MAX_DESCRIPTION)):
            if len(value) > most:
                raise KGCError(f"{path}:{lineno}: the {what} has {len(value):,} characters; at most {most:,} are "
                               f"taken (a text is cut to the model's max_tokens when embedded). Shorten it.")
        if ent_id in first_line:
            raise KGCError(f"{path}:{lineno}: id {ent_id!r} repeats line {first_line[ent_id]}. Keep one line per "
                           "entity.")
        first_line[ent_id] = lineno
        rows.append((lineno, NewEntity(ent_id, name, desc)))
    if not rows:
        raise KGCError(f"{path}: no entities. Give one per line: id<TAB>name<TAB>description.")
    return rows


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


def stored_entities(folder: Path) -> list[NewEntity]:
    """Every entity in ``folder/added_entities.tsv`` (an index folder; none when there is no such file)."""
    f = Path(folder) / ADDED_FILE
    return [e for _, e in read_new_entities(f)] if f.is_file() else []


RECORD_FOLDER = "added"  # RUN/added/<sha256>.tsv: the added list of each commit, outside the index folder


def record_path(run_dir: Path, sha: str) -> Path:
    """Where the added list whose sha256 is ``sha`` is kept outside the index (``RUN/added/<sha>.tsv``): a damaged
    or deleted index folder cannot take the added entities with it."""
    return Path(run_dir) / RECORD_FOLDER / f"{sha}.tsv"


def intact_list(f: Path) -> list[NewEntity] | None:
    """The entities of an added list that reads whole (parses, and ends with its last line's newline: kgc writes
    every line whole, so a list cut mid-line is damaged, not edited); None when it does not."""
    try:
        data = f.read_bytes()
        if not data.endswith(b"\n"):
            return None
        return [e for _, e in read_new_entities(f)]
    except (OSError, KGCError):
        return None


def kept_added(run_dir: Path, folder: Path, meta: dict | None, damaged_meta: str | None = None) -> tuple[
        list[NewEntity], str | None]:
    """The added entities a rebuild keeps, and a line saying where they came from when it is not simply the index's
    list (None then). The list of record is the one meta.json's sha256 names: the index's ``added_entities.tsv``
    when it still is that file, else its copy ``RUN/added/<sha256>.tsv``. A list edited on purpose (it reads whole,
    another sha256) is taken as it is, and said; deleted, its entities are dropped (how they are dropped). A list
    cut or unreadable, with no copy of record, is one KGCError. ``damaged_meta``: meta.json could not be read (this
    says why): the index's list is kept if it reads whole, else the newest copy of record."""
    f = Path(folder) / ADDED_FILE
    if damaged_meta is not None:
        whole = intact_list(f) if f.is_file() else None
        if whole is not None:
            return whole, f"meta.json was damaged ({damaged_meta}); the {len(whole)} entities of {f} are kept"
        copies = sorted(Path(run_dir, RECORD_FOLDER).glob("*.tsv"), key=lambda p: p.stat().st_mtime)
        for copy in reversed(copies):
            kept = intact_list(copy)
            if kept is not None and sha256_file(copy) == copy.stem:
                return kept, (f"meta.json was damaged ({damaged_meta}) and {f.name} is "
                              f"{'cut' if f.is_file() else 'gone'}; the {len(kept)} entities of {copy} are kept")
        if f.is_file():
            raise KGCError(f"{f}: cut or unreadable, and meta.json, which recorded it, is damaged too; no copy of it "
                           f"is kept in {Path(run_dir) / RECORD_FOLDER}. Restore the file (each line "
                           "id<TAB>name<TAB>description) and run the command again, or delete it to drop them.")
        return [], None
    rec = (meta or {}).get("added_entities")
    if rec is None:
        if not f.is_file():
            return [], None
        return [e for _, e in read_new_entities(f)], None  # listed by hand before any add: read as given
    if not f.is_file():
        return [], f"{f.name} was deleted: its {rec.get('count', 0)} added entities are dropped"
    sha = rec.get("sha256")
    if sha and sha256_file(f) == sha:
        return [e for _, e in read_new_entities(f)], None
    copy = record_path(run_dir, sha) if sha else None
    whole = intact_list(f)
    if whole is not None:
        kept = f" (the list before is kept in {copy})" if copy is not None and copy.is_file() else ""
        return whole, (f"{f.name} was edited since the last add: {rec.get('count', 0)} entities recorded, "
                       f"{len(whole)} listed now; the rebuild keeps the {len(whole)} it lists{kept}")
    if copy is not None and copy.is_file() and sha256_file(copy) == sha:
        kept = [e for _, e in read_new_entities(copy)]
        return kept, f"{f.name} is cut or unreadable; its {len(kept)} entities are restored from {copy}"
    raise KGCError(f"{f}: cut or unreadable (it is not the list meta.json recorded: {rec.get('count', 0)} entities, "
                   f"sha256 {str(sha)[:12]}…), and no copy of it is kept in {Path(run_dir) / RECORD_FOLDER}. Restore "
                   "it from the files it was added from (meta.json's added_entities.sources) and rebuild; nothing "
                   "was changed.")


def added_count(meta: dict | None) -> int:
    """How many added entities an index (its meta.json, None: no index) holds after the graph's own."""
    return int((meta or {}).get("added_entities", {}).get("count", 0))


def added_stale_reason(folder: Path, meta: dict) -> str | None:
    """Why the index's added entities do not match ``added_entities.tsv`` (None when they do)."""
    f, rec = Path(folder) / ADDED_FILE, meta.get("added_entities")
    if rec is None:
        return f"{f.name} lists entities the index does not hold" if f.is_file() else None
    if not f.is_file():
        return f"its added entities ({f.name}) are gone"
    if sha256_file(f) != rec.get("sha256"):
        return f"{f.name} changed since the entities were added"
    return None


def check_new(graph: KnowledgeGraph, rows: list[tuple[int, NewEntity]], where: str, fix: str) -> None:
    """No new entity may reuse an id of the graph."""
    for lineno, e in rows:
        if e.id in graph.entity_index:
            raise KGCError(f"{where}:{lineno}: id {e.id!r} is already an entity of the run's graph ({graph.source}). "
                           f"{fix}")


def tsv(entities: list[NewEntity]) -> str:
    return "".join(f"{e.id}\t{e.name}\t{e.description}\n" for e in entities)
