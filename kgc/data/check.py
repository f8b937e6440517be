"""What a link-prediction dataset folder holds, and what is wrong with it: ``kgc data check PATH``, and the data
summary ``kgc train`` prints before it trains.

Reading the folder (:func:`kgc.data.formats.read_graph`) already stops at anything unreadable, with the file, the
line and the fix. On a graph that reads, :func:`check_graph` adds what a reader cannot see line by line:

* **errors** — a relation that occurs in dev or test but in no train triple (the model never trained on it;
  allowed only with ``data.allow_unseen_relations: true``, then it is ranked from its text alone);
* **warnings** — entities of dev/test unseen in train, entities that share one text (the model cannot tell them
  apart), entity texts longer than ``data.max_tokens`` (cut), an empty dev or test split;
* **leakage warnings** (``kgc data check --strict``: errors) — dev/test triples also in train, exactly; dev/test
  triples ``(h, r, t)`` whose reverse ``(t, r', h)`` is in train for a relation ``r'`` that behaves as the inverse
  of ``r`` in train (``r' = r``: a symmetric relation; the WN18 / FB15k test leakage of Toutanova & Chen 2015 and
  Dettmers et al. 2018; see :func:`inverse_pairs`); duplicate triples within a split, and test triples also in dev;
  self-loops (``h == t``) per split;
* **notes** — the fallbacks the reader took (no ``relation2text.txt``: labels; a long-text file left unread; two-field
  lines split at ``", "``; a PyKEEN label TSV: labels as texts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from kgc.data.formats import detect
from kgc.data.formats.triples import SPLIT_FILES
from kgc.data.graph import KnowledgeGraph
from kgc.data.ragged import searchsorted, unique_sorted
from kgc.errors import KGCError



# r' is taken for the inverse of r when (t, r', h) is in train for at least INVERSE_SHARE of r's train triples
# (h, r, t), and r has at least INVERSE_SUPPORT train triples (self-loops left out of both counts)
INVERSE_SHARE = 0.8
INVERSE_SUPPORT = 5
LEAK = "leak"  # Finding.kind of the leakage findings: warnings, errors under `kgc data check --strict`


@dataclass
class Finding:
    level: str  # "error" | "warning" | "note"
    text: str
    kind: str = ""  # LEAK: a leakage finding (test triples seen in train, duplicates, self-loops)


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

    def strict(self) -> "DataReport":
        """This report with the leakage warnings as errors (``kgc data check --strict``); the report itself is left
        as it was."""
        return replace(self, findings=[replace(f, level="error") if f.kind == LEAK and f.level == "warning" else f
                                       for f in self.findings])

    def raise_errors(self) -> None:
        """One KGCError listing every error (nothing is raised when there is none)."""
        if self.errors:
            raise KGCError(f"{self.folder}: " + "; ".join(self.errors))


def _examples(labels: Sequence[str], n: int = 5) -> str:
    return ", ".join(labels[:n]) + (", …" if len(labels) > n else "")


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, positions)``: row ``i`` repeated ``lengths[i]`` times beside ``starts[i], starts[i] + 1, …``."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
    return rows, np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))


def _keys(triples: np.ndarray, num_relations: int, num_entities: int) -> np.ndarray:
    """int64 keys ``(h * R + r) * E + t`` of ``(n, 3)`` triples (Wikidata5M: < 2e16)."""
    t = triples.astype(np.int64, copy=False)
    return (t[:, 0] * num_relations + t[:, 1]) * num_entities + t[:, 2]


def _isin_sorted(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    pos = np.minimum(searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[pos] == keys


def inverse_pairs(train: np.ndarray, num_entities: int, num_relations: int, *, share: float = INVERSE_SHARE,
                  support: int = INVERSE_SUPPORT) -> list[tuple[int, int, int, int]]:
    """``(r, r2, reversed, of)`` for the relation pairs where ``r2`` behaves as the inverse of ``r`` in ``train``:
    ``(t, r2, h)`` is in train for ``reversed`` of r's ``of`` distinct train triples ``(h, r, t)``, with
    ``reversed / of >= share`` and ``of >= support``; ``r2 == r`` is a symmetric relation. Self-loops are left out
    (a self-loop is its own reverse). Sorted by ``r``, then ``r2``."""
    E, R = num_entities, num_relations
    keys = unique_sorted(_keys(train, R, E))
    h, r, t = keys // (R * E), (keys // E) % R, keys % E
    keep = h != t
    h, r, t = h[keep], r[keep], t[keep]
    of = np.bincount(r, minlength=R)
    ht = h * E + t
    order = np.argsort(ht, kind="stable")
    ht_sorted = ht[order]
    reverse = t * E + h
    lo = searchsorted(ht_sorted, reverse, "left")
    rows, pos = _ranges(lo, searchsorted(ht_sorted, reverse, "right") - lo)
    pairs, counts = np.unique(r[rows] * R + r[order[pos]], return_counts=True)  # (r, r2): triples of r reversed
    r1, r2 = pairs // R, pairs % R
    ok = (of[r1] >= support) & (counts >= share * of[r1])
    return [(int(a), int(b), int(c), int(of[a])) for a, b, c in zip(r1[ok], r2[ok], counts[ok])]


def _pct(n: int, total: int) -> str:
    return f"{n / total:.1%}" if total else "-"


def check_leakage(graph: KnowledgeGraph) -> list[Finding]:
    """The leakage warnings of :func:`check_graph` (kind :data:`LEAK`): dev/test triples in train, exactly or
    reversed under an inverse relation (:func:`inverse_pairs`); duplicates within a split and test triples also in
    dev; self-loops. Each with its counts and up to 3 examples by name; vectorised (FB15k-237: well under a second)."""
    E, R = graph.num_entities, graph.num_relations
    splits = {s: np.asarray(graph.splits[s]).reshape(-1, 3).astype(np.int64) for s in ("train", "dev", "test")}
    keys = {s: _keys(t, R, E) for s, t in splits.items()}
    train_keys = unique_sorted(keys["train"])

    def name(e: int) -> str:
        text = graph.names[e] if e < len(graph.names) and graph.names[e] else graph.entities[e]
        return text if len(text) <= 40 else text[:39] + "…"

    def triple(row) -> str:
        h, r, t = (int(x) for x in row)
        head, tail = name(h), name(t)
        if head == tail and h != t:  # two entities of one name (WN18RR's senses): their ids tell them apart
            head, tail = f"{head} [{graph.entities[h]}]", f"{tail} [{graph.entities[t]}]"
        return f"({head}, {graph.relations[r]}, {tail})"

    def examples(rows: np.ndarray) -> str:
        return "; ".join(triple(row) for row in rows[:3]) + ("; …" if len(rows) > 3 else "")

    found: list[Finding] = []
    add = lambda text: found.append(Finding("warning", text, LEAK))  # noqa: E731
    pairs = inverse_pairs(splits["train"], E, R)
    pair_r = np.array([p[0] for p in pairs], dtype=np.int64)
    pair_r2 = np.array([p[1] for p in pairs], dtype=np.int64)
    for split in ("dev", "test"):
        t, n = splits[split], len(splits[split])
        if not n:
            continue
        exact = _isin_sorted(keys[split], train_keys)
        if exact.any():
            k = int(exact.sum())
            add(f"{k:,} {split} triple(s) ({_pct(k, n)} of {split}) also occur in train, exactly: they test "
                f"memory, not inference (e.g. {examples(t[exact])})")
        if not pairs:
            continue
        lo = searchsorted(pair_r, t[:, 1], "left")
        rows, pos = _ranges(lo, searchsorted(pair_r, t[:, 1], "right") - lo)
        loop = t[rows, 0] == t[rows, 2]  # a self-loop is its own reverse: counted as a self-loop only
        rows, pos = rows[~loop], pos[~loop]
        hit = _isin_sorted((t[rows, 2] * R + pair_r2[pos]) * E + t[rows, 0], train_keys)
        leaked = unique_sorted(rows[hit])
        if not len(leaked):
            continue
        per_pair = np.bincount(pos[hit], minlength=len(pairs))
        ranked = [i for i in np.argsort(-per_pair, kind="stable") if per_pair[i]]
        listed = ", ".join(
            f"{graph.relations[pairs[i][0]]}" + (" (symmetric)" if pairs[i][0] == pairs[i][1]
                                                 else f" ↔ {graph.relations[pairs[i][1]]}")
            + f": {int(per_pair[i]):,} ({pairs[i][2]:,}/{pairs[i][3]:,} of train reversed)" for i in ranked[:5])
        first = {int(r): int(p) for r, p in zip(rows[hit][::-1], pos[hit][::-1])}  # a pair of each leaked triple
        shown = "; ".join(f"{triple(t[i])} ← {triple((t[i, 2], pairs[first[int(i)]][1], t[i, 0]))}"
                          for i in leaked[:3]) + ("; …" if len(leaked) > 3 else "")
        k = len(leaked)
        add(f"{k:,} {split} triple(s) ({_pct(k, n)} of {split}) have their reverse in train under an inverse relation "
            f"((t, r', h) in train for (h, r, t), where r' reverses >= {INVERSE_SHARE:.0%} of r's train triples; "
            f"{len(ranked)} relation pair(s): {listed}{', …' if len(ranked) > 5 else ''}): a model can answer them "
            f"by looking the reverse up (e.g. {shown})")
    dupes = {}
    for split, k in keys.items():
        _, first, counts = np.unique(k, return_index=True, return_counts=True)
        dupes[split] = (int((counts - 1).sum()), splits[split][np.sort(first[counts > 1])])
    if any(d for d, _ in dupes.values()):
        shown = next(rows for d, rows in dupes.values() if d)
        add("duplicate triples (repeats of a triple within its split): "
            + ", ".join(f"{s} {d:,}" for s, (d, _) in dupes.items())
            + f" (e.g. {examples(shown)}): repeats weigh a triple twice in training and in the metrics")
    if len(keys["test"]) and len(keys["dev"]):
        both = np.isin(keys["test"], keys["dev"])
        if both.any():
            k = int(both.sum())
            add(f"{k:,} test triple(s) ({_pct(k, len(keys['test']))} of test) also occur in dev "
                f"(e.g. {examples(splits['test'][both])})")
    loops = {s: t[t[:, 0] == t[:, 2]] for s, t in splits.items()}
    if any(len(v) for v in loops.values()):
        shown = next(v for v in loops.values() if len(v))
        add("self-loops (head = tail): " + ", ".join(f"{s} {len(v):,}" for s, v in loops.items())
            + f" (e.g. {examples(shown)})")
    return found


def check_graph(graph: KnowledgeGraph, *, allow_unseen_relations: bool = False) -> DataReport:
    """The report of a graph that was read (texts cut at ``data.max_tokens``: :meth:`DataReport.with_lengths`)."""
    folder = Path(graph.source)
    files = [f for f in detect(folder).files if (folder / f).exists()]  # what its format reads, as present
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
            first = _first_line(folder, split, set(labels))
            text = (f"{len(rels)} relation(s) of {split} occur in no train triple ({_examples(labels)}; {n} {split} "
                    f"triples{f', the first at {first}' if first else ''})")
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
    report.findings += check_leakage(graph)
    for note in graph.notes:
        add("note", note)
    return report


def _first_line(folder: Path, split: str, labels: set[str]) -> str:
    """``FILE:LINE`` of the first triple of ``split`` whose relation is one of ``labels`` ("" where the split's file
    is not a triples file kgc can read line by line here)."""
    for name in SPLIT_FILES[split]:
        path = Path(folder) / name
        if path.is_file():
            try:
                with path.open(encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        parts = line.rstrip("\n").split("\t")
                        if len(parts) >= 3 and parts[1].strip() in labels:
                            return f"{path.name}:{lineno}"
            except OSError:
                return ""
            return ""
    return ""
