"""CSR, condition-specified routing: zero new parameters (with the default scorer).

As the paper describes it (``cross_attend: none``): condition and sentence are encoded separately. At
layer t = T − k (``router_layers`` k, default 1) the condition's [CLS] *query* vector scores the sentence
tokens' *keys*, a softmax turns the scores into one weight w per token, and in each of the top k layers the
tokens are weighted by (1 + w) (CSR's Eq. 1).

**Routing that depends on the condition (the defaults).** Read literally (w over every token, the factor on each
token's attention context), trained routers put ≈ 0.9 of w on [CLS] under every condition and w moved < 0.1 %
between relations (``kgc explain``'s "moved"; docs/results/routing.md, "A router that routes"). Three choices, each
needed on the synthetic "condition decides" graph (``kgc data synth-routing``), make w depend on the condition,
and a fourth keeps a w that has nothing to choose from a no-op:

* ``route_over: words`` — the softmax runs over the sentence's own tokens; its special tokens ([CLS], [SEP]) are
  masked out of it and keep factor 1. Over every token (``all``) [CLS], the pretrained attention sink, takes the
  mass. *A departure from the paper*, whose softmax covers the whole sequence;
* ``route_scales: values`` — (1 + w_j) multiplies token j's *value* vector before the attention, so every token
  (and the mean pooling over them) reads more of the routed tokens: heavy attention to what the condition
  selects. ``context`` is the paper's Eq. 1, h_t = (1 + w_t) * h'_t, token i's attention *output* × (1 + w_i);
  that output is a mixture of the *other* tokens' values, so a trained w learned to avoid the token the condition
  needs (on the synthetic graph: w on the needed token 0.15–0.37 against 0.17–0.47 under other relations). *A
  departure from Eq. 1*; ``route_scales: context`` keeps it;
* ``scorer: paper`` — the paper's q^c: the condition's [CLS] query vector of the *last* layer, full width, one
  softmax of q^c · K_l^sᵀ / √H over the sentence's words in each router layer l (a w per layer). The per-head
  ``query_key`` scorer (layer t's query, per-head softmaxes averaged) gives nearly the same query to every
  relation (w moved < 0.2 %), with or without the other two changes;
* ``weighting: centred`` — the factor is 1 + w_j − 1/n over the n tokens w covers: uniform w, or a one-word
  sentence, leaves the layer as it is (with the paper's 1 + w a one-word head has its value doubled under every
  condition; UMLS with cross-attention in 2 layers: 0.379 against 0.324 test MRR). *A departure*;
  ``one_plus_w`` keeps the paper's.

``route_temperature`` τ divides the scores (1: the paper). Saved runs from before these options route as they
were trained (``route_over: all``, ``route_scales: context``, their scorer and weighting).

The authors' released code (``utils/sts/modeling_router.py``) does more, and ``cross_attend`` covers it:

* ``top`` — in the k router layers the sentence's tokens also attend to the condition's final token
  states (keys/values over [condition tokens ; sentence tokens], the condition's padding masked). The
  condition's states are computed once per distinct condition; the sentence's states below t stay
  condition-free, so they are still cached once per text;
* ``all`` — that cross-attention in every layer, as the released code is written: nothing below is
  condition-free, so every query runs the whole encoder (results.json records the entry layer 0).

Scorers: ``paper`` (the default, above); ``query_key`` (the earlier default) — q^c read at layer t with
layer t's query projection, per-head scaled dot products with layer t's keys, per-head softmaxes averaged, one w for
every router layer; ``hidden`` (hidden-state dot product / √H), ``heavy`` (new trainable W_q, W_k initialised from
the layer's own projections) — both read once at layer t, like ``query_key``; ``learned`` (the released code's
``ScorerV1(use_condition=True)``: a fresh Linear W on the mean of the condition's token states entering layer t,
w_i = softmax_i(W c̄ · x_i / (heads·√dh)), the head-averaged per-head dot products) — and
``cls_attention`` (the released code's ``router_type`` 3): in each router layer w is the sentence
[CLS]'s row of that layer's attention probabilities on the sentence's tokens, head-averaged and
renormalised over the sentence's tokens (``renormalise: false``: not renormalised, as the released code —
the mass the [CLS] row puts on the condition's tokens is then missing from w); it needs ``cross_attend`` top
or all (otherwise w would not depend on the condition); its ``route_scales`` default is ``context``.
``weighting``: ``centred`` (default), ``one_plus_w`` (the paper's 1 + w) or ``w_only``.

Works with BERT-family encoders (BERT, RoBERTa, MiniLM); anything else fails with a clear message.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal, NamedTuple, Optional, Sequence

import torch
from pydantic import Field
from torch import nn

from kgc.conditioning.base import Conditioner, ConditionerOptions, Explained, TokenLists, register
from kgc.conditioning.routing import Route, RoutedAttention, explained, word_mask
from kgc.encoding.backbone import unique_rows_on
from kgc.encoding.layers import check_bert_family
from kgc.errors import KGCError


SCORERS = ("query_key", "paper", "hidden", "heavy", "learned", "cls_attention")


class RouterCondition(NamedTuple):
    """A condition's state, one row per distinct condition (None where the variant does not use it)."""

    query: torch.Tensor | None  # (conditions, heads, head_dim) routing query; (conditions, H) for ``hidden``,
    # ``paper`` and ``learned``
    tokens: torch.Tensor | None  # (conditions, m, H) final token states, the extra keys/values (cross_attend)
    mask: torch.Tensor | None  # (conditions, m) their padding mask


