"""Embed many (sentence | condition) pairs for evaluation, each conditioner at its own cost.

Both tasks evaluate the same way: link prediction embeds (head | relation) queries, C-STS embeds
(sentence | condition) for both sentences of every row. What can be computed once is:

* every condition's state — once per distinct condition (encoder passes counted only where the state
  needs the encoder: the bi-encoder's condition state is its token ids);
* every sentence's state up to the layer where the condition enters — once per distinct sentence, for
  conditioners that meet the condition after the input (router: layer t; tri-encoders, Hyper-CL: the
  pooled embedding); input-level conditioners (bi-encoder, CASE) run the whole encoder per pair.

Per pair only ``combine`` runs. ``passes`` counts encoder passes by kind: ``sentences``, ``conditions``,
``<unit>_full`` (whole encoder per pair: input-level conditioners, and the router with ``cross_attend: all``)
and ``<unit>_top_layers`` (the router's top k layers per pair).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from kgc.conditioning.base import Conditioner


def cat_any(parts: list[Any]) -> Any:
    """Concatenate chunked states row-wise: tensors (zero-padded along dim 1 where chunks differ in width, as
    token states and masks do), tuples and named tuples of them, None, or lists (token ids)."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        width = max(p.shape[1] for p in parts) if first.dim() > 1 else None
        if width is not None and any(p.shape[1] != width for p in parts):
            parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1])) for p in parts]
        return torch.cat(parts)
    if isinstance(first, tuple):
        cols = [cat_any(list(col)) for col in zip(*parts)]
        return type(first)(*cols) if hasattr(first, "_fields") else tuple(cols)
    return [row for part in parts for row in part]


def nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(nbytes(v) for v in x)
    return 0


class PairEncoder:
    """``self(sentence_index, condition_index)`` → (batch, dim) unit vectors of sentence i under condition j.

    ``sentences`` and ``conditions`` are token ids without special tokens. ``sentence_table``
    (sentences, dim), when given, *is* the sentence state (pooled conditioners whose sentence tower is the
    one that produced it), so no sentence is encoded again. ``only``: encode the states of these sentences now
    and of any other the first time a pair asks for it (:meth:`ensure`), instead of every sentence up front —
    an evaluation on a sample of queries needs the states of its own heads, not of the whole graph.
    """

    def __init__(self, cond: Conditioner, sentences: Sequence[Sequence[int]], conditions: Sequence[Sequence[int]], *,
                 batch_size: int = 256, progress: bool = False, sentence_table: torch.Tensor | None = None,
                 unit: str = "queries", only: Sequence[int] | None = None) -> None:
        self.cond, self.tokens, self.unit = cond, sentences, unit
        self.batch_size, self.progress = batch_size, progress
        self.passes = {"sentences": 0, "conditions": 0, f"{unit}_full": 0, f"{unit}_top_layers": 0}
        self.conditions = cat_any([cond.encode_conditions(conditions[s: s + batch_size])
                                   for s in range(0, len(conditions), batch_size)])
        if cond.encodes_conditions:
            self.passes["conditions"] = len(conditions)
        self.sentences, self.row, self.borrowed = None, None, False
        if cond.enters_at == "input":
            return
        n = len(sentences)
        if sentence_table is not None:
            self.sentences, self.row, self.borrowed = sentence_table.to(cond.device), torch.arange(n), True
            return
        self.row = torch.full((n,), -1, dtype=torch.long)  # sentence index → row of self.sentences (-1: not yet)
        self.ensure(range(n) if only is None else only)

    def ensure(self, sentence_index) -> int:
        """Encode the states of the sentences in ``sentence_index`` that have none yet; returns how many."""
        if self.row is None or self.borrowed:
            return 0
        from tqdm.auto import tqdm

        want = np.unique(np.asarray(sentence_index, dtype=np.int64))
        missing = want[(self.row[torch.from_numpy(want)] < 0).numpy()]
        if not len(missing):
            return 0
        order = sorted(missing.tolist(), key=lambda i: len(self.tokens[i]))  # similar lengths batch with little padding
        b = self.batch_size
        batches = [order[s: s + b] for s in range(0, len(order), b)]
        chunks = [self.cond.encode_sentences([self.tokens[i] for i in idx])
                  for idx in tqdm(batches, desc="sentence states", disable=not self.progress, leave=False)]
        start = int((self.row >= 0).sum())  # rows in length order, appended after those encoded before
        self.sentences = self.cond.cat_states(chunks if self.sentences is None else [self.sentences, *chunks])
        self.row[torch.tensor(order, dtype=torch.long)] = torch.arange(start, start + len(order))
        self.passes["sentences"] += len(order)
        return len(order)

    @property
    def state_bytes(self) -> int:
        """Bytes of the states kept for evaluation (a borrowed sentence table is not counted twice)."""
        return (0 if self.borrowed else nbytes(self.sentences)) + nbytes(self.conditions)

    def __call__(self, sentence_index, condition_index) -> torch.Tensor:
        s = np.asarray(sentence_index)
        c = torch.as_tensor(np.asarray(condition_index), device=self.cond.device)
        if self.cond.enters_at == "input":  # the condition enters at the input: the whole encoder per pair
            self.passes[f"{self.unit}_full"] += len(s)
            return self.cond.combine(self.cond.encode_sentences([self.tokens[int(i)] for i in s]), self.conditions, c)
        self.ensure(s)  # sentences outside ``only``: their states now, once
        if self.cond.enters_at == "layer":
            self.passes[f"{self.unit}_{'full' if self.cond.entry_layer == 0 else 'top_layers'}"] += len(s)
        return self.cond.combine(self.cond.take(self.sentences, self.row[torch.as_tensor(s)]), self.conditions, c)
