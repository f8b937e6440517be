"""The knowledge graph: ids, names, descriptions, splits, inverse relations and the filter index.

A folder is read into one by its graph format (:mod:`kgc.data.formats`: KG-BERT's layout, PyKEEN's label TSV, a
plugin's). Relation ids ``0..R-1`` are the forward relations, ``R..2R-1`` their inverses (text ``inverse <r>``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

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
