"""SimKGC's bi-encoder: the condition enters at the token input, ``[CLS] head [SEP] relation [SEP]``.

Nothing can be cached below the condition (t = 0), so every (head, relation) pair runs the whole
encoder. Identical pairs inside a batch are encoded once.

``router_layers: k`` (default 0, off) adds CSR inside the bi-encoder (the CSR paper's Table 1, lower
half): in each of the top k layers, w is the attention the condition pays to the sentence's tokens —
the joint input has no [CLS] of its own for the condition, so the rows of the condition's tokens stand
in for it: their head-averaged attention probabilities on the sentence's tokens ([CLS] and the head's
tokens), averaged over the condition's tokens and renormalised — and the context vectors of the
sentence's tokens are multiplied by (1 + w) (Eq. 1; the condition's tokens keep factor 1). The layers
below T − k still run once per distinct input and can come from the layer cache.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import torch
from pydantic import Field

from kgc.conditioning.base import Conditioner, ConditionerOptions, Explained, TokenLists, register
from kgc.conditioning.routing import Route, RoutedAttention, explained
from kgc.encoding.backbone import unique_rows_on
from kgc.encoding.layers import check_bert_family
from kgc.errors import KGCError


class BiEncoderOptions(ConditionerOptions):
    """SimKGC's bi-encoder: ``[CLS] head [SEP] relation [SEP]`` through the whole encoder; optionally CSR's token
    weights inside its top k layers."""
    conditioner: Literal["biencoder"] = Field("biencoder", description="biencoder: SimKGC's head and relation as "
                                              "one input (the condition enters at the token input)")
    router_layers: Optional[int] = Field(None, ge=0, description="CSR routing in the top k layers (default 0, off)")
    weighting: Optional[Literal["one_plus_w", "w_only", "centred"]] = Field(
        None, description="with router_layers: the factor is 1 + w (CSR's Eq. 1; the default), w alone, or "
                          "1 + w − 1/n over the n tokens w covers")


@register
class BiEncoder(Conditioner):
    name = "biencoder"
    enters_at = "input"

    @classmethod
    def plain_layers(cls, options: dict[str, Any], layers: int) -> int:
        return layers - (options.get("router_layers") or 0)  # CSR inside the bi-encoder routes the top k
    encodes_conditions = False
    Options = BiEncoderOptions
    explains = "CSR's token weights inside the bi-encoder (biencoder with model.router_layers > 0)"
    tune_space: dict = {}  # no parameters of its own (router_layers > 0 adds some: set tune.space then)

    def __init__(self, *, router_layers: int | None = 0, weighting: str | None = "one_plus_w", **kwargs) -> None:
        super().__init__(**kwargs)
        self.router_layers: int = router_layers or 0  # CSR in the top k layers; 0: the plain bi-encoder
        self.weighting = weighting = self.resolved_options({"weighting": weighting})["weighting"]
        total = self.encoder.num_layers
        if not 0 <= self.router_layers <= total:
            raise KGCError(f"model.router_layers={router_layers}: choose 0..{total} for the bi-encoder (0: no routing)")
        if weighting not in ("one_plus_w", "w_only", "centred"):
            raise KGCError(f"model.weighting {weighting!r}: choose one_plus_w, w_only or centred")
        self.routing = None
        if self.router_layers:
            check_bert_family(self.encoder.backbone, "model.conditioner=biencoder with router_layers")
            self.routing = RoutedAttention(self.encoder.backbone, self.routing_layers)

    @classmethod
    def resolved_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Unset ``weighting``: one_plus_w (CSR's Eq. 1 inside the bi-encoder)."""
        return {**options, "weighting": options.get("weighting") or "one_plus_w"}

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        k = options.get("router_layers")
        return cls.name + (f" + CSR in the top {k} layers ({options.get('weighting') or 'one_plus_w'})" if k else "")

    def export_spec(self) -> dict[str, Any]:
        pair = ("text pair (head text, relation text): tokenizer(head, relation, truncation='longest_first', "
                "max_length=max_tokens), i.e. [CLS] head [SEP] relation [SEP] with token types 0 / 1")
        options = {"router_layers": self.router_layers, "weighting": self.weighting}
        if self.router_layers:
            return {"reproducible_outside_kgc": False, "input": pair,
                    "query": f"CSR routing inside the top {self.router_layers} layers (model.router_layers) rescales "
                             "attention context vectors; a stock transformer does not route. Use kgc for queries.",
                    "options": options}
        return {"reproducible_outside_kgc": True, "input": pair,
                "query": "pool(query tower(pair)) over every token, L2-normalised; with the sentence-transformers "
                         "format: SentenceTransformer(query folder).encode([[head text, relation text], ...])",
                "options": options}

    @property
    def explain_kind(self) -> str | None:
        return "tokens" if self.routing is not None else None

    def not_explainable(self, what: str | None = None) -> KGCError:
        return super().not_explainable(what or f"{self.name} without router_layers")

    @torch.no_grad()
    def explain(self, conditions: TokenLists, sentence: Sequence[int] | None = None) -> Explained:
        """w over [CLS] and the sentence's tokens of each ``[CLS] sentence [SEP] condition [SEP]``, averaged over
        the routed layers; where a long condition cut the sentence shorter in some pairs, their common part."""
        if self.routing is None:
            raise self.not_explainable()
        if sentence is None:
            raise KGCError("kgc explain: give a sentence (an entity's text): CSR weighs its tokens")
        n = len(conditions)
        _, route = self.route([sentence] * n, list(conditions), torch.arange(n, device=self.device))
        rows = route.order.cpu() if route.order is not None else torch.arange(n)
        width = min(int(route.score_cols[int(i)].sum()) for i in rows)  # [CLS] + the sentence's tokens kept
        ids = self.special.pair[0] + self.special.truncate_pair(sentence, conditions[0], self.max_tokens)[0]
        return explained(route, rows, width, ids[:width])

    @property
    def plain_below(self) -> int:
        return self.encoder.num_layers - self.router_layers

    def encode_conditions(self, conditions: TokenLists) -> TokenLists:
        return conditions  # t = 0: the condition's state is its token ids

    def encode_sentences(self, sentences: TokenLists) -> TokenLists:
        return sentences  # t = 0: nothing is condition-free above the input

    def route(self, sentence_state: TokenLists, condition_state: TokenLists,
              condition_index: torch.Tensor) -> tuple[torch.Tensor, Route | None]:
        """(batch, dim) embeddings, and with routing the :class:`Route` of the distinct pairs (w per layer in
        ``seen``; ``route.mask`` and ``score_cols`` say which positions hold the pair and the sentence)."""
        conds = [condition_state[int(i)] for i in condition_index.tolist()]
        if self.routing is None:
            pairs = [self.special.wrap_pair(s, c, self.max_tokens) for s, c in zip(sentence_state, conds)]
            return self.encoder.encode_unique(self.special.pad(pairs)), None  # (batch, dim)
        pairs, rows, cols = [], [], []
        pre, mid, _ = self.special.pair
        for s, c in zip(sentence_state, conds):
            a, b = self.special.truncate_pair(s, c, self.max_tokens)
            ids, types = self.special.wrap_pair(a, b, self.max_tokens)  # already fits: no second cut
            n_sent, start = len(pre) + len(a), len(pre) + len(a) + len(mid)
            pairs.append((ids, types))
            cols.append([1] * n_sent + [0] * (len(ids) - n_sent))  # [CLS] and the sentence's tokens
            cond = [0] * len(ids)
            for j in range(start, start + len(b)) if b else range(n_sent, len(ids)):
                cond[j] = 1  # the condition's tokens (its separators when it was cut away entirely)
            rows.append(cond)
        batch = self.special.pad(pairs)
        width = batch["input_ids"].shape[1]
        for name, marks in (("route_rows", rows), ("route_cols", cols)):
            batch[name] = torch.tensor([m + [0] * (width - len(m)) for m in marks])
        sub, inverse = unique_rows_on(batch, self.device)  # found on the CPU; only the distinct rows travel
        r = Route(mask=sub["attention_mask"], scale_layers=frozenset(self.routing_layers),
                  score_rows=sub.pop("route_rows"), score_cols=sub.pop("route_cols"), weighting=self.weighting,
                  order=inverse)
        with self.routing.route(r):
            return self.encoder(**sub)[inverse], r

    def prepare(self, sentences: TokenLists, conditions: TokenLists) -> Any:
        """The padded ``[CLS] head [SEP] relation [SEP]`` rows built on the arrays, their distinct rows in length
        groups, pinned (:func:`kgc.encoding.inputs.build_inputs`): the step only copies them and runs the encoder.
        With routing, the lists for :meth:`forward` (its route marks are built per row)."""
        if self.routing is not None:
            return super().prepare(sentences, conditions)
        from kgc.data.ragged import Ragged
        from kgc.encoding.inputs import build_inputs

        a = sentences if isinstance(sentences, Ragged) else Ragged.from_lists(sentences)
        b = conditions if isinstance(conditions, Ragged) else Ragged.from_lists(conditions)
        pairs = self.special.wrap_pair_pad(a, b, self.max_tokens)
        return build_inputs(pairs, bucket=self.encoder.group_bucket(), cap=self.max_tokens).pin(self.device)

    def forward_prepared(self, prepared: Any) -> torch.Tensor:
        if isinstance(prepared, tuple):
            return super().forward_prepared(prepared)
        return self.encoder.encode_inputs(prepared)  # (batch, dim)

    @property
    def routing_layers(self) -> range:
        return range(self.encoder.num_layers - self.router_layers, self.encoder.num_layers)

    def combine(self, sentence_state: TokenLists, condition_state: TokenLists,
                condition_index: torch.Tensor) -> torch.Tensor:
        return self.route(sentence_state, condition_state, condition_index)[0]

