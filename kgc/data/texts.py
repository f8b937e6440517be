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
from typing import Sequence

import torch

from kgc.data.graph import KnowledgeGraph


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
        """Pad ``(ids, types)`` pairs to the longest: ``input_ids``, ``attention_mask``, ``token_type_ids`` (batch, len)."""
        n, width = len(seqs), max(len(ids) for ids, _ in seqs)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        types = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, (ids, tt) in enumerate(seqs):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            types[i, : len(tt)] = torch.tensor(tt)
            mask[i, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types}


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the vocabulary: what a cache of token-keyed states depends on besides the weights."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(repr(vocab).encode()).hexdigest()


def _find(hay: list[int], needle: list[int], start: int = 0) -> int:
    for i in range(start, len(hay) - len(needle) + 1):
        if hay[i: i + len(needle)] == needle:
            return i
    raise ValueError("tokenizer template: marker not found")


def _entity_token_ids(graph: KnowledgeGraph, entities: range, tokenizer, short_description_words: int):
    """(base, base_colon, name_ids, short) for ``entities``: the token ids of "name: description", of the same
    with the colon a neighbour list needs ("name:" for a name with no description), of the name alone, and
    whether the description is short enough to get neighbour names."""
    if not entities:
        return [], [], [], []
    tok = lambda texts: tokenizer(list(texts), add_special_tokens=False)["input_ids"]  # noqa: E731
    names, descriptions = graph.names, graph.descriptions
    return (tok(graph.full_texts[e] for e in entities),
            tok(f"{names[e]}: {descriptions[e]}" if descriptions[e] else f"{names[e]}:" for e in entities),
            tok(names[e] for e in entities),
            [len(descriptions[e].split()) < short_description_words for e in entities])


class TextBank:
    """Token ids for every entity and relation text of a graph (tokenised once, no special tokens)."""

    def __init__(self, graph: KnowledgeGraph, tokenizer, *, max_tokens: int = 50, neighbor_text: bool = True,
                 max_neighbors: int = 10, short_description_words: int = 20) -> None:
        self.graph = graph
        self.max_tokens = max_tokens
        self.special = SpecialTokens.from_tokenizer(tokenizer)
        self.tokenizer_hash = tokenizer_hash(tokenizer)
        self.max_neighbors = max_neighbors if neighbor_text else 0
        # "name: description"; a name with no description gets its colon only when neighbours follow
        self.short_description_words = short_description_words
        self.base, self.base_colon, self.name_ids, self.short = _entity_token_ids(
            graph, range(graph.num_entities), tokenizer, short_description_words)
        self.relation_ids = tokenizer([graph.relation_text(r) for r in range(2 * graph.num_relations)],
                                      add_special_tokens=False)["input_ids"]
        nbrs = graph.train_neighbors if self.max_neighbors else [[] for _ in graph.names]
        self.neighbors = [n[: self.max_neighbors] for n in nbrs]
        self._fingerprint: str | None = None

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
        bank.name_ids, bank.short = self.name_ids + name_ids, self.short + short
        bank.neighbors = self.neighbors + [[] for _ in new]
        bank._fingerprint = None  # other entities: hashed anew
        return bank

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

    def entity_inputs(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None):
        excludes = excludes if excludes is not None else [None] * len(entities)
        return self.special.pad([self.special.wrap(self.entity_ids(e, x), self.max_tokens)
                                 for e, x in zip(entities, excludes)])

    def length_batches(self, batch_size: int) -> list[list[int]]:
        """Every entity id, in batches of similar evaluation-text length (little padding per batch)."""
        order = sorted(range(self.graph.num_entities), key=lambda e: len(self.entity_ids(e)))
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
        return self._fingerprint
