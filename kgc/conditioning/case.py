"""CASE, condition-aware sentence embeddings (Zhang, Zhou and Bollegala): embed the *condition* given the
sentence, remove what the condition says on its own, then a learnt projection.

    e(s | c) = P( f(c ; s) − f(c ; ∅) )

* f(c ; s): ``[CLS] condition [SEP] sentence [SEP]`` through the encoder, pooled over the condition's
  tokens only (the sentence is context, not content) — the condition enters at the input (t = 0);
* f(c ; ∅): ``[CLS] condition [SEP]`` pooled the same way;
* both are the toolkit's unit-length embeddings; P is ``case_projection`` ``linear`` or ``mlp``, ``case_dim``
  k (default H), with ``case_head: paper`` (the default) the paper's equations (3)–(5) and dropout rates:
  linear z = Dropout₀.₂(W e) (W: k × H); mlp h = Dropout₀.₁₅(ReLU(W1 e)), z = Dropout₀.₁₅(ReLU(W2 h))
  (W1: H × H, W2: k × H; the paper writes no biases, the released code's Linear has none). ``legacy``: the heads
  kgc had before (linear W e; mlp W2 Dropout₀.₁(LeakyReLU(W1 e)) with biases), kept so older runs load as
  they were trained (their saved recipes lack the key and read as legacy). The output is L2-normalised like
  every embedding here (with the paper's MLP it lies in the positive orthant: ReLU comes last). With ``encoder.trainable_layers: 0`` only P trains (the
  paper's setting: a frozen encoder and a small supervised projection, minutes).

What CASE can cache: f(c ; ∅), once per distinct condition (``encode_conditions``). What it cannot:
f(c ; s) reads the sentence and the condition together from the first layer, so every (sentence,
condition) pair runs the whole encoder — the bi-encoder's cost, not the tri-encoders'.

Works for link prediction too: the relation is the condition, the head's text the sentence (there k
must equal the entity width H). The released code (github.com/jojozhang00/CSTS-CASE) uses
instruction-tuned LLM encoders with a prompt (condition in the query slot, sentence as context) and
last-token pooling over the whole prompt, a projection Linear(d → 512, no bias) → LeakyReLU →
Dropout(0.15), and MSE against label / 5; here a BERT-family encoder pools the condition's own tokens.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from kgc.conditioning.base import Conditioner, ConditionerOptions, TokenLists, register
from kgc.errors import KGCError


class CaseOptions(ConditionerOptions):
    """CASE: the condition embedded given the sentence, minus the condition alone, then a learnt projection."""
    conditioner: Literal["case"] = Field("case", description="case: CASE (the condition enters at the token input)")
    case_projection: Literal["linear", "mlp"] = Field("linear", description="W x, or a two-layer MLP")
    case_dim: Optional[int] = Field(None, ge=1, description="projection width k (default H)")
    case_head: Literal["paper", "legacy"] = Field(
        "paper", description="the paper's heads (linear: Dropout(0.2) on W x; mlp: ReLU, Dropout(0.15), twice, no "
                             "biases) or legacy (the heads of CASE runs saved before this key existed: linear W x; "
                             "mlp W2 Dropout(0.1)(LeakyReLU(W1 x)))")


@register
class Case(Conditioner):
    name = "case"
    enters_at = "input"
    Options = CaseOptions

    def __init__(self, *, case_projection: str = "linear", case_dim: int | None = None, case_head: str = "paper",
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if self.encoder.pooling == "cls":
            raise KGCError("model.conditioner=case pools the condition's own tokens: use model.pooling mean or s2sent")
        h = self.encoder.dim
        self.case_projection, self.case_head = case_projection, case_head
        self.case_dim: int = case_dim or h  # the projection's width, the embeddings' width
        k, paper = self.case_dim, case_head == "paper"
        if case_head not in ("paper", "legacy"):
            raise KGCError(f"model.case_head {case_head!r}: choose paper or legacy")
        if case_projection == "linear":  # the dropout after W has no weights: the state-dict keys are the same
            self.proj = nn.Linear(h, k, bias=False)
            self.proj_dropout = nn.Dropout(0.2 if paper else 0.0)
        elif case_projection == "mlp":
            self.proj = (nn.Sequential(nn.Linear(h, h, bias=False), nn.ReLU(), nn.Dropout(0.15),
                                       nn.Linear(h, k, bias=False), nn.ReLU(), nn.Dropout(0.15)) if paper else
                         nn.Sequential(nn.Linear(h, h), nn.LeakyReLU(), nn.Dropout(0.1), nn.Linear(h, k)))
            self.proj_dropout = nn.Identity()
        else:
            raise KGCError(f"model.case_projection {case_projection!r}: choose linear or mlp")

    @property
    def out_dim(self) -> int:
        return self.case_dim

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        legacy = ", legacy head" if options.get("case_head") == "legacy" else ""
        return f"{cls.name} ({options.get('case_projection', 'linear')}, k={options.get('case_dim') or 'H'}{legacy})"

    def export_spec(self) -> dict[str, Any]:
        return {"reproducible_outside_kgc": True,
                "note": "with transformers and a mean over a token span (the relation's tokens: sequence id 0 of the "
                        "pair); stock sentence-transformers modules pool every token",
                "query": "f(c; s) = pool over the relation's tokens of query tower(tokenizer(relation, head) pair, "
                         "longest_first to max_tokens); f(c; none) = pool over the relation's tokens of "
                         "[CLS] relation [SEP]; both L2-normalised; q = normalize(P(f(c; s) - f(c; none))) with P(x) = "
                         + ("proj.weight @ x" if self.case_projection == "linear" else
                            "relu(proj.3.weight @ relu(proj.0.weight @ x))" if self.case_head == "paper" else
                            "proj.3(leaky_relu(proj.0(x), 0.01))") + " (dropout off)",
                "options": {"case_projection": self.case_projection, "case_dim": self.case_dim,
                            "case_head": self.case_head}}

    def _pooled(self, seqs: list[tuple[list[int], list[int]]], spans: list[tuple[int, int]]) -> torch.Tensor:
        """(batch, H) unit vectors of the padded sequences, pooled over each one's condition span."""
        batch = self.special.pad(seqs)
        mask = torch.zeros_like(batch["attention_mask"])
        for i, (a, b) in enumerate(spans):
            mask[i, a:b] = 1
        batch["pool_mask"] = mask
        return self.encoder.encode_unique(batch)  # moved to the device by encode_unique

    def encode_conditions(self, conditions: TokenLists) -> tuple[list[list[int]], torch.Tensor]:
        """(the conditions' token ids, f(c ; ∅) (conditions, H))."""
        start = len(self.special.single[0])
        seqs = [self.special.wrap(c, self.max_tokens) for c in conditions]
        spans = [(start, start + len(ids) - self.special.n_single) for ids, _ in seqs]
        return [list(c) for c in conditions], self._pooled(seqs, spans)

    def encode_sentences(self, sentences: TokenLists) -> TokenLists:
        return sentences  # t = 0: nothing is condition-free above the input

    def combine(self, sentence_state, condition_state, condition_index):
        tokens, alone = condition_state
        start = len(self.special.pair[0])
        seqs, spans = [], []
        for s, c in zip(sentence_state, condition_index.tolist()):
            cond, sent = self.special.truncate_pair(tokens[c], s, self.max_tokens)
            seqs.append(self.special.wrap_pair(cond, sent, self.max_tokens))
            spans.append((start, start + len(cond)))
        given = self._pooled(seqs, spans)  # f(c ; s): (batch, H)
        return F.normalize(self.proj_dropout(self.proj(given - alone[condition_index])), dim=-1)  # (batch, case_dim)
