"""KG-BERT's folder layout: ``train.tsv``/``dev.tsv``/``test.tsv`` (or PyKEEN's ``.txt`` names) with
``entity2text.txt``, ``relation2text.txt`` and optionally ``entity2textlong.txt``.

When a long-text file exists, ``entity2text`` holds names and the long file descriptions (UMLS, FB15k-237; the
long texts are read only with ``data.long_text``); otherwise each ``entity2text`` line is ``id<TAB>name<TAB>
description`` or KG-BERT's ``id<TAB>name, description`` (WN18RR: ``dog, a member of the genus Canis …``), split at
the first ``", "``. A relation without a line in ``relation2text.txt`` (or without the file) has its label as text.
"""

from __future__ import annotations

from pathlib import Path

from kgc.data.formats.base import GraphFormat
from kgc.data.formats.lines import read_texts, text_lines
from kgc.data.formats.triples import SPLIT_FILES, assemble, read_splits, split_paths
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError

ENTITY_FILE, RELATION_FILE, LONG_FILE = "entity2text.txt", "relation2text.txt", "entity2textlong.txt"
TEXT_FILES = (ENTITY_FILE, RELATION_FILE, LONG_FILE)


ENTITY_FORMS = "id<TAB>name<TAB>description (or KG-BERT's id<TAB>name, description)"


def read_entity_texts(path: Path, *, names_only: bool) -> tuple[dict[str, tuple[str, str]], int]:
    """id → (name, description) from ``entity2text.txt``, and how many lines had two fields.

    Each line is ``id<TAB>name<TAB>description`` (the layout ``kgc index --add`` reads; further tabs belong to the
    description) or KG-BERT's ``id<TAB>text``, whose text is ``name, description`` split at the first ``", "``
    — unless ``names_only`` (a folder with ``entity2textlong.txt``: the text is the name). An empty name is an
    error naming the line."""
    out: dict[str, tuple[str, str]] = {}
    two = 0
    for lineno, line in text_lines(path):
        parts = [p.strip() for p in line.split("\t")]
        if len(parts) < 2:
            raise KGCError(f"{path}:{lineno}: expected {ENTITY_FORMS}, got one field: {line[:80]!r}. Separate the "
                           "fields with tabs.")
        key = parts[0]
        if len(parts) == 2:
            two += 1
            name, _, desc = (parts[1], "", "") if names_only else parts[1].partition(", ")
        else:
            name, desc = parts[1], " ".join(p for p in parts[2:] if p)
        if not key or not name.strip():
            what = "id" if not key else f"name for {key!r}"
            raise KGCError(f"{path}:{lineno}: empty {what} in {line[:80]!r}. Every entity needs an id and a name "
                           f"({ENTITY_FORMS}).")
        if key in out:
            raise KGCError(f"{path}:{lineno}: id {key!r} appears twice. Keep one line per id.")
        out[key] = (name.strip(), desc.strip())
    if not out:
        raise KGCError(f"{path}: empty (no entities). Give one per line: {ENTITY_FORMS}.")
    return out, two


class KGBert(GraphFormat):
    name = "kgbert"
    title = "KG-BERT"
    rank = 10
    markers = (ENTITY_FILE,)
    files = (*(f for names in SPLIT_FILES.values() for f in names), ENTITY_FILE, LONG_FILE, RELATION_FILE)

    def read(self, folder: Path, *, long_text: bool, optional_splits: tuple[str, ...]) -> KnowledgeGraph:
        paths = split_paths(folder, optional_splits)
        ent_file, rel_file, long_file = folder / ENTITY_FILE, folder / RELATION_FILE, folder / LONG_FILE
        notes: list[str] = []
        has_long = long_file.exists()
        ent_texts, two_fields = read_entity_texts(ent_file, names_only=has_long)
        entities = list(ent_texts)
        names = [ent_texts[e][0] for e in entities]
        if has_long:
            longs = read_texts(long_file) if long_text else {}
            descriptions = [longs.pop(e, "") or ent_texts[e][1] for e in entities]  # pop: each text held once
            if not long_text:
                notes.append(f"{long_file.name} is not read (data.long_text: false): entities have their names "
                             "only; set data.long_text: true for the descriptions")
        else:
            descriptions = [ent_texts[e][1] for e in entities]
            if two_fields:
                notes.append(f"{ent_file.name}: {two_fields} line(s) of two fields were split at the first \", \" "
                             "into name and description (KG-BERT); a name holding \", \" needs the three-field "
                             "form id<TAB>name<TAB>description")
        del ent_texts
        if rel_file.exists():
            rel_texts = read_texts(rel_file)
        else:
            rel_texts = {}
            notes.append(f"no {rel_file.name}: relation texts are the relation labels (\"_\" → space)")
        # triples stream straight into id arrays (Wikidata5M's 20M lines never sit in memory as Python lists)
        splits, first_seen = read_splits(paths, {e: i for i, e in enumerate(entities)}, grow=False,
                                         ent_file=ent_file)
        return assemble(folder, entities=entities, names=names, descriptions=descriptions, splits=splits,
                        first_seen=first_seen, rel_texts=rel_texts, rel_file=rel_file, layout=self.title,
                        notes=notes, optional_splits=optional_splits)


KGBERT = KGBert()
