"""Triple splits — ``train``/``dev``/``test``, ``head<TAB>relation<TAB>tail`` a line, under any of
:data:`SPLIT_FILES`' names — read into ``(n, 3)`` id arrays, and a graph assembled from them and its texts.

Every graph format with triple files reads them here: a clean large file with array operations (Wikidata5M's 20M
lines in seconds), anything else line by line (which names the line at fault). Relations are numbered in first-seen
order, then renumbered by :func:`assemble` so that those with a text come first in the text file's order.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from kgc.data.formats.lines import iter_rows
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError

SPLIT_FILES = {"train": ("train.tsv", "train.txt"), "dev": ("dev.tsv", "valid.txt", "valid.tsv", "dev.txt"),
               "test": ("test.tsv", "test.txt")}


def split_paths(folder: Path, optional_splits: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """Each split's file in ``folder``; a split in ``optional_splits`` may be absent (then it is left out)."""
    return {s: split_path(folder, s) for s in SPLIT_FILES
            if s not in optional_splits or any((folder / f).exists() for f in SPLIT_FILES[s])}


def read_splits(paths: dict[str, Path], entities: dict[str, int], *, grow: bool, ent_file: Path
                ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Every split of :data:`SPLIT_FILES` as ids (an absent one empty) and the relations in first-seen order (their
    provisional ids); ``entities`` is id → index, grown with each new entity when ``grow`` (a graph without an
    entity file)."""
    first_seen: dict[str, int] = {}
    labels: dict = {}
    splits = {s: read_triples(paths[s], entities, first_seen, grow=grow, ent_file=ent_file, labels=labels)
              if s in paths else np.empty((0, 3), dtype=np.int64) for s in SPLIT_FILES}
    return splits, first_seen


def strip_name_prefix(name: str, desc: str) -> str:
    """SimKGC: drop a description prefix that repeats the entity name."""
    if desc.startswith(name):
        desc = desc[len(name):].strip().lstrip(",:;").strip()
    return desc


def assemble(folder: Path, *, entities: list[str], names: list[str], descriptions: list[str],
             splits: dict[str, np.ndarray], first_seen: dict[str, int], rel_texts: dict[str, str], rel_file: Path,
             layout: str, notes: list[str], optional_splits: tuple[str, ...] | list[str]) -> KnowledgeGraph:
    """The graph of read splits and texts: relations with a text (``rel_texts``, in its order) first, the rest in
    first-seen order with their labels as texts (``_`` → space); each description loses a prefix that repeats its
    name (SimKGC). An empty train split is an error unless it is optional."""
    relations = dict.fromkeys(first_seen)
    if rel_texts:
        relations = {**{r: None for r in rel_texts if r in relations}, **relations}
        if missing := [r for r in relations if r not in rel_texts]:
            notes.append(f"{rel_file.name} has no text for {len(missing)} relation(s) ({', '.join(missing[:5])}"
                         f"{', …' if len(missing) > 5 else ''}): their labels are used")
    rel_list = list(relations)
    relation_texts = [rel_texts.get(r, r.strip("_").replace("_", " ")) for r in rel_list]
    for i, name in enumerate(names):  # in place: millions of descriptions are not copied
        descriptions[i] = strip_name_prefix(name, descriptions[i])
    rel_index = {r: i for i, r in enumerate(rel_list)}
    renumber = np.array([rel_index[r] for r in first_seen], dtype=np.int64)
    for arr in splits.values():
        arr[:, 1] = renumber[arr[:, 1]]
    if len(splits["train"]) == 0 and "train" not in optional_splits:
        raise KGCError(f"{split_path(folder, 'train')}: no triples. Give one per line: head<TAB>relation<TAB>tail.")
    return KnowledgeGraph(entities=entities, names=names, descriptions=descriptions, relations=rel_list,
                          relation_texts=relation_texts, splits=splits, source=str(folder), layout=layout,
                          notes=notes)


def read_triples(path: Path, entities: dict[str, int], relations: dict[str, int], *, grow: bool,
                  ent_file: Path, labels: dict | None = None) -> np.ndarray:
    """A split as ``(n, 3)`` int64 ids, streamed into a flat buffer (no per-line Python lists kept).

    Entity ids come from ``entities`` (an unknown one is an error, or gets the next id when ``grow``);
    relations are numbered in first-seen order into ``relations`` (the caller renumbers them).
    """
    if not grow and (fast := _clean_triples(path, entities, relations, {} if labels is None else labels)) is not None:
        return fast
    ids = array("q")
    for lineno, (h, r, t) in iter_rows(path, 3):
        if not (h and r and t):
            raise KGCError(f"{path}:{lineno}: an empty field in {'<TAB>'.join((h, r, t))!r}. Every line is "
                           "head<TAB>relation<TAB>tail.")
        for ent in (h, t):
            if ent not in entities:
                if not grow:
                    raise KGCError(f"{path}:{lineno}: unknown entity {ent!r} (not in {ent_file.name}). "
                                   "Add it to entity2text.txt or fix the triple.")
                entities[ent] = len(entities)
        ids.extend((entities[h], relations.setdefault(r, len(relations)), entities[t]))
    return np.frombuffer(ids, dtype=np.int64).reshape(-1, 3) if ids else np.empty((0, 3), dtype=np.int64)


FAST_LABEL_BYTES = 64  # the array reader handles labels up to this long; longer ones go line by line
_LINES_PER_PASS = 2_000_000


_MIX = np.random.default_rng(20261126).integers(1, 2 ** 63, FAST_LABEL_BYTES // 8, dtype=np.uint64) * 2 + 1


def _hash(labels: np.ndarray) -> np.ndarray:
    """A uint64 per fixed-width byte string: its 8-byte words times odd constants, summed (wrapping). One word (labels
    of up to 8 bytes, as Wikidata5M's ``Q12345678``) maps one to one; longer ones are checked for collisions."""
    width = labels.dtype.itemsize
    words = -(-width // 8)
    chars = np.zeros((len(labels), words * 8), dtype=np.uint8)
    chars[:, :width] = labels.view(np.uint8).reshape(len(labels), width)
    with np.errstate(over="ignore"):
        return (chars.view(np.uint64) * _MIX[:words]).sum(axis=1, dtype=np.uint64)


class _Labels:
    """Entity labels sorted by a 64-bit hash, for :func:`_clean_triples`' look-ups (built once per graph read, only
    when a split is large enough to need it); None from :meth:`build` when two labels share a hash."""

    def __init__(self, raw: np.ndarray, keys: np.ndarray) -> None:
        self.order = np.argsort(keys, kind="stable")
        self.keys, self.raw = keys[self.order], raw[self.order]

    @classmethod
    def build(cls, entities: dict[str, int]) -> "_Labels | None":
        encoded = [e.encode("utf-8") for e in entities]
        if max(map(len, encoded)) > FAST_LABEL_BYTES:
            return None
        raw = np.array(encoded, dtype=bytes)
        labels = cls(raw, _hash(raw))
        return labels if (np.diff(labels.keys) != 0).all() else None

    def ids(self, labels: np.ndarray) -> np.ndarray | None:
        """Entity ids of ``labels`` (fixed-width bytes), or None when one is not a label."""
        needles = _hash(labels)
        order = np.argsort(needles)  # sorted needles search several times faster (the bounds carry over)
        at = np.empty(len(needles), dtype=np.int64)
        at[order] = np.minimum(np.searchsorted(self.keys, needles[order]), len(self.keys) - 1)
        if not (self.raw[at] == labels).all():  # the hash found a label: is it this one, byte for byte
            return None
        return self.order[at]


def _fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The byte ranges ``buf[starts[i]:ends[i]]`` as one fixed-width ``S`` array (ranges are ≤ FAST_LABEL_BYTES)."""
    from kgc.data.ragged import spans

    lengths = ends - starts
    width = int(lengths.max())
    chars = np.zeros(len(starts) * width, dtype=np.uint8)
    chars[spans(np.arange(len(starts), dtype=np.int64) * width, lengths)] = buf[spans(starts, lengths)]
    return chars.view(f"S{width}")


def _clean_triples(path: Path, entities: dict[str, int], relations: dict[str, int], cache: dict) -> np.ndarray | None:
    """A split read with array operations (Wikidata5M's 20M lines in seconds, not minutes), or None when the file
    is not plainly clean — every line ``head<TAB>relation<TAB>tail<LF>``, no blank line, no CR, no byte-order mark,
    no space or non-ASCII byte at a field's edge, every head and tail a known label of at most
    :data:`FAST_LABEL_BYTES` bytes, relations UTF-8 — and the line-by-line reader then reads it (and names the line
    at fault, if any). What it returns is what that reader would: the same ids, relations numbered in first-seen
    order into ``relations``."""
    try:
        if path.stat().st_size < 1_000_000 or len(entities) == 0:
            return None  # small files: the line reader is quick, and it is the one that explains
        buf = np.fromfile(path, dtype=np.uint8)
    except OSError:
        return None
    if buf[-1] != 10:
        buf = np.append(buf, np.uint8(10))
    if buf[:3].tobytes() == b"\xef\xbb\xbf" or (buf == 13).any() or (buf == 0).any():
        return None
    nl = np.flatnonzero(buf == 10)
    tabs = np.flatnonzero(buf == 9)
    if len(tabs) != 2 * len(nl):
        return None
    starts = np.concatenate([[0], nl[:-1] + 1])
    t1, t2 = tabs[0::2], tabs[1::2]
    if not ((starts < t1) & (t1 + 1 < t2) & (t2 + 1 < nl)).all():  # two tabs a line, no field empty
        return None
    edges = buf[np.concatenate([starts, t1 - 1, t1 + 1, t2 - 1, t2 + 1, nl - 1])]
    if ((edges <= 32) | (edges >= 128)).any():  # whitespace (or anything not ASCII) where a field starts or ends
        return None
    if max(int((t1 - starts).max()), int((nl - t2 - 1).max())) > FAST_LABEL_BYTES:
        return None
    if "labels" not in cache:  # built once for the splits of one graph (``cache``: the caller's, per read)
        cache["labels"] = _Labels.build(entities)
    if (labels := cache["labels"]) is None:
        return None
    out = np.empty((len(nl), 3), dtype=np.int64)
    for a in range(0, len(nl), _LINES_PER_PASS):
        b = min(a + _LINES_PER_PASS, len(nl))
        heads, tails = labels.ids(_fields(buf, starts[a:b], t1[a:b])), labels.ids(_fields(buf, t2[a:b] + 1, nl[a:b]))
        if heads is None or tails is None:
            return None
        fields = _fields(buf, t1[a:b] + 1, t2[a:b])
        if fields.dtype.itemsize > FAST_LABEL_BYTES:
            return None
        _, first, inverse = np.unique(_hash(fields), return_index=True, return_inverse=True)
        rels = fields[first]
        if not (rels[inverse.ravel()] == fields).all():  # two relations under one hash
            return None
        try:
            names = [r.decode("utf-8") for r in rels]
        except UnicodeDecodeError:
            return None
        ids = np.empty(len(rels), dtype=np.int64)
        for j in np.argsort(first, kind="stable"):  # first-seen order, as the line reader numbers them
            ids[j] = relations.setdefault(names[j], len(relations))
        out[a:b, 0], out[a:b, 1], out[a:b, 2] = heads, ids[inverse.ravel()], tails
    return out


def split_path(folder: Path, split: str) -> Path:
    """The file of ``split`` in ``folder`` (the first of :data:`SPLIT_FILES`' names there)."""
    for fname in SPLIT_FILES[split]:
        if (folder / fname).exists():  # a folder of that name is reported by the reader
            return folder / fname
    raise KGCError(f"{folder}: no {split} split (looked for {', '.join(SPLIT_FILES[split])})")
