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
  use it — a (batch, H, H) tensor is never built. While training, h_c passes Dropout(0.1) before the
  generators, as in the authors' released code (evaluation is unaffected).

Every output is L2-normalised.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from kgc.conditioning.base import Conditioner, ConditionerOptions, Explained, TokenLists, register
from kgc.errors import KGCError

# the parts an exported query is composed from (kgc.json), the same for every conditioner here
POOLED_PARTS = {"h_s": "query tower(head text), encoded exactly like an entity text (entities.tsv)",
                "h_c": "query tower(relation text) (relations.tsv), a single sequence like an entity text"}


GENERATOR_DROPOUT = 0.1  # Hyper-CL's released code: Dropout(0.1) on the condition embedding before the generators


class PooledConditioner(Conditioner):
    enters_at = "pooled"

    def _spec(self, query: str, **options: Any) -> dict[str, Any]:
        """An export spec reproducible from the query tower's pooled h_s, h_c and ``conditioner.safetensors``."""
        return {"reproducible_outside_kgc": True, "query": query, **POOLED_PARTS, "options": options}

    def encode_sentences(self, sentences: TokenLists) -> torch.Tensor:
        return self.encoder.encode_unique(self.padded(sentences))  # (batch, H)

    def encode_conditions(self, conditions: TokenLists) -> torch.Tensor:
        return self.encoder.encode_unique(self.padded(conditions))  # (conditions, H)


class HadamardOptions(ConditionerOptions):
    """The Hadamard tri-encoder: h_s ⊙ h_c."""
    conditioner: Literal["hadamard"] = Field("hadamard", description="hadamard: h_s ⊙ h_c (after pooling)")


@register
class Hadamard(PooledConditioner):
    name = "hadamard"
    Options = HadamardOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        self.proj = nn.Linear(h, h)

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        return cls.name

    def export_spec(self) -> dict[str, Any]:
        return self._spec("normalize(h_s * (proj.weight @ h_c + proj.bias))")

    def combine(self, sentence_state, condition_state, condition_index):
        cond = self.proj(condition_state)[condition_index]  # (batch, H): W h_c per distinct condition
        return F.normalize(sentence_state * cond, dim=-1)


class ConcatOptions(ConditionerOptions):
    """The concatenation tri-encoder: [h_s ; h_c] through a learnt map."""
    conditioner: Literal["concat"] = Field("concat", description="concat: [h_s ; h_c] mapped (after pooling)")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout on [h_s ; h_c]")


@register
class Concat(PooledConditioner):
    name = "concat"
    Options = ConcatOptions

    def __init__(self, *, dropout: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(2 * h, h)

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        return cls.name

    def export_spec(self) -> dict[str, Any]:
        return self._spec("normalize(gelu(proj.weight @ concat(h_s, h_c) + proj.bias))  (exact erf GELU; dropout off)",
                          dropout=self.dropout.p)

    def combine(self, sentence_state, condition_state, condition_index):
        pair = torch.cat([sentence_state, condition_state[condition_index]], dim=-1)  # (batch, 2H)
        return F.normalize(F.gelu(self.proj(self.dropout(pair))), dim=-1)


class HyperNetOptions(ConditionerOptions):
    """Hyper-CL: the condition generates a matrix W_c applied to the pooled sentence."""
    conditioner: Literal["hypernet"] = Field("hypernet", description="hypernet: Hyper-CL (after pooling)")
    rank: Optional[int] = Field(None, ge=1, description="rank K of W1 W2ᵀ (default H/12)")
    hypernet_form: Literal["lowrank", "residual", "full"] = Field(
        "lowrank", description="W_c = W1 W2ᵀ (Hyper-CL), I + W1 W2ᵀ (residual), or a full H×H matrix")


@register
class HyperNet(PooledConditioner):
    name = "hypernet"
    Options = HyperNetOptions
    explains = "Hyper-CL's W_c (hypernet)"

    def __init__(self, *, rank: int | None = None, hypernet_form: str = "lowrank", **kwargs) -> None:
        super().__init__(**kwargs)
        h = self.encoder.dim
        if hypernet_form not in ("lowrank", "residual", "full"):
            raise KGCError(f"model.hypernet_form {hypernet_form!r}: choose lowrank, residual or full")
        self.form = hypernet_form
        self.rank = rank or max(1, h // 12)
        self.gen_dropout = nn.Dropout(GENERATOR_DROPOUT)  # on h_c before the generators, as Hyper-CL's released code
        if self.form == "full":
            self.gen = nn.Linear(h, h * h)
        else:
            self.gen1 = nn.Linear(h, h * self.rank)
            self.gen2 = nn.Linear(h, h * self.rank)
            if self.form == "residual":  # W_c = I + W1 W2ᵀ starts at the identity
                nn.init.zeros_(self.gen2.weight)
                nn.init.zeros_(self.gen2.bias)

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        return f"{cls.name} ({options.get('hypernet_form', 'lowrank')}, K={options.get('rank') or 'H/12'})"

    def export_spec(self) -> dict[str, Any]:
        factors = "W1 = (gen1.weight @ h_c + gen1.bias).reshape(H, K), W2 likewise from gen2; "
        query = {"lowrank": factors + "q = normalize((h_s @ W1) @ W2.T)",
                 "residual": factors + "q = normalize(h_s + (h_s @ W1) @ W2.T)",
                 "full": "W_c = (gen.weight @ h_c + gen.bias).reshape(H, H); q = normalize(h_s @ W_c)"}[self.form]
        return self._spec(query, rank=None if self.form == "full" else self.rank, hypernet_form=self.form)

    @property
    def explain_kind(self) -> str | None:
        return "spectrum"

    @torch.no_grad()
    def explain(self, conditions: TokenLists, sentence: Sequence[int] | None = None) -> Explained:
        """The singular values of W_c (H × H) of each condition, descending (``sentence`` is not needed)."""
        mats = self.matrices(self.encode_conditions(conditions))  # (conditions, H, H)
        return Explained("spectrum", torch.linalg.svdvals(mats.float()).cpu())

    def encode_conditions(self, conditions: TokenLists):
        """W_c of each distinct condition: (conditions, H, H) full, or the factors (conditions, H, K) ×2."""
        hc = self.gen_dropout(super().encode_conditions(conditions))  # (conditions, H); dropout while training
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
            out[rows] = q.to(out.dtype)  # under autocast the product is bf16, the sentence state fp32
        return F.normalize(out, dim=-1)
