"""A graph format the demo adds (its ``kgc.graph_formats`` entry point names ``JSONL``): a folder holding
``graph.jsonl``, one JSON object a line — ``{"head", "relation", "tail", "split"}`` for a triple (split ``train``,
``dev`` or ``test``; ``train`` when absent) or ``{"entity", "name", "description"}`` for an entity's texts. One module:
its markers, and a ``read`` through kgc's line reader (UTF-8, the line named on an error) and graph assembly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kgc.data.formats.base import GraphFormat
from kgc.data.formats.lines import text_lines
from kgc.data.formats.triples import assemble
from kgc.errors import KGCError

FILE = "graph.jsonl"


class JsonLines(GraphFormat):
    name = "jsonl"
    title = "JSON lines"
    rank = 20  # before the label TSV's last resort
    markers = (FILE,)
    files = (FILE,)

    def read(self, folder: Path, *, long_text: bool, optional_splits: tuple[str, ...]):
        path = folder / FILE
        texts: dict[str, tuple[str, str]] = {}
        triples: dict[str, list[tuple[str, str, str]]] = {"train": [], "dev": [], "test": []}
        for lineno, line in text_lines(path):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KGCError(f"{path}:{lineno}: not a JSON object ({exc.msg}). Write one object a line.") from None
            if "entity" in row:
                texts[row["entity"]] = (row.get("name") or row["entity"], row.get("description", ""))
            elif {"head", "relation", "tail"} <= row.keys() and row.get("split", "train") in triples:
                triples[row.get("split", "train")].append((row["head"], row["relation"], row["tail"]))
            else:
                raise KGCError(f"{path}:{lineno}: neither an entity nor a triple of train/dev/test: {line[:80]!r}")
        entities = dict.fromkeys(texts)
        first_seen: dict[str, int] = {}
        for rows in triples.values():
            for h, r, t in rows:
                entities.setdefault(h)
                entities.setdefault(t)
                first_seen.setdefault(r, len(first_seen))
        index = {e: i for i, e in enumerate(entities)}
        splits = {s: np.array([(index[h], first_seen[r], index[t]) for h, r, t in rows], dtype=np.int64).reshape(-1, 3)
                  for s, rows in triples.items()}
        names = [texts.get(e, (e, ""))[0] for e in entities]
        return assemble(folder, entities=list(entities), names=names,
                        descriptions=[texts.get(e, (e, ""))[1] for e in entities], splits=splits,
                        first_seen=first_seen, rel_texts={}, rel_file=path, layout=self.title,
                        notes=[] if texts else [f"{FILE} names no entity: texts are the ids"],
                        optional_splits=optional_splits)


JSONL = JsonLines()
