"""What a link-prediction dataset folder holds, and what is wrong with it: ``kgc data check PATH``, and the data
summary ``kgc train`` prints before it trains.

Reading the folder (:func:`kgc.data.graph.read_graph`) already stops at anything unreadable, with the file, the
line and the fix. On a graph that reads, :func:`check_graph` adds what a reader cannot see line by line:

* **errors** — a relation that occurs in dev or test but in no train triple (the model never trained on it;
  allowed only with ``data.allow_unseen_relations: true``, then it is ranked from its text alone);
* **warnings** — entities of dev/test unseen in train, entities that share one text (the model cannot tell them
  apart), entity texts longer than ``data.max_tokens`` (cut), an empty dev or test split;
* **notes** — the fallbacks the reader took (no ``relation2text.txt``: labels; a long-text file left unread; two-field
  lines split at ``", "``; a PyKEEN label TSV: labels as texts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from kgc.data.graph import SPLIT_FILES, KnowledgeGraph
from kgc.errors import KGCError

TEXT_FILES = ("entity2text.txt", "entity2textlong.txt", "relation2text.txt")


@dataclass
class Finding:
    level: str  # "error" | "warning" | "note"
    text: str


@dataclass
class DataReport:
    """The counts and findings of one dataset; ``lines()`` is the table ``kgc data check`` prints."""

    folder: str
    layout: str
    files: list[str]
    triples: dict[str, int]
    entities: int
    relations: int
    findings: list[Finding] = field(default_factory=list)

    def of(self, level: str) -> list[str]:
        return [f.text for f in self.findings if f.level == level]

    @property
    def errors(self) -> list[str]:
        return self.of("error")

    def summary_lines(self) -> list[str]:
        """The counts, as a small table."""
        t = self.triples
        return [f"data: {self.folder} ({self.layout}; {', '.join(self.files)})",
                f"  {'entities':<10}{self.entities:>10,}   {'relations':<10}{self.relations:>6,}",
                f"  {'triples':<10}{'train':>10} {'dev':>10} {'test':>10}",
                f"  {'':<10}{t['train']:>10,} {t['dev']:>10,} {t['test']:>10,}"]

    def lines(self) -> list[tuple[str, str]]:
        """``(level, line)`` for every line of the report: "" for the counts, then errors, warnings, notes."""
        out = [("", line) for line in self.summary_lines()]
        for level in ("error", "warning", "note"):
            out += [(level, f"{level}: {text}") for text in self.of(level)]
        if not self.errors and not self.of("warning"):
            out.append(("", "no problems found"))
        return out

    def with_lengths(self, token_lengths: Sequence[int], max_tokens: int) -> "DataReport":
        """This report plus a warning for the entity texts longer than ``max_tokens`` (``token_lengths``: each entity's
        evaluation text in tokens, special tokens included); the report itself is left as it was."""
        lengths = np.asarray(token_lengths)
        cut = int((lengths > max_tokens).sum()) if len(lengths) else 0
        if not cut:
            return self
        return replace(self, findings=self.findings + [Finding(
            "warning", f"{cut} entity text(s) ({cut / len(lengths):.1%}) are longer than data.max_tokens={max_tokens} "
                       f"and are cut (the longest: {int(lengths.max())} tokens)")])

    def raise_errors(self) -> None:
        """One KGCError listing every error (nothing is raised when there is none)."""
        if self.errors:
            raise KGCError(f"{self.folder}: " + "; ".join(self.errors))


def _examples(labels: Sequence[str], n: int = 5) -> str:
    return ", ".join(labels[:n]) + (", …" if len(labels) > n else "")


def check_graph(graph: KnowledgeGraph, *, allow_unseen_relations: bool = False) -> DataReport:
    """The report of a graph that was read (texts cut at ``data.max_tokens``: :meth:`DataReport.with_lengths`)."""
    folder = Path(graph.source)
    files = [f for names in SPLIT_FILES.values() for f in names if (folder / f).exists()]
    files += [f for f in TEXT_FILES if (folder / f).exists()]
    report = DataReport(folder=str(folder), layout=graph.layout or "?", files=files,
                        triples={s: int(len(graph.splits[s])) for s in SPLIT_FILES},
                        entities=graph.num_entities, relations=graph.num_relations)
    add = lambda level, text: report.findings.append(Finding(level, text))  # noqa: E731
    for split in ("dev", "test"):
        if not len(graph.splits[split]):
            add("warning", f"the {split} split is empty" + (": nothing to validate on; best.pt is the final weights"
                                                             if split == "dev" else ": nothing to evaluate"))
            continue
        ents, rels = graph.unseen_in_train(split)
        if len(rels):
            labels = [graph.relations[r] for r in rels]
            n = int(np.isin(graph.splits[split][:, 1], rels).sum())
            text = (f"{len(rels)} relation(s) of {split} occur in no train triple ({_examples(labels)}; {n} {split} "
                    "triples)")
            if allow_unseen_relations:
                add("warning", text + ": ranked from their text alone (data.allow_unseen_relations: true)")
            else:
                add("error", text + ". Move some of their triples to train, or set data.allow_unseen_relations: "
                                    "true to evaluate them as new relations")
        if len(ents):
            add("warning", f"{len(ents)} entities of {split} occur in no train triple "
                           f"({_examples([graph.entities[e] for e in ents])}): they are ranked from their text alone")
    by_text: dict[str, list[int]] = defaultdict(list)
    for e, text in enumerate(graph.full_texts):
        by_text[text].append(e)
    shared = [ids for ids in by_text.values() if len(ids) > 1]
    if shared:
        n = sum(len(ids) for ids in shared)
        first = shared[0]
        add("warning", f"{n} entities share their text with another ({len(shared)} texts; e.g. "
                       f"{graph.full_texts[first[0]][:50]!r}: {_examples([graph.entities[e] for e in first], 3)}): "
                       "the model cannot tell them apart; give them descriptions")
    for note in graph.notes:
        add("note", note)
    return report
