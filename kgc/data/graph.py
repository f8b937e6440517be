"""The knowledge graph: ids, names, descriptions, splits, inverse relations and the filter index.

Two folder layouts are read:

* KG-BERT: ``train.tsv``/``dev.tsv``/``test.tsv`` + ``entity2text.txt``, ``relation2text.txt`` and
  optionally ``entity2textlong.txt``. When a long-text file exists, ``entity2text`` holds names and the
  long file holds descriptions (UMLS, FB15k-237); otherwise ``entity2text`` is ``name, description``
  (WN18RR: ``dog, a member of the genus Canis …``) and is split at the first ``", "``.
* PyKEEN label TSV: ``train``/``valid``/``test`` (``.txt`` or ``.tsv``), ``head<TAB>relation<TAB>tail``;
  texts are the labels with ``_`` → space.

Relation ids ``0..R-1`` are the forward relations, ``R..2R-1`` their inverses (text ``inverse <r>``).
"""

from __future__ import annotations

import unicodedata
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import scipy.sparse as sp

from kgc.data.catalog import find_dataset
from kgc.errors import KGCError, UnknownName

if TYPE_CHECKING:
    from kgc.data.ragged import Ragged


def nfc(text: str) -> str:
    """``text`` in Unicode NFC ("é" as one code point, not "e" + a combining accent): the one spelling kgc compares
    names typed by people in (ids, names, relations; an added entity is stored so)."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def spellings(text: str) -> list[str]:
    """``text`` as given, in NFC and in NFD, each once: a graph read as its files spell it (most are NFC; a few
    datasets are NFD throughout) is found whichever form a query comes in."""
    if text.isascii():
        return [text]
    return list(dict.fromkeys((text, unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text))))

# a head that names no entity but is spelt this close (difflib ratio, case ignored) to an entity's id or name is
# taken for a typo of it: 0.8 is one letter dropped, added or swapped in a 5-letter name ("Lisbn" ~ "lisbon" 0.91,
# "virsu" ~ "virus" 0.8), while a description ("a city on the Atlantic coast") stays well below
NEAR_MISS = 0.8
# above this many ids and names, near misses come from a word index's candidates (kgc/data/spelling.py), not from
# difflib over every one (about 0.5 s per 100,000 spellings)
BRUTE_SPELLINGS = 20_000

SPLIT_FILES = {"train": ("train.tsv", "train.txt"), "dev": ("dev.tsv", "valid.txt", "valid.tsv", "dev.txt"),
               "test": ("test.tsv", "test.txt")}


class AnswerIndex:
    """Known answers per query key ``h * 2R + r``, stored by the keys that occur (O(triples) memory).

    A sparse matrix with one row per possible key would need E · 2R rows — 7.5e9 for Wikidata5M, a 60 GB
    row-pointer array — so the distinct keys are kept sorted, and ``index[keys]`` builds the (batch, entities)
    CSR rows of just those queries (``searchsorted``)."""

    def __init__(self, hr_keys: np.ndarray, answers: np.ndarray, num_entities: int) -> None:
        hr_keys, answers = hr_keys.astype(np.int64), answers.astype(np.int64)
        if len(hr_keys) and int(hr_keys.max()) < np.iinfo(np.int64).max // max(1, num_entities) - 1:
            flat = np.sort(hr_keys * num_entities + answers)  # one int64 per pair: a plain sort, not rows
            flat = flat[np.concatenate([[True], flat[1:] != flat[:-1]])]
            pairs = np.stack([flat // num_entities, flat % num_entities], axis=1)
        else:
            pairs = np.unique(np.stack([hr_keys, answers], axis=1), axis=0)
        first = np.flatnonzero(np.concatenate([[True], pairs[1:, 0] != pairs[:-1, 0]])) if len(pairs) else \
            np.zeros(0, dtype=np.int64)
        self.keys, starts = pairs[first, 0], first  # (K,) sorted distinct query keys, where each starts
        self.indptr = np.append(starts, len(pairs)).astype(np.int64)  # (K + 1,)
        self.answers = pairs[:, 1]  # (pairs,) sorted within each key
        self.num_entities = num_entities

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], num_entities: int) -> "AnswerIndex":
        index = cls.__new__(cls)
        index.keys, index.indptr, index.answers = arrays["keys"], arrays["indptr"], arrays["answers"]
        index.num_entities = num_entities
        return index

    def __getitem__(self, hr_keys: np.ndarray) -> sp.csr_matrix:
        """(batch, entities) boolean CSR: row i holds the known answers of query key ``hr_keys[i]``."""
        hr_keys = np.asarray(hr_keys, dtype=np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self.keys, hr_keys), max(0, len(self.keys) - 1))
        found = self.keys[pos] == hr_keys if len(self.keys) else np.zeros(len(hr_keys), dtype=bool)
        starts = self.indptr[pos]
        lengths = np.where(found, self.indptr[pos + 1] - starts, 0) if len(self.keys) else np.zeros(len(hr_keys), int)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        take = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])  # positions in self.answers
        return sp.csr_matrix((np.ones(len(take), dtype=np.bool_), self.answers[take], indptr),
                             shape=(len(hr_keys), self.num_entities))

@dataclass
class KnowledgeGraph:
    """Entities and relations with texts, and the three splits as ``(n, 3)`` int64 arrays of forward ids."""

    entities: list[str]  # entity labels (ids as in the files)
    names: list[str]  # short human-readable names
    descriptions: list[str]  # may be empty strings
    relations: list[str]  # forward relation labels
    relation_texts: list[str]  # forward relation texts
    splits: dict[str, np.ndarray]
    source: str = ""
    layout: str = ""  # "KG-BERT" or "PyKEEN label TSV" (read_graph)
    notes: list[str] = field(default_factory=list)  # the fallbacks read_graph took, for kgc data check / train
    cache_dir: Path | None = field(default=None, repr=False, compare=False)  # its graph cache (kgc.data.graph_cache)
    entity_index: dict[str, int] = field(init=False)
    relation_index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.entity_index = {e: i for i, e in enumerate(self.entities)}
        self.relation_index = {r: i for i, r in enumerate(self.relations)}

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        """Forward relations only; the model sees ``2 * num_relations`` (with inverses)."""
        return len(self.relations)

    def relation_text(self, rel: int) -> str:
        """Text of relation id ``rel`` in ``0..2R-1``."""
        base = self.relation_texts[rel % self.num_relations]
        return base if rel < self.num_relations else f"inverse {base}"

    def relation_label(self, rel: int) -> str:
        base = self.relations[rel % self.num_relations]
        return base if rel < self.num_relations else f"inverse {base}"

    def inverse_queries(self, triples: np.ndarray) -> np.ndarray:
        """``(n, 3)`` head-prediction queries (t, r + R, h) of forward ``triples`` (h, r, t): relation ids ``R..2R-1``
        are the inverses (text ``inverse <r>``), the one place that rule is written."""
        return np.stack([triples[:, 2], triples[:, 1] + self.num_relations, triples[:, 0]], axis=1)

    def relation_id(self, query: str, *, inverse: bool = False) -> int:
        """The id of a forward relation found by label or text (:meth:`find_relation`), or of its inverse."""
        return self.find_relation(query) + (self.num_relations if inverse else 0)

    def relation_ids(self, *, inverse: bool = False) -> list[int]:
        """Every forward relation's id, or every inverse's."""
        return list(range(self.num_relations, 2 * self.num_relations) if inverse else range(self.num_relations))

    def both_directions(self, split: str) -> np.ndarray:
        """``(2n, 3)`` queries (head, relation, answer): forward triples, then (t, r + R, h)."""
        t = self.splits[split]
        return np.concatenate([t, self.inverse_queries(t)], axis=0)

    def hr_keys(self, heads: np.ndarray, rels: np.ndarray) -> np.ndarray:
        return heads.astype(np.int64) * (2 * self.num_relations) + rels.astype(np.int64)

    @cached_property
    def all_answers(self) -> "AnswerIndex":
        """Filter index: ``all_answers[hr_keys]`` is a (batch, entities) sparse matrix of every known answer from
        train + dev + test to each query ``h * 2R + r``."""
        from kgc.data import graph_cache

        def arrays() -> dict[str, np.ndarray]:
            q = np.concatenate([self.both_directions(s) for s in ("train", "dev", "test")], axis=0)
            index = AnswerIndex(self.hr_keys(q[:, 0], q[:, 1]), q[:, 2], self.num_entities)
            return {"keys": index.keys, "indptr": index.indptr, "answers": index.answers}

        return AnswerIndex.from_arrays(graph_cache.derived(self, "answers", arrays), self.num_entities)

    @cached_property
    def held_out_keys(self) -> dict[str, np.ndarray]:
        """Sorted int64 keys ``(h * 2R + r) * E + t`` of the dev and test triples in both directions, by split
        (held-out splits are small; a known answer in neither is a train triple)."""
        out = {}
        for split in ("dev", "test"):
            q = self.both_directions(split)
            out[split] = np.unique(self.hr_keys(q[:, 0], q[:, 1]) * self.num_entities + q[:, 2])
        return out

    @cached_property
    def train_keys(self) -> np.ndarray:
        """Sorted int64 keys ``(h * 2R + r) * E + t`` of every train triple in both directions."""
        q = self.both_directions("train")
        keys = self.hr_keys(q[:, 0], q[:, 1]) * self.num_entities + q[:, 2]
        from kgc.data.ragged import unique_sorted

        return unique_sorted(keys)

    @cached_property
    def train_neighbors(self) -> "Ragged":
        """Undirected train-graph neighbours of every entity, each list sorted by entity label (SimKGC's order), as
        a :class:`~kgc.data.ragged.Ragged` (two arrays, not a list per entity: Wikidata5M has 4.6M entities)."""
        from kgc.data import graph_cache
        from kgc.data.ragged import Ragged

        arrays = graph_cache.derived(self, "neighbors", self._neighbor_arrays)
        return Ragged(arrays["values"], arrays["offsets"])

    def _neighbor_arrays(self) -> dict[str, np.ndarray]:
        from kgc.data.ragged import Ragged

        t, n = self.splits["train"], self.num_entities
        rank = np.empty(n, dtype=np.int64)
        rank[self.label_order] = np.arange(n, dtype=np.int64)
        a = np.concatenate([t[:, 0], t[:, 2]])
        b = np.concatenate([t[:, 2], t[:, 0]])
        keys = a * n + rank[b]
        del a, b
        keys.sort()
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys  # one per pair
        lengths = np.bincount(keys // n, minlength=n)
        neighbors = Ragged.from_lengths(self.label_order[keys % n].astype(np.int32), lengths)
        return {"values": neighbors.values, "offsets": neighbors.offsets}

    @cached_property
    def label_order(self) -> np.ndarray:
        """Entity ids sorted by their labels (code points, as Python sorts strings)."""
        return np.argsort(np.array(self.entities), kind="stable").astype(np.int64)

    def unseen_in_train(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids, forward relation ids) that occur in ``split`` but in no train triple, sorted."""
        train, other = self.splits["train"], self.splits[split]
        ents = np.setdiff1d(np.unique(other[:, [0, 2]]), np.unique(train[:, [0, 2]]))
        rels = np.setdiff1d(np.unique(other[:, 1]), np.unique(train[:, 1]))
        return ents, rels

    def lookup_entity(self, query: str) -> int | None:
        """An entity by id, then exact name/text, then case-insensitive; None when nothing matches (several matches
        are an error listing them)."""
        forms = spellings(query)  # é typed as one code point or as e + accent is the same entity
        for form in forms:
            if form in self.entity_index:
                return self.entity_index[form]
        for fold in (False, True):
            hits = next((h for h in (self._exact_names.find(f, fold=fold) for f in forms) if h), [])
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                listing = "; ".join(f"{self.entities[i]} ({self.full_texts[i][:60]})" for i in hits[:10])
                raise KGCError(f"entity {query!r} is ambiguous ({len(hits)} matches): {listing}. "
                               "Pass the entity id instead.")
        return None

    def find_entity(self, query: str) -> int:
        """Resolve an entity by id, then exact name/text, then case-insensitive; :class:`UnknownName` (kind
        "entity", with the closest spellings) otherwise."""
        found = self.lookup_entity(query)
        if found is None:
            close = self.near_misses(query, cutoff=0.5)
            raise UnknownName(f"unknown entity {query!r}. Closest: "
                              f"{', '.join(map(repr, close)) or '(nothing similar)'}",
                              kind="entity", name=query, suggestions=close)
        return found

    def closest_entities(self, query: str, n: int = 5) -> list[str]:
        """Names close to ``query`` (difflib), quoted, for messages."""
        return self._closest(query, self.names, n)

    def near_misses(self, query: str, n: int = 5, cutoff: float = NEAR_MISS) -> list[str]:
        """Entities whose id or name is spelt like ``query`` (difflib ratio ≥ ``cutoff``, case and surrounding
        blanks ignored), best first: each as a string that resolves back to that entity (its name when the name
        names it alone, else its id). Above :data:`BRUTE_SPELLINGS` ids and names, the names holding the query's
        words or words spelt like them are compared (:class:`kgc.data.spelling.NameIndex`, milliseconds at
        millions of entities), not every id and name: a typo in an id is then not suggested."""
        import difflib

        m = difflib.SequenceMatcher(autojunk=False)
        m.set_seq2(nfc(query).lower().strip())
        best: dict[int, float] = {}
        if 2 * self.num_entities > BRUTE_SPELLINGS:  # the names sharing the query's words, not a pass over all
            return self._indexed_near_misses(query, n, cutoff, m)
        for i, spelling in self._spellings:
            m.set_seq1(spelling)
            if m.real_quick_ratio() >= cutoff and m.quick_ratio() >= cutoff:
                r = m.ratio()
                if r >= cutoff and r > best.get(i, 0.0):
                    best[i] = r
        return [self.resolvable(i) for i in sorted(best, key=lambda i: (-best[i], self.entities[i]))[:n]]

    def _indexed_near_misses(self, query: str, n: int, cutoff: float, m) -> list[str]:
        """:meth:`near_misses` over the word index's candidates, the same answer with fewer ratios: the candidates
        in the order of an upper bound of their ratio (:func:`kgc.data.spelling.ratio_bounds`), difflib's exact
        ratio computed until the bound falls below the cutoff or below the ``n``-th best ratio found."""
        from kgc.data.spelling import ratio_bounds

        ids = self._name_index.candidates(query.strip()).tolist()
        spellings = [self.names[i].lower() for i in ids]
        bounds = ratio_bounds(m.b, spellings) if spellings else np.zeros(0)
        found: list[tuple[float, str, int]] = []
        nth = cutoff  # the ratio a spelling must reach to enter the best n
        for k in np.argsort(-bounds, kind="stable").tolist():
            if bounds[k] < nth:
                break
            m.set_seq1(spellings[k])
            r = m.ratio()
            if r >= cutoff:
                found.append((-r, self.entities[ids[k]], ids[k]))
                if len(found) >= n:
                    nth = max(nth, -sorted(found)[n - 1][0])
        return [self.resolvable(i) for _, _, i in sorted(found)[:n]]

    @cached_property
    def _spellings(self) -> list[tuple[int, str]]:
        """(entity, lower-case id or name): what :meth:`near_misses` compares."""
        out = []
        for i, (e, name) in enumerate(zip(self.entities, self.names)):
            out += [(i, s) for s in dict.fromkeys((name.lower(), e.lower())) if s]
        return out

    @cached_property
    def _name_index(self):
        """The word index of the names (kgc.data.spelling) for near misses of a large graph: read from beside the
        graph's cache when there is one (written when the cache is, so a served graph of millions has it at once),
        else built here."""
        from kgc.data.graph_cache import derived
        from kgc.data.spelling import NameIndex

        try:
            return NameIndex.from_arrays(derived(self, "name_index", lambda: NameIndex(self.names).arrays()))
        except ValueError:  # a damaged copy beside the cache: built again (the next cache write replaces it)
            return NameIndex(self.names)

    @cached_property
    def _exact_names(self):
        """Entities by exact name or full text, as given or lower-cased (kgc.data.spelling)."""
        from kgc.data.spelling import ExactNames

        return ExactNames(self.names, self.full_texts)

    def resolvable(self, i: int) -> str:
        """Entity ``i`` as a string :meth:`lookup_entity` resolves to it: its name when unambiguous, else its id."""
        try:
            if self.names[i] and self.lookup_entity(self.names[i]) == i:
                return self.names[i]
        except KGCError:  # the name is shared
            pass
        return self.entities[i]

    def find_relation(self, query: str) -> int:
        """Resolve a forward relation by label or text (exact, then case-insensitive, ``_`` optional)."""
        norm = lambda s: nfc(s).lower().replace("_", " ").strip()  # noqa: E731
        for i, (label, text) in enumerate(zip(self.relations, self.relation_texts)):
            if query in (label, text) or nfc(query) in (nfc(label), nfc(text)):
                return i
        hits = [i for i, (label, text) in enumerate(zip(self.relations, self.relation_texts))
                if norm(query) in (norm(label), norm(text))]
        if len(hits) == 1:
            return hits[0]
        close = self.close_relations(query)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownName(f"unknown relation {query!r}.{hint} Relations: {', '.join(self.relations)}",
                          kind="relation", name=query, suggestions=close, valid=self.relations)

    def close_relations(self, query: str, n: int = 3, cutoff: float = 0.6) -> list[str]:
        """Relation labels whose label or text is spelt like ``query`` (``_`` as a blank, case ignored), best
        first."""
        import difflib

        norm = lambda s: s.lower().replace("_", " ").strip()  # noqa: E731
        m = difflib.SequenceMatcher(autojunk=False)
        m.set_seq2(norm(query))
        best: dict[int, float] = {}
        for i, (label, text) in enumerate(zip(self.relations, self.relation_texts)):
            for s in (norm(label), norm(text)):
                m.set_seq1(s)
                r = m.ratio()
                if r >= cutoff and r > best.get(i, 0.0):
                    best[i] = r
        return [self.relations[i] for i in sorted(best, key=lambda i: (-best[i], i))[:n]]

    @cached_property
    def full_texts(self) -> list[str]:
        return [f"{n}: {d}" if d else n for n, d in zip(self.names, self.descriptions)]

    @staticmethod
    def _closest(query: str, choices: list[str], n: int = 5) -> list[str]:
        import difflib

        close = difflib.get_close_matches(query.lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
        lower = {c.lower(): c for c in choices}
        return [repr(lower[c]) for c in close] or ["(nothing similar)"]


# ---------------------------------------------------------------- readers


def _bad_utf8(path: Path) -> KGCError:
    """The first line of ``path`` that is not UTF-8, as one KGCError with the line, the byte and the fix."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return KGCError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1}). Save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 "
                                f"{path.name} > {path.stem}.utf8{path.suffix}` and rename it back.")
    return KGCError(f"{path}: not UTF-8 text. Save it as UTF-8.")  # pragma: no cover - decode failed above


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of each non-blank line of a UTF-8 text file (a byte-order mark is skipped), streamed.

    Anything that is not such a file — a folder, an unreadable or binary file, bytes that are not UTF-8 — ends in
    one KGCError naming the file (and the line) and the fix."""
    path = Path(path)
    if path.is_dir():
        raise KGCError(f"{path}: a folder where a text file belongs. Put the {path.name} file there instead "
                       "(docs/own-graph.md).")
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, 1):
                if "\x00" in line:
                    raise KGCError(f"{path}:{lineno}: a NUL byte: this is a binary file, not tab-separated UTF-8 "
                                   "text. Point the dataset at its text files (docs/own-graph.md).")
                line = line.rstrip("\n").rstrip("\r")
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError:
        raise _bad_utf8(path) from None
    except OSError as exc:
        raise KGCError(f"{path}: cannot be read ({exc.strerror or exc}). Check that it exists and is readable.") from None


def _iter_rows(path: Path, width: int) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line, streamed (Wikidata5M: 20M triples, 4.6M texts)."""
    for lineno, line in text_lines(path):
        parts = line.split("\t")
        if width == 2 and len(parts) > 2:  # a text may itself contain tabs: keep them
            parts = [parts[0], " ".join(parts[1:])]
        if len(parts) != width:
            what = "head<TAB>relation<TAB>tail" if width == 3 else "id<TAB>text"
            raise KGCError(f"{path}:{lineno}: expected {width} tab-separated fields ({what}), "
                           f"got {len(parts)}: {line[:80]!r}. Fix or delete that line.")
        yield lineno, [p.strip() for p in parts]


def _read_texts(path: Path) -> dict[str, str]:
    """id → text, read in one pass straight into the dict (no intermediate list of rows); an empty file or an
    empty id is an error."""
    out: dict[str, str] = {}
    for lineno, (key, text) in _iter_rows(path, 2):
        if not key:
            raise KGCError(f"{path}:{lineno}: empty id. Every line is id<TAB>text.")
        if key in out:
            raise KGCError(f"{path}:{lineno}: id {key!r} appears twice. Keep one line per id.")
        out[key] = text
    if not out:
        raise KGCError(f"{path}: empty (no id<TAB>text lines). Fill it, or delete the file.")
    return out


ENTITY_FORMS = "id<TAB>name<TAB>description (or KG-BERT's id<TAB>name, description)"


def _read_entity_texts(path: Path, *, names_only: bool) -> tuple[dict[str, tuple[str, str]], int]:
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


def _read_triples(path: Path, entities: dict[str, int], relations: dict[str, int], *, grow: bool,
                  ent_file: Path, labels: dict | None = None) -> np.ndarray:
    """A split as ``(n, 3)`` int64 ids, streamed into a flat buffer (no per-line Python lists kept).

    Entity ids come from ``entities`` (an unknown one is an error, or gets the next id when ``grow``);
    relations are numbered in first-seen order into ``relations`` (the caller renumbers them).
    """
    if not grow and (fast := _clean_triples(path, entities, relations, {} if labels is None else labels)) is not None:
        return fast
    ids = array("q")
    for lineno, (h, r, t) in _iter_rows(path, 3):
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


def _split_path(folder: Path, split: str) -> Path:
    for fname in SPLIT_FILES[split]:
        if (folder / fname).exists():  # a folder of that name is reported by the reader
            return folder / fname
    raise KGCError(f"{folder}: no {split} split (looked for {', '.join(SPLIT_FILES[split])})")


def _strip_name_prefix(name: str, desc: str) -> str:
    """SimKGC: drop a description prefix that repeats the entity name."""
    if desc.startswith(name):
        desc = desc[len(name):].strip().lstrip(",:;").strip()
    return desc


def read_graph(folder: Path, *, long_text: bool = False, optional_splits: tuple[str, ...] = ()) -> KnowledgeGraph:
    """The graph of a KG-BERT or PyKEEN label-TSV folder; ``optional_splits`` may be absent (read as empty): an
    inductive test folder needs no train split. Every fallback taken is listed in ``graph.notes`` (``kgc data
    check`` and ``kgc train`` print them); a folder that looks half KG-BERT (texts for relations but not for
    entities) is an error, not a fallback. A graph of 100,000 entities or more is kept in the graph cache
    (:mod:`kgc.data.graph_cache`) and read from there while the folder's files stay as they are; the word index of
    its names ("did you mean") is written beside the cache when the cache is."""
    from kgc.data import graph_cache

    folder = Path(folder)
    if not folder.is_dir():
        raise KGCError(f"{folder}: not a folder. A dataset is a folder of train/dev/test triples and texts "
                       "(docs/own-graph.md).")
    options = {"long_text": long_text, "optional_splits": sorted(optional_splits)}
    if (cached := graph_cache.load(folder, options)) is not None:
        return KnowledgeGraph(**cached)
    graph = _parse_graph(folder, long_text=long_text, optional_splits=optional_splits)
    if graph_cache.store(graph, folder, options) is not None:
        graph._name_index  # noqa: B018 — "did you mean" kept beside the new cache: a served graph has it at start
    return graph


def _parse_graph(folder: Path, *, long_text: bool, optional_splits: tuple[str, ...]) -> KnowledgeGraph:
    paths = {s: _split_path(folder, s) for s in SPLIT_FILES
             if s not in optional_splits or any((folder / f).exists() for f in SPLIT_FILES[s])}
    ent_file, rel_file, long_file = (folder / "entity2text.txt", folder / "relation2text.txt",
                                     folder / "entity2textlong.txt")
    kgbert = ent_file.exists()
    notes: list[str] = []
    if not kgbert and (rel_file.exists() or long_file.exists()):
        other = rel_file.name if rel_file.exists() else long_file.name
        raise KGCError(f"{folder}: {other} but no entity2text.txt. A KG-BERT folder needs entity2text.txt "
                       f"({ENTITY_FORMS}); without it the entity ids would be their texts. Add it, or remove {other} "
                       "to train on the labels of a PyKEEN label TSV.")
    if kgbert:  # KG-BERT layout
        has_long = long_file.exists()
        ent_texts, two_fields = _read_entity_texts(ent_file, names_only=has_long)
        entities = list(ent_texts)
        names = [ent_texts[e][0] for e in entities]
        if has_long:
            longs = _read_texts(long_file) if long_text else {}
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
            rel_texts = _read_texts(rel_file)
        else:
            rel_texts = {}
            notes.append(f"no {rel_file.name}: relation texts are the relation labels (\"_\" → space)")
    else:  # PyKEEN label TSV: entities come from the triples, texts from labels
        entities, rel_texts = [], {}
        notes.append("no entity2text.txt: a PyKEEN label TSV; entity and relation texts are the labels "
                     "(\"_\" → space), no descriptions")
    layout = "KG-BERT" if kgbert else "PyKEEN label TSV"
    # Triples stream straight into id arrays (Wikidata5M's 20M lines never sit in memory as Python lists).
    ent_index = {e: i for i, e in enumerate(entities)}
    first_seen: dict[str, int] = {}  # relation → provisional id, in first-seen order
    labels: dict = {}
    splits = {s: _read_triples(paths[s], ent_index, first_seen, grow=not kgbert, ent_file=ent_file, labels=labels)
              if s in paths else np.empty((0, 3), dtype=np.int64) for s in SPLIT_FILES}
    if not kgbert:
        entities = list(ent_index)
        names = [e.replace("_", " ") for e in entities]
        descriptions = [""] * len(entities)
    relations = dict.fromkeys(first_seen)
    if rel_texts:
        relations = {**{r: None for r in rel_texts if r in relations}, **relations}
        if missing := [r for r in relations if r not in rel_texts]:
            notes.append(f"{rel_file.name} has no text for {len(missing)} relation(s) ({', '.join(missing[:5])}"
                         f"{', …' if len(missing) > 5 else ''}): their labels are used")
    rel_list = list(relations)
    relation_texts = [rel_texts.get(r, r.strip("_").replace("_", " ")) for r in rel_list]
    for i, name in enumerate(names):  # in place: millions of descriptions are not copied
        descriptions[i] = _strip_name_prefix(name, descriptions[i])
    rel_index = {r: i for i, r in enumerate(rel_list)}
    renumber = np.array([rel_index[r] for r in first_seen], dtype=np.int64)
    for arr in splits.values():
        arr[:, 1] = renumber[arr[:, 1]]
    if len(splits["train"]) == 0 and "train" not in optional_splits:
        raise KGCError(f"{paths['train']}: no triples. Give one per line: head<TAB>relation<TAB>tail.")
    return KnowledgeGraph(entities=entities, names=names, descriptions=descriptions, relations=rel_list,
                          relation_texts=relation_texts, splits=splits, source=str(folder), layout=layout,
                          notes=notes)


def load_graph(dataset: str, *, path: str | None = None, long_text: bool = False) -> KnowledgeGraph:
    folder, _ = find_dataset(dataset, path)
    return read_graph(folder, long_text=long_text)
