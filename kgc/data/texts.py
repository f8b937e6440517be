"""Entity and relation texts, tokenised once per run and assembled at the id level.

SimKGC's rules: entity text = ``name: description`` (a description prefix repeating the name is
dropped); when the description has fewer than 20 words, the names of up to 10 train-graph
neighbours are appended — during training excluding the other end of the current triple, so the
answer is never written into the question. Because WordPiece splits on whitespace first,
concatenating separately tokenised names equals tokenising the joined string, so neighbour
exclusion never needs a re-tokenisation: every string is tokenised exactly once per run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import chain, islice
from typing import Iterable, Sequence

import numpy as np

import torch

from kgc.data.graph import KnowledgeGraph
from kgc.data import token_cache
from kgc.data.ragged import Ragged, spans

_CACHED = ("base", "base_colon", "name_ids", "short")


@dataclass(frozen=True)
class SpecialTokens:
    """Where a tokenizer puts its special tokens around one or two sequences (BERT, RoBERTa, ...).

    transformers 5 no longer exposes ``build_inputs_with_special_tokens``; the template is read off
    one call of the tokenizer on two marker words instead.
    """

    single: tuple[list[int], list[int]]  # prefix, suffix
    pair: tuple[list[int], list[int], list[int]]  # prefix, middle, suffix
    pair_types: tuple[int, int]  # token type of the first / second segment
    pad_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "SpecialTokens":
        a = tokenizer("alpha", add_special_tokens=False)["input_ids"]
        b = tokenizer("beta", add_special_tokens=False)["input_ids"]
        one = tokenizer("alpha")["input_ids"]
        two = tokenizer("alpha", "beta")
        ids, types = two["input_ids"], two.get("token_type_ids") or [0] * len(two["input_ids"])
        i = _find(one, a)
        j = _find(ids, a)
        k = _find(ids, b, start=j + len(a))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return cls(single=(one[:i], one[i + len(a):]),
                   pair=(ids[:j], ids[j + len(a):k], ids[k + len(b):]),
                   pair_types=(types[j], types[k]), pad_id=pad)

    @property
    def n_single(self) -> int:
        return len(self.single[0]) + len(self.single[1])

    @property
    def n_pair(self) -> int:
        return sum(len(p) for p in self.pair)

    def wrap(self, a: Sequence[int], max_len: int) -> tuple[list[int], list[int]]:
        pre, suf = self.single
        a = list(a[: max_len - self.n_single])
        ids = pre + a + suf
        return ids, [0] * len(ids)

    def truncate_pair(self, a: Sequence[int], b: Sequence[int], max_len: int) -> tuple[list[int], list[int]]:
        """Both sides cut longest-first to fit ``[CLS] a [SEP] b [SEP]`` in ``max_len`` (the tokenizer's rule)."""
        a, b = list(a), list(b)
        budget = max_len - self.n_pair
        excess = len(a) + len(b) - budget
        if excess > 0:  # trim the longer side down to the shorter, then alternate
            la, lb = len(a), len(b)
            cut_long = min(excess, abs(la - lb))
            la, lb = (la - cut_long, lb) if la > lb else (la, lb - cut_long)
            rest = excess - cut_long
            la, lb = la - rest // 2, lb - (rest - rest // 2)
            a, b = a[: max(la, 0)], b[: max(lb, 0)]
        return a, b

    def wrap_pair(self, a: Sequence[int], b: Sequence[int], max_len: int) -> tuple[list[int], list[int]]:
        """``[CLS] a [SEP] b [SEP]`` truncated longest-first (as the tokenizer's own truncation)."""
        a, b = self.truncate_pair(a, b, max_len)
        pre, mid, suf = self.pair
        ta, tb = self.pair_types
        ids = pre + a + mid + b + suf
        types = [ta] * (len(pre) + len(a) + len(mid)) + [tb] * (len(b) + len(suf))
        return ids, types

    def pad(self, seqs: Sequence[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """Pad ``(ids, types)`` pairs to the longest: ``input_ids``, ``attention_mask``, ``token_type_ids`` (batch, len).

        Filled by one masked assignment per array, not a tensor per row: a batch of 2,048 texts is a few ms of the
        host's time instead of 90 (the GPU waits on it every step)."""
        n = len(seqs)
        lengths = np.fromiter((len(ids) for ids, _ in seqs), dtype=np.int64, count=n)
        total = int(lengths.sum())
        ids = np.fromiter(chain.from_iterable(i for i, _ in seqs), dtype=np.int64, count=total)
        types = np.fromiter(chain.from_iterable(t for _, t in seqs), dtype=np.int64, count=total)
        return self._padded(lengths, ids, types)

    def _padded(self, lengths: np.ndarray, ids: np.ndarray, types: np.ndarray | None) -> dict[str, torch.Tensor]:
        """Rows of ``lengths`` tokens (``ids``/``types`` concatenated row after row) padded to the longest."""
        width = int(lengths.max()) if len(lengths) else 0
        mask = np.arange(width) < lengths[:, None]
        input_ids = np.full((len(lengths), width), self.pad_id, dtype=np.int64)
        input_ids[mask] = ids
        token_types = np.zeros((len(lengths), width), dtype=np.int64)
        if types is not None:
            token_types[mask] = types
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask.astype(np.int64)),
                "token_type_ids": torch.from_numpy(token_types)}

    def wrap_pair_pad(self, a: Ragged, b: Ragged, max_len: int) -> dict[str, torch.Tensor]:
        """``pad([wrap_pair(x, y, max_len) for x, y in zip(a, b)])`` on the arrays: both sides cut longest-first
        (:meth:`truncate_pair`'s rule, row by row as vectors), then ``[CLS] a [SEP] b [SEP]`` with the two token
        types, padded to the longest. A step's 1,024 queries in about a millisecond instead of a Python list each."""
        pre, mid, suf = self.pair
        ta, tb = self.pair_types
        la, lb = a.lengths.astype(np.int64), b.lengths.astype(np.int64)
        excess = np.maximum(la + lb - (max_len - self.n_pair), 0)
        cut_long = np.minimum(excess, np.abs(la - lb))  # the longer side down towards the shorter ...
        la2 = np.where(la > lb, la - cut_long, la)
        lb2 = np.where(la > lb, lb, lb - cut_long)
        rest = excess - cut_long  # ... then both sides alternately
        la2, lb2 = np.maximum(la2 - rest // 2, 0), np.maximum(lb2 - (rest - rest // 2), 0)
        first = len(pre) + la2 + len(mid)  # tokens of type ta
        lengths = first + lb2 + len(suf)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        out = np.empty(int(lengths.sum()), dtype=np.int64)
        types = np.full(len(out), tb, dtype=np.int64)
        types[spans(starts, first)] = ta
        for j, t in enumerate(pre):
            out[starts + j] = t
        out[spans(starts + len(pre), la2)] = a.values[spans(a.offsets[:-1], la2)]
        for j, t in enumerate(mid):
            out[starts + len(pre) + la2 + j] = t
        out[spans(starts + first, lb2)] = b.values[spans(b.offsets[:-1], lb2)]
        for j, t in enumerate(suf):
            out[starts + lengths - len(suf) + j] = t
        return self._padded(lengths, out, types)

    def wrap_pad(self, rows: Ragged, max_len: int) -> dict[str, torch.Tensor]:
        """``pad([wrap(r, max_len) for r in rows])`` on the arrays: each row cut to fit, between the single-sequence
        prefix and suffix (token type 0), padded to the longest."""
        pre, suf = self.single
        cut = rows.head(max(max_len - self.n_single, 0))
        lengths = cut.lengths + len(pre) + len(suf)
        out = np.empty(int(lengths.sum()), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        for j, t in enumerate(pre):
            out[starts + j] = t
        out[spans(starts + len(pre), cut.lengths)] = cut.values
        for j, t in enumerate(suf):
            out[starts + lengths - len(suf) + j] = t
        return self._padded(lengths, out, None)


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the vocabulary: what a cache of token-keyed states depends on besides the weights."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(repr(vocab).encode()).hexdigest()


def _find(hay: list[int], needle: list[int], start: int = 0) -> int:
    for i in range(start, len(hay) - len(needle) + 1):
        if hay[i: i + len(needle)] == needle:
            return i
    raise ValueError("tokenizer template: marker not found")


def _exclusive_within(step: np.ndarray, first: np.ndarray) -> np.ndarray:
    """For runs of ``step`` (a run starts where ``first``): the sum of the run's steps before each one."""
    before = np.cumsum(step) - step
    return before - np.maximum.accumulate(np.where(first, before, 0)) if len(step) else before


CHUNK = 65_536  # texts tokenised per call: the tokenizer's Python lists never hold more than this many at once


def tokenize(tokenizer, texts: Iterable[str], count: int) -> Ragged:
    """The token ids (no special tokens) of ``count`` texts, tokenised a chunk at a time into one Ragged."""
    texts = iter(texts)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)  # the Rust tokenizer without character offsets: 1.5× faster
    parts = []
    for start in range(0, count, CHUNK):
        chunk = list(islice(texts, min(CHUNK, count - start)))
        ids = ([e.ids for e in fast(chunk, add_special_tokens=False)] if fast is not None
               else tokenizer(chunk, add_special_tokens=False)["input_ids"])
        parts.append(Ragged.from_lists(ids))
    return Ragged.concat(parts)


def _entity_token_ids(graph: KnowledgeGraph, entities: range, tokenizer, short_description_words: int):
    """(base, base_colon, name_ids, short) for ``entities``: the token ids of "name: description", of the same
    with the colon a neighbour list needs ("name:" for a name with no description: only those are tokenised
    again), of the name alone, and whether the description is short enough to get neighbour names."""
    names, descriptions, full = graph.names, graph.descriptions, graph.full_texts
    n = len(entities)
    base = tokenize(tokenizer, (full[e] for e in entities), n)
    bare = np.fromiter((not descriptions[e] for e in entities), dtype=bool, count=n)
    if bare.any():
        rows = np.flatnonzero(bare)
        colons = tokenize(tokenizer, (f"{names[entities[i]]}:" for i in rows), len(rows))
        lengths = base.lengths.copy()
        lengths[rows] = colons.lengths
        keep = np.repeat(~bare, base.lengths)  # every described entity's ids as they are, the others' anew
        values = np.empty(int(lengths.sum()), dtype=base.values.dtype)
        base_colon = Ragged.from_lengths(values, lengths)
        values[spans(base_colon.offsets[:-1][~bare], lengths[~bare])] = base.values[keep]
        values[spans(base_colon.offsets[:-1][rows], colons.lengths)] = colons.values
    else:
        base_colon = base
    name_ids = tokenize(tokenizer, (names[e] for e in entities), n)
    short = np.fromiter((len(descriptions[e].split()) < short_description_words for e in entities), dtype=bool,
                        count=n)
    return base, base_colon, name_ids, short


class EntityTexts(Sequence):
    """Every entity's evaluation-time token ids, ``bank.entity_ids(e)`` read when asked (not a list of millions)."""

    def __init__(self, bank: "TextBank") -> None:
        self.bank = bank

    def __len__(self) -> int:
        return self.bank.graph.num_entities

    def __getitem__(self, e):
        if isinstance(e, slice):
            return [self.bank.entity_ids(i) for i in range(*e.indices(len(self)))]
        return self.bank.entity_ids(e)


class TextBank:
    """Token ids for every entity and relation text of a graph (tokenised once, no special tokens), held as
    :class:`~kgc.data.ragged.Ragged` arrays."""

    def __init__(self, graph: KnowledgeGraph, tokenizer, *, max_tokens: int = 50, neighbor_text: bool = True,
                 max_neighbors: int = 10, short_description_words: int = 20) -> None:
        self.graph = graph
        self.max_tokens = max_tokens
        self.special = SpecialTokens.from_tokenizer(tokenizer)
        self.tokenizer_hash = tokenizer_hash(tokenizer)
        self.max_neighbors = max_neighbors if neighbor_text else 0
        # "name: description"; a name with no description gets its colon only when neighbours follow
        self.short_description_words = short_description_words
        self._cache_key: str | None = None
        cached = None
        if token_cache.wanted(graph):  # millions of entities: tokenised once, then memory-mapped
            self._cache_key = token_cache.texts_key(graph, self.tokenizer_hash, short_description_words)
            cached = token_cache.load(self._cache_key)
        if cached is None:
            self.base, self.base_colon, self.name_ids, self.short = _entity_token_ids(
                graph, range(graph.num_entities), tokenizer, short_description_words)
            if self._cache_key is not None:
                token_cache.store(self._cache_key, {"base": self.base, "base_colon": self.base_colon,
                                                    "name_ids": self.name_ids, "short": self.short})
        else:
            self.base, self.base_colon, self.name_ids, self.short = (cached[k] for k in _CACHED)
        self.relation_ids = tokenizer([graph.relation_text(r) for r in range(2 * graph.num_relations)],
                                      add_special_tokens=False)["input_ids"]
        n = graph.num_entities
        self.neighbors = (graph.train_neighbors.head(self.max_neighbors) if self.max_neighbors
                          else Ragged(np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)))
        self._fingerprint: str | None = None
        if cached is not None:
            self._fingerprint = cached["fingerprints"].get(self._neighbors_key())

    def _neighbors_key(self) -> str:
        """What the fingerprint depends on besides the texts: the neighbour rule and the train triples."""
        train = np.ascontiguousarray(self.graph.splits["train"])
        return f"{self.max_neighbors}:{hashlib.sha256(train.data).hexdigest()}"

    def extended(self, graph: KnowledgeGraph, tokenizer) -> "TextBank":
        """A bank over ``graph`` = this bank's graph with entities appended (``kgc index --add``); only the new
        entities are tokenised, and this bank is left as it was. New entities have no train-graph
        neighbours, so their text is ``name: description``, as for any entity without neighbours."""
        import copy

        old = self.graph.num_entities
        if graph.entities[:old] != self.graph.entities:
            raise ValueError("extended: the new graph must start with this bank's entities, in order")
        new = range(old, graph.num_entities)
        base, colon, name_ids, short = _entity_token_ids(graph, new, tokenizer, self.short_description_words)
        bank = copy.copy(self)
        bank.graph = graph
        bank.base, bank.base_colon = self.base + base, self.base_colon + colon
        bank.name_ids, bank.short = self.name_ids + name_ids, np.concatenate([self.short, short])
        bank.neighbors = Ragged(self.neighbors.values, np.concatenate(
            [self.neighbors.offsets, np.full(len(new), self.neighbors.offsets[-1])]))
        bank._fingerprint, bank._cache_key = None, None  # other entities: hashed anew, not cached
        return bank

    @property
    def texts(self) -> EntityTexts:
        """Every entity's evaluation-time token ids, as a read-only sequence."""
        return EntityTexts(self)

    def eval_lengths(self) -> np.ndarray:
        """(entities,) ``len(self.entity_ids(e))`` of every entity, computed on the arrays (no list per entity)."""
        grows = self.short & (self.neighbors.lengths > 0)
        lengths = self.base.lengths.copy()
        if not grows.any():
            return lengths
        nb = self.neighbors
        row = nb.row_of()
        # the running length after each neighbour's name: the colon text, then the names one by one
        step = self.name_ids.lengths[nb.values]
        total = np.concatenate([[0], np.cumsum(step)])
        within = total[1:] - np.repeat(total[nb.offsets[:-1]], nb.lengths)
        running = self.base_colon.lengths[row] + within
        big = np.iinfo(np.int64).max
        reached = np.where(running >= self.max_tokens, running, big)  # the names stop once the text is full
        rows = np.flatnonzero(nb.lengths > 0)
        first = np.minimum.reduceat(reached, nb.offsets[rows])
        last = running[nb.offsets[rows + 1] - 1]
        grown = np.where(first < big, first, last)
        lengths[rows[grows[rows]]] = grown[grows[rows]]
        return lengths

    def entity_ids(self, e: int, exclude: int | None = None) -> list[int]:
        """Token ids (no specials) of entity ``e``'s text, leaving neighbour ``exclude`` out."""
        if not (self.short[e] and self.neighbors[e]):
            return self.base[e]
        picked = [n for n in self.neighbors[e] if n != exclude]
        if not picked:
            return self.base[e]
        ids = list(self.base_colon[e])
        for n in picked:
            ids.extend(self.name_ids[n])
            if len(ids) >= self.max_tokens:
                break
        return ids

    def entity_text(self, e: int, exclude: int | None = None) -> str:
        """The human-readable string matching :meth:`entity_ids` (for inspection and tests)."""
        g = self.graph
        if not (self.short[e] and self.neighbors[e]):
            return g.full_texts[e]
        picked = [g.names[n] for n in self.neighbors[e] if n != exclude]
        if not picked:
            return g.full_texts[e]
        d = g.descriptions[e]
        return f"{g.names[e]}: {d + ' ' if d else ''}{' '.join(picked)}"

    def entity_batch(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None) -> Ragged:
        """``[self.entity_ids(e, x) for e, x in zip(entities, excludes)]`` as one :class:`Ragged`, built on the
        arrays: a training step asks for 3,072 of them (queries, tails, heads), which one by one cost the host 0.1 s
        a step while the GPU waited."""
        nb, e = self.neighbors, np.asarray(entities, dtype=np.int64).reshape(-1)
        n = len(e)
        x = (np.full(n, -1, dtype=np.int64) if excludes is None
             else np.fromiter((-1 if v is None else int(v) for v in excludes), dtype=np.int64, count=n))
        counts = np.where(self.short[e], nb.lengths_of(e), 0)
        owner = np.repeat(np.arange(n, dtype=np.int64), counts)  # the batch row of each candidate neighbour
        picked = nb.values[spans(nb.offsets[e], counts)]
        keep = picked != x[owner]  # the other end of the triple is left out
        owner, picked = owner[keep], picked[keep]
        grown = np.bincount(owner, minlength=n) > 0  # rows with a neighbour left: the colon text, then names
        head = np.where(grown, self.base_colon.lengths_of(e), self.base.lengths_of(e))
        # names are appended until the text reaches max_tokens: a name is kept when it is its row's first or the
        # text before it is still shorter (entity_ids' loop breaks after the name that fills it)
        step = self.name_ids.lengths_of(picked)
        first = np.concatenate([[True], owner[1:] != owner[:-1]]) if len(owner) else np.zeros(0, dtype=bool)
        before = head[owner] + _exclusive_within(step, first)
        kept = first | (before < self.max_tokens)
        owner, picked, step, before = owner[kept], picked[kept], step[kept], before[kept]
        lengths = head + np.bincount(owner, weights=step, minlength=n).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.empty(int(offsets[-1]), dtype=self.base.values.dtype)
        for rows, source in ((np.flatnonzero(~grown), self.base), (np.flatnonzero(grown), self.base_colon)):
            values[spans(offsets[rows], head[rows])] = source.values[spans(source.offsets[e[rows]], head[rows])]
        values[spans(offsets[owner] + before, step)] = self.name_ids.values[spans(self.name_ids.offsets[picked], step)]
        return Ragged(values, offsets)

    def entity_inputs(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None):
        """The tail tower's padded inputs for ``entities`` (their neighbour ``excludes`` left out)."""
        return self.special.wrap_pad(self.entity_batch(entities, excludes), self.max_tokens)

    def length_batches(self, batch_size: int) -> list[list[int]]:
        """Every entity id, in batches of similar evaluation-text length (little padding per batch)."""
        order = np.argsort(self.eval_lengths(), kind="stable").tolist()  # stable: ties keep id order, as sorted()
        return [order[s: s + batch_size] for s in range(0, len(order), batch_size)]

    def fingerprint(self) -> str:
        """Hash of every entity's evaluation-time token ids (what an index was built from); computed once per
        bank (the texts are fixed when it is built), not at each freshness check of one command."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for e in range(self.graph.num_entities):
                h.update(str(self.entity_ids(e)).encode())
                h.update(b"\n")
            self._fingerprint = h.hexdigest()
            if self._cache_key is not None:
                token_cache.store_fingerprint(self._cache_key, self._neighbors_key(), self._fingerprint)
        return self._fingerprint