class RouterOptions(ConditionerOptions):
    """CSR's router: the condition's query scores the sentence's tokens at layer T − k; ``kgc/conditioning/router.py``
    describes each option."""
    conditioner: Literal["router"] = Field("router", description="router: CSR (the condition enters at layer T − k)")
    router_layers: Optional[int] = Field(None, ge=0, description="the condition enters at layer T - k (default 1)")
    weighting: Optional[Literal["one_plus_w", "w_only", "centred"]] = Field(
        None, description="the factor is 1 + w (CSR's Eq. 1), w alone, or 1 + w − 1/n over the n tokens w covers "
                          "(centred: the default; uniform w leaves the encoder as it is)")
    scorer: Literal["query_key", "paper", "hidden", "heavy", "learned", "cls_attention"] = Field(
        "paper", description="how the condition scores the sentence's tokens (paper: the CSR paper's equation; "
                             "learned: the released code's trained scorer; kgc/conditioning/router.py describes each)")
    cross_attend: Literal["none", "top", "all"] = Field(
        "none", description="the sentence also attends to the condition's tokens in no layer, the router layers, "
                            "or every layer (the released code; nothing cacheable)")
    renormalise: bool = Field(True, description="scorer cls_attention: w renormalised over the sentence's tokens "
                                                "(false: the released code's raw [CLS] probabilities)")
    route_over: Literal["words", "all"] = Field(
        "words", description="w is a softmax over the sentence's word tokens, its [CLS]/[SEP] masked out and left "
                             "unscaled (words), or over every token, special ones included (all: the routing of "
                             "router runs saved before this key existed, whose w sat on [CLS])")
    route_temperature: float = Field(1.0, gt=0, description="w = softmax(score / τ); τ < 1 concentrates w "
                                                            "(1: the paper)")
    route_scales: Optional[Literal["context", "values"]] = Field(
        None, description="the factor multiplies each token's value, so every token attends more to the routed "
                          "ones (values, the default), or its attention context (context: the CSR paper's Eq. 1; "
                          "the default for scorer cls_attention, which reads w off that attention)")


