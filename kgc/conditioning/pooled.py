"""Conditioners that meet the condition after pooling (t = T): tri-encoder baselines and Hyper-CL.

The sentence and the condition are embedded separately by the same backbone (h_s, h_c: unit vectors);
only a cheap composition runs per pair, so evaluation embeds every entity once and every relation
once, then composes per query.

* ``hadamard`` — q = h_s ⊙ (W h_c)                     (Hyper-CL's tri-encoder baseline)
* ``concat``   — q = GELU(W · dropout([h_s ; h_c])), W: 2H → H
* ``hypernet`` — Hyper-CL: a linear hypernetwork maps h_c to W_c; q = h_s W_c. ``hypernet_form``:
  ``lowrank`` W_c = W1 W2ᵀ with W1, W2 ∈ ℝ^{H×K} (``rank`` K, default H/12), ``residual``
  W_c = I + W1 W2ᵀ with the W2 generator initialised to zero (starts as the plain encoder), or
  ``full`` W_c ∈ ℝ^{H×H}. W_c is computed once per *distinct* condition and applied to the rows that
  use it — a (batch, H, H) tensor is never built.

Every output is L2-normalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kgc.conditioning.base import Conditioner, TokenLists, register
from kgc.errors import KGCError


class PooledConditioner(Conditioner):
    enters_at = "pooled"

    def encode_sentences(self, sentences: TokenLists) -> torch.Tensor:
        return self.encoder.encode_unique(self.single_batch(sentences))  # (batch, H)

    def encode_conditions(self, conditions: TokenLists) -> torch.Tensor:
        return self.encoder.encode_unique(self.single_batch(conditions))  # (conditions, H)


@register
class Hadamard(PooledConditioner):
    name = "hadamard"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        self.proj = nn.Linear(h, h)

    def combine(self, sentence_state, condition_state, condition_index):
        cond = self.proj(condition_state)[condition_index]  # (batch, H): W h_c per distinct condition
        return F.normalize(sentence_state * cond, dim=-1)


@register
class Concat(PooledConditioner):
    name = "concat"
    options = ("dropout",)

    def __init__(self, *, dropout: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(2 * h, h)

    def combine(self, sentence_state, condition_state, condition_index):
        pair = torch.cat([sentence_state, condition_state[condition_index]], dim=-1)  # (batch, 2H)
        return F.normalize(F.gelu(self.proj(self.dropout(pair))), dim=-1)


@register
class HyperNet(PooledConditioner):
    name = "hypernet"
    options = ("rank", "hypernet_form")

    def __init__(self, *, rank: int | None = None, hypernet_form: str = "lowrank", **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        if hypernet_form not in ("lowrank", "residual", "full"):
            raise KGCError(f"model.hypernet_form {hypernet_form!r}: choose lowrank, residual or full")
        self.form = hypernet_form
        self.rank = rank or max(1, h // 12)
        if self.form == "full":
            self.gen = nn.Linear(h, h * h)
        else:
            self.gen1 = nn.Linear(h, h * self.rank)
            self.gen2 = nn.Linear(h, h * self.rank)
            if self.form == "residual":  # W_c = I + W1 W2ᵀ starts at the identity
                nn.init.zeros_(self.gen2.weight)
                nn.init.zeros_(self.gen2.bias)

    def encode_conditions(self, conditions: TokenLists):
        """W_c of each distinct condition: (conditions, H, H) full, or the factors (conditions, H, K) ×2."""
        hc = super().encode_conditions(conditions)  # (conditions, H)
        n, h = hc.shape
        if self.form == "full":
            return self.gen(hc).view(n, h, h)
        return self.gen1(hc).view(n, h, self.rank), self.gen2(hc).view(n, h, self.rank)

    def matrices(self, condition_state) -> torch.Tensor:
        """W_c of every condition as (conditions, H, H) — for inspection (``kgc explain``); :meth:`combine`
        applies the factors without building these."""
        if self.form == "full":
            return condition_state
        w1, w2 = condition_state  # (conditions, H, K) each
        mats = w1 @ w2.transpose(1, 2)
        return mats + torch.eye(mats.shape[-1], device=mats.device) if self.form == "residual" else mats

    def combine(self, sentence_state, condition_state, condition_index):
        out = torch.empty_like(sentence_state)  # (batch, H)
        for c in torch.unique(condition_index).tolist():  # one small matmul per distinct condition
            rows = condition_index == c
            hs = sentence_state[rows]  # (rows, H)
            if self.form == "full":
                q = hs @ condition_state[c]
            else:
                w1, w2 = condition_state[0][c], condition_state[1][c]  # (H, K) each
                q = (hs @ w1) @ w2.t()
                if self.form == "residual":
                    q = hs + q
            out[rows] = q
        return F.normalize(out, dim=-1)
