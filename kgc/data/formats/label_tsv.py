"""PyKEEN's label TSV: ``train``/``valid``/``test`` (``.txt`` or ``.tsv``), ``head<TAB>relation<TAB>tail`` a line and
nothing else; the entities are the triples' labels in first-seen order, and the texts are the labels with ``_`` →
space, without descriptions. The format a folder is read in when no other recognises it (the lowest rank)."""

from __future__ import annotations

from pathlib import Path

from kgc.data.formats.base import GraphFormat
from kgc.data.formats.kgbert import ENTITY_FILE, ENTITY_FORMS, LONG_FILE, RELATION_FILE
from kgc.data.formats.triples import SPLIT_FILES, assemble, read_splits, split_paths
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError


class LabelTSV(GraphFormat):
    name = "label_tsv"
    title = "PyKEEN label TSV"
    rank = 100
    markers = SPLIT_FILES["train"]
    files = tuple(f for names in SPLIT_FILES.values() for f in names)

    def recognises(self, folder: Path) -> bool:
        return True  # the last resort: a folder without its train split is then told which names were looked for

    def read(self, folder: Path, *, long_text: bool, optional_splits: tuple[str, ...]) -> KnowledgeGraph:
        paths = split_paths(folder, optional_splits)
        rel_file, long_file = folder / RELATION_FILE, folder / LONG_FILE
        if rel_file.exists() or long_file.exists():  # half a KG-BERT folder: an error, not a fallback
            other = rel_file.name if rel_file.exists() else long_file.name
            raise KGCError(f"{folder}: {other} but no {ENTITY_FILE}. A KG-BERT folder needs {ENTITY_FILE} "
                           f"({ENTITY_FORMS}); without it the entity ids would be their texts. Add it, or remove "
                           f"{other} to train on the labels of a PyKEEN label TSV.")
        ent_index: dict[str, int] = {}  # entities come from the triples, in first-seen order
        splits, first_seen = read_splits(paths, ent_index, grow=True, ent_file=folder / ENTITY_FILE)
        entities = list(ent_index)
        notes = [f"no {ENTITY_FILE}: a PyKEEN label TSV; entity and relation texts are the labels (\"_\" → space), "
                 "no descriptions"]
        return assemble(folder, entities=entities, names=[e.replace("_", " ") for e in entities],
                        descriptions=[""] * len(entities), splits=splits, first_seen=first_seen, rel_texts={},
                        rel_file=rel_file, layout=self.title, notes=notes, optional_splits=optional_splits)


LABEL_TSV = LabelTSV()