@register
class Router(Conditioner):
    name = "router"
    enters_at = "layer"

    @classmethod
    def plain_layers(cls, options: dict[str, Any], layers: int) -> int:
        return layers - max(1, options.get("router_layers") or 1)  # the top k layers route (default 1)
    Options = RouterOptions
    explains = "CSR's token weights (router)"

    def __init__(self, *, router_layers: int | None = 1, weighting: str | None = "centred", scorer: str = "paper",
                 cross_attend: str = "none", renormalise: bool = True, route_over: str = "words",
                 route_temperature: float = 1.0, route_scales: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        router_layers = 1 if router_layers is None else router_layers
        resolved = self.resolved_options({"weighting": weighting, "scorer": scorer, "renormalise": renormalise,
                                          "route_scales": route_scales})
        weighting, route_scales = resolved["weighting"], resolved["route_scales"]
        backbone = self.encoder.backbone
        check_bert_family(backbone, "model.conditioner=router")
        total = self.encoder.num_layers
        if not 1 <= router_layers < total:  # at t = 0 the condition's [CLS] is the bare [CLS] embedding
            raise KGCError(f"model.router_layers={router_layers}: choose 1..{total - 1} (with {total} the condition's "
                           "[CLS] vector would be read before any layer has seen the condition)")
        if weighting not in ("one_plus_w", "w_only", "centred"):
            raise KGCError(f"model.weighting {weighting!r}: choose one_plus_w, w_only or centred")
        if scorer not in SCORERS:
            raise KGCError(f"model.scorer {scorer!r}: choose {', '.join(SCORERS)}")
        if cross_attend not in ("none", "top", "all"):
            raise KGCError(f"model.cross_attend {cross_attend!r}: choose none, top or all")
        if scorer == "cls_attention" and cross_attend == "none":
            raise KGCError("model.scorer=cls_attention reads the sentence [CLS]'s own attention, which sees the "
                           "condition only through cross-attention: set model.cross_attend=top (or all)")
        if not renormalise and scorer != "cls_attention":
            raise KGCError("model.renormalise=false applies to model.scorer=cls_attention (w read off the [CLS] "
                           "row's attention); the other scorers' w is a softmax over the sentence's tokens already")
        if route_over not in ("words", "all"):
            raise KGCError(f"model.route_over {route_over!r}: choose words or all")
        if not route_temperature > 0:
            raise KGCError(f"model.route_temperature={route_temperature}: choose a positive number (1: the paper)")
        if route_temperature != 1 and scorer == "cls_attention":
            raise KGCError("model.route_temperature applies to the scorers that compute w as a softmax of scores; "
                           "scorer cls_attention reads w off the layer's own attention")
        if route_scales not in ("context", "values"):
            raise KGCError(f"model.route_scales {route_scales!r}: choose context or values")
        if route_scales == "values" and scorer == "cls_attention":
            raise KGCError("model.route_scales=values scales the values before attention, but scorer cls_attention "
                           "reads w off that attention: choose route_scales=context or another scorer")
        self.renormalise, self.route_over, self.route_temperature = renormalise, route_over, float(route_temperature)
        self.route_scales = route_scales
        self.t, self.weighting, self.scorer, self.cross_attend = total - router_layers, weighting, scorer, cross_attend
        attn = backbone.encoder.layer[self.t].attention.self
        self.heads, self.head_dim = attn.num_attention_heads, attn.attention_head_size
        if scorer == "heavy":
            self.w_q, self.w_k = copy.deepcopy(attn.query), copy.deepcopy(attn.key)
        if scorer == "learned":  # the released code's ScorerV1(use_condition=True): W on the condition, a fresh Linear
            width = self.encoder.dim
            self.w_route = nn.Linear(width, width)
        self.routing = RoutedAttention(backbone, range(self.entry_layer, total))

    @property
    def router_layers(self) -> int:
        """k: the top k layers route (``t`` = T − k is the layer whose input the condition's query reads)."""
        return self.encoder.num_layers - self.t

    @property
    def entry_layer(self) -> int:
        return 0 if self.cross_attend == "all" else self.t

    @classmethod
    def resolved_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Unset ``route_scales``: values (context for ``cls_attention``, which reads w off the attention the values
        feed); unset ``weighting``: centred (one_plus_w for ``cls_attention`` unrenormalised: that w sums to < 1)."""
        out = dict(options)
        cls_attention = out.get("scorer", "paper") == "cls_attention"
        if out.get("route_scales") is None:
            out["route_scales"] = "context" if cls_attention else "values"
        if out.get("weighting") is None:
            out["weighting"] = "one_plus_w" if cls_attention and not out.get("renormalise", True) else "centred"
        return out

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        cross = options.get("cross_attend", "none")
        tau = float(options.get("route_temperature", 1.0))
        return (f"{cls.name} (k={options.get('router_layers') or 1}, {options.get('scorer', 'paper')}, "
                f"{options.get('weighting') or 'centred'}" + (f", cross-attends {cross}" if cross != "none" else "")
                + ("" if options.get("renormalise", True) else ", w not renormalised")
                + (", w over all tokens" if options.get("route_over", "words") == "all" else "")
                + (", scales context" if options.get("route_scales") == "context" else "")
                + (f", τ={tau:g}" if tau != 1 else "") + ")")

    def export_spec(self) -> dict[str, Any]:
        return {"reproducible_outside_kgc": False,
                "query": "CSR routing rescales attention context vectors inside the top router_layers layers of the "
                         "query tower (kgc.conditioning.router; the heavy scorer's w_q / w_k and the learned scorer's "
                         "w_route are in conditioner.safetensors); the exported encoder holds the weights but a stock transformer "
                         "does not route. Use kgc for queries.",
                "options": {"router_layers": self.router_layers, "weighting": self.weighting, "scorer": self.scorer,
                            "cross_attend": self.cross_attend, "renormalise": self.renormalise,
                            "route_over": self.route_over, "route_temperature": self.route_temperature,
                            "route_scales": self.route_scales}}

    @property
    def explain_kind(self) -> str | None:
        return "tokens"

    @torch.no_grad()
    def explain(self, conditions: TokenLists, sentence: Sequence[int] | None = None) -> Explained:
        """w of each token of ``[CLS] sentence [SEP]`` under each condition, averaged over the router layers."""
        if sentence is None:
            raise KGCError("kgc explain: give a sentence (an entity's text): the router weighs its tokens")
        n = len(conditions)
        index = torch.arange(n, device=self.device)
        _, route = self.route(self.encode_sentences([sentence] * n), self.encode_conditions(conditions), index)
        ids = self.special.wrap(sentence, self.max_tokens)[0]
        return explained(route, torch.arange(n), len(ids), ids)

    def _projections(self):
        attn = self.encoder.backbone.encoder.layer[self.t].attention.self
        return (self.w_q, self.w_k) if self.scorer == "heavy" else (attn.query, attn.key)

    def encode_sentences(self, sentences: TokenLists) -> tuple[torch.Tensor, torch.Tensor]:
        """(states entering the entry layer (batch, len, K, H), attention mask (batch, len)); duplicates run once.

        K > 1 only when the pooling reads layer outputs below t (S²Sent): they are condition-free too.
        """
        sub, inverse = unique_rows_on(self.padded(sentences), self.device)  # found on the CPU; distinct rows travel
        states = self.encoder.hidden_at(sub, self.entry_layer)
        return states[inverse], sub["attention_mask"][inverse]

    def encode_conditions(self, conditions: TokenLists) -> RouterCondition:
        """The routing query read at layer t, and (cross_attend) the condition's final token states."""
        batch = self.single_batch(conditions)
        states = self.encoder.hidden_at(batch, self.t)  # (conditions, len, K, H)
        query = None
        if self.scorer == "paper":  # the [CLS] query vector in the last layer: the states entering it, projected
            last = self.encoder.num_layers - 1
            entering = self.encoder.advance(states, batch["attention_mask"], self.t, last) if last > self.t else states
            query = self.encoder.backbone.encoder.layer[last].attention.self.query(entering[:, 0, -1])  # (conds, H)
        elif self.scorer == "learned":  # W applied to the mean of the condition's token states entering layer t
            m = batch["attention_mask"].unsqueeze(-1).to(states.dtype)  # (conditions, len, 1)
            query = self.w_route((states[:, :, -1] * m).sum(1) / m.sum(1).clamp_min(1))  # (conditions, H)
        elif self.scorer != "cls_attention":
            cls = states[:, 0, -1]  # (conditions, H)
            query = cls if self.scorer == "hidden" else \
                self._projections()[0](cls).view(len(cls), self.heads, self.head_dim)
        if self.cross_attend == "none":
            return RouterCondition(query, None, None)
        mask = batch["attention_mask"]
        tokens = self.encoder.advance(states, mask, self.t, self.encoder.num_layers)[:, :, -1]  # (conditions, m, H)
        return RouterCondition(query, tokens, mask)

    def weights(self, states: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """w (batch, len): softmax over the tokens ``mask`` marks (the sentence's words, or all its real tokens) of
        the condition's scores / τ, head-averaged.

        ``states`` (batch, len, K, H) as they enter layer t; the last of K is the one entering t.
        """
        hidden = states[:, :, -1]  # (batch, len, H)
        b, n, h = hidden.shape
        if self.scorer in ("hidden", "learned"):  # learned: ScorerV1's head-averaged q_h·x_h / √dh = q·x / (heads √dh)
            scale = math.sqrt(h) if self.scorer == "hidden" else self.heads * math.sqrt(self.head_dim)
            scores = torch.einsum("bh,bnh->bn", query, hidden) / scale  # (batch, len)
            return (scores / self.route_temperature).masked_fill(mask == 0, float("-inf")).softmax(-1)
        keys = self._projections()[1](hidden).view(b, n, self.heads, self.head_dim)  # (batch, len, heads, dh)
        scores = torch.einsum("bhd,bnhd->bhn", query, keys) / math.sqrt(self.head_dim)  # (batch, heads, len)
        scores = (scores / self.route_temperature).masked_fill(mask[:, None, :] == 0, float("-inf"))
        return scores.softmax(-1).mean(1)  # (batch, len)

    def paper_weights(self, layer: int, hidden: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """w_l (batch, len) of router layer ``layer``: softmax over the tokens ``mask`` marks of q^c · K_lᵀ / √H (/ τ),
        K_l = layer l's key projection of ``hidden`` (batch, len, H), the states entering it; ``query`` (batch, H)."""
        keys = self.encoder.backbone.encoder.layer[layer].attention.self.key(hidden)  # (batch, len, H)
        scores = torch.einsum("bh,bnh->bn", query.to(keys.dtype), keys) / (math.sqrt(keys.shape[-1])
                                                                            * self.route_temperature)
        return scores.masked_fill(mask == 0, float("-inf")).softmax(-1)  # (batch, len)

    def route(self, sentence_state, condition_state: RouterCondition, condition_index) -> tuple[torch.Tensor, Route]:
        """(batch, dim) embeddings and the :class:`Route` they were computed under (its ``seen`` holds w per layer)."""
        states, mask = sentence_state
        cond = RouterCondition(*(None if x is None else x[condition_index] for x in condition_state))
        total = self.encoder.num_layers
        cols, unscaled = self.routed_tokens(mask)
        per_layer = None
        if self.scorer == "cls_attention":
            score, rows = None, torch.zeros_like(mask)
            rows[:, 0] = 1  # the sentence's [CLS]
        elif self.scorer == "paper":  # each router layer scores its own input with its own keys
            score, rows = None, None
            per_layer = lambda layer, hidden: self.paper_weights(layer, hidden, cols, cond.query)  # noqa: E731
        else:  # w from the states entering layer t, read when the pass gets there (with ``all`` they saw the condition)
            score, rows = (lambda hidden: self.weights(hidden.unsqueeze(2), cols, cond.query)), None
        cross = frozenset(range(self.entry_layer, total)) if self.cross_attend != "none" else frozenset()
        r = Route(mask=mask, scale_layers=frozenset(range(self.t, total)), score=score, score_layer=per_layer,
                  score_rows=rows, score_cols=cols, weighting=self.weighting, unscaled=unscaled, scales=self.route_scales,
                  renormalise=self.renormalise, cond_states=cond.tokens, cond_mask=cond.mask, cross_layers=cross)
        with self.routing.route(r):
            return self.encoder.run_from(states, mask, self.entry_layer), r  # (batch, dim)

    def routed_tokens(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the tokens w is a softmax over (batch, len), the tokens left unscaled or None): with ``route_over: words``
        the sentence's own tokens, its special tokens ([CLS], [SEP]) kept out of w and their context as it is."""
        if self.route_over == "all":
            return mask, None
        prefix, suffix = (len(part) for part in self.special.single)
        words = word_mask(mask, prefix, suffix)
        return words, mask - words

    def combine(self, sentence_state, condition_state, condition_index):
        return self.route(sentence_state, condition_state, condition_index)[0]

    # evaluation tables: states of every entity (padded to one width, kept in fp16), gathered per chunk
    def take(self, state, index):
        hidden, mask = state
        index = index.to(hidden.device)
        m = mask[index]
        width = int(m.sum(1).max())
        return hidden[index, :width].to(self.device, torch.float32), m[:, :width].to(self.device)

    def cat_states(self, states):
        width = max(h.shape[1] for h, _ in states)
        pad = lambda x, fill: nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, width - x.shape[1]),  # noqa: E731
                                                 value=fill)
        return (torch.cat([pad(h.half().cpu(), 0.0) for h, _ in states]),
                torch.cat([pad(m.cpu(), 0) for _, m in states]))
