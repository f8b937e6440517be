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
* ``RUN/added/<sha256>.tsv`` — the copy of record of that list, written before the index commits it, outside the
  index folder. No rebuild, ``--force``, server watcher or sweep deletes it: a rebuild (``kgc index RUN --force``,
  or any command that finds the index missing or stale) reads from it when the index's list is deleted, cut or
  damaged, when meta.json is damaged, or when the whole index folder is gone (:func:`kept_added`); a list that
  disagrees with it is refused with both named. A commit removes only earlier copies its own list contains.
  The index is fresh when its base fingerprint (weights, graph texts) matches *and* ``added_entities.tsv`` is the
  one recorded; rebuilding the index re-embeds the added entities from their list, so they survive a retrained or
  edited run. Only ``kgc index RUN --drop-added`` drops them and removes their copies.

Their text follows the graph's rules (``name: description``, a description prefix repeating the name
dropped); they have no train-graph neighbours, so no neighbour names are appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kgc.data.formats.lines import text_lines
from kgc.data.formats.triples import strip_name_prefix
from kgc.data.graph import KnowledgeGraph, nfc, spellings
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
        parts = [nfc(p.strip()) for p in line.split("\t")]  # stored in NFC: one spelling of each name
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
                          descriptions=graph.descriptions + [strip_name_prefix(e.name, e.description)
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


def copies_of_record(run_dir: Path) -> list[tuple[Path, list[NewEntity]]]:
    """Every copy of record in ``RUN/added/`` that is whole (its sha256 is its name), shortest list first."""
    found = []
    for copy in Path(run_dir, RECORD_FOLDER).glob("*.tsv"):
        kept = intact_list(copy)
        if kept is not None and sha256_file(copy) == copy.stem:
            found.append((copy, kept))
    return sorted(found, key=lambda c: (len(c[1]), c[0].name))


def _prefix(short: list[NewEntity], long: list[NewEntity]) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def _newest(lists: list[tuple[Path, list[NewEntity]]]) -> tuple[Path, list[NewEntity]] | None:
    """The longest of ``lists`` when every other is a prefix of it (an add appends, so the lists one run recorded
    form a chain and the longest is the last); None when there are none. Two that diverge are one KGCError."""
    if not lists:
        return None
    last = max(lists, key=lambda c: len(c[1]))
    for path, entities in lists:
        if not _prefix(entities, last[1]):
            raise KGCError(f"{path} and {last[0]} list different added entities, and no meta.json says which is the "
                           f"list of record. Keep the one you want, move the other out of {path.parent}, and run the "
                           "command again; nothing was changed.")
    return last


def _fix(run_dir: Path) -> str:
    return (f"to drop the added entities instead: `kgc index {run_dir} --drop-added` (the only command that removes "
            f"{Path(run_dir) / RECORD_FOLDER})")


def kept_added(run_dir: Path, folder: Path, meta: dict | None, damaged_meta: str | None = None) -> tuple[
        list[NewEntity], str | None]:
    """The added entities a rebuild keeps, and a line saying where they came from when it is not simply the index's
    list (None then). Nothing here deletes anything: a rebuild reads the list of record, and a list it cannot
    trust is refused with the copy named.

    The list of record is the one meta.json's sha256 names, kept in ``RUN/added/<sha256>.tsv`` (the index's
    ``added_entities.tsv`` is that file's working copy). The index's list deleted, cut (mid-line, or at a line
    boundary: a prefix of the record) or unreadable: the copy of record is restored, and said. The index's list
    changed otherwise (entities the record does not hold, in another order): one KGCError naming both files — it is
    neither trusted nor replaced. No meta.json (the index folder deleted) or a damaged one (``damaged_meta`` says
    why): the longest whole list among the copies of record and the index's list, when the others are its prefixes.
    Only ``kgc index RUN --drop-added`` removes the added entities and their copies."""
    f = Path(folder) / ADDED_FILE
    rec = None if damaged_meta is not None else (meta or {}).get("added_entities")
    listed = intact_list(f) if f.is_file() else None
    if rec is not None:
        sha = rec.get("sha256")
        if sha and f.is_file() and sha256_file(f) == sha:
            return listed if listed is not None else [e for _, e in read_new_entities(f)], None
        copy = record_path(run_dir, sha) if sha else None
        record = intact_list(copy) if copy is not None and copy.is_file() and sha256_file(copy) == sha else None
        if record is None:
            state = "deleted" if not f.is_file() else "cut or unreadable" if listed is None else \
                "not the list meta.json recorded"
            raise KGCError(f"{f}: {state} (meta.json recorded {rec.get('count', 0)} entities, sha256 "
                           f"{str(sha)[:12]}…), and no copy of it is kept in "
                           f"{Path(run_dir) / RECORD_FOLDER}. Restore it from the files it was added from (meta.json's "
                           f"added_entities.sources) and run the command again, or {_fix(run_dir)}; nothing was "
                           "changed.")
        if not f.is_file():
            return record, f"{f.name} was deleted: its {len(record)} added entities are restored from {copy}"
        if listed is None:
            return record, f"{f.name} is cut or unreadable; its {len(record)} entities are restored from {copy}"
        if _prefix(listed, record):
            return record, (f"{f.name} holds only the first {len(listed)} of the {len(record)} entities recorded (cut "
                            f"at a line); all {len(record)} are restored from {copy}")
        raise KGCError(f"{f}: {len(listed)} entities that are not the list of record ({copy}: {len(record)} "
                       "entities, the ones meta.json names): edited since the last add. Nothing was changed. To keep "
                       f"the recorded ones: `cp {copy} {f}`; to replace them with this list: move it out of "
                       f"{folder}, run `kgc index {run_dir} --drop-added`, then `kgc index {run_dir} --add` it.")
    found = copies_of_record(run_dir)
    if listed is not None:
        found.append((f, listed))
    newest = _newest(found)
    if newest is None:
        if f.is_file():  # cut, and nothing to restore it from
            why = f"meta.json, which recorded it, is damaged too ({damaged_meta})" if damaged_meta is not None else \
                "no meta.json records it"
            raise KGCError(f"{f}: cut or unreadable, and {why}; no copy of it is kept in "
                           f"{Path(run_dir) / RECORD_FOLDER}. Restore the file (each line id<TAB>name<TAB>description) "
                           f"and run the command again, or {_fix(run_dir)}; nothing was changed.")
        return [], None
    source, kept = newest
    if damaged_meta is not None:
        state = "kept" if source == f else "restored"
        return kept, f"meta.json was damaged ({damaged_meta}); the {len(kept)} entities of {source} are {state}"
    if source == f:
        return kept, None  # listed by hand before any add, read as given
    if meta is None:
        return kept, (f"{folder} has no meta.json (the index was deleted); its {len(kept)} added entities are "
                      f"restored from {source}")
    return kept, (f"the {len(kept)} entities of {source} (an add that did not commit, or a list an earlier build "
                  f"left out) are kept; {_fix(run_dir)}")


def prunable(run_dir: Path, record: Path | None, entities: list[NewEntity]) -> list[Path]:
    """The copies of record a commit of ``entities`` (its copy ``record``) makes redundant: earlier lists that are a
    prefix of it (every entity they hold is in the new record). Copies it does not hold stay."""
    return [copy for copy, listed in copies_of_record(run_dir)
            if copy != record and entities and _prefix(listed, entities) and len(listed) < len(entities)]


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
        same = next((graph.entity_index[f] for f in spellings(e.id) if f in graph.entity_index), None)
        if same is not None:
            twin = graph.entities[same]
            form = "" if twin == e.id else f" (as {twin!r}: the same letters in another Unicode form)"
            raise KGCError(f"{where}:{lineno}: id {e.id!r} is already an entity of the run's graph{form} "
                           f"({graph.source}). {fix}")


def tsv(entities: list[NewEntity]) -> str:
    return "".join(f"{e.id}\t{e.name}\t{e.description}\n" for e in entities)
