"""Routed self-attention: what CSR does inside a BERT layer's attention, for the router and the bi-encoder.

CSR changes a layer's self-attention in up to three ways, each optional per layer:

* **extra keys and values** (``cross_layers``) — the sentence's tokens also attend to the condition's
  token states: keys and values over ``[condition tokens ; sentence tokens]``, the condition's padding
  masked (the authors' released code: ``torch.cat([condition, hidden_states])`` before the key/value
  projections);
* **a factor on the context vectors** (``scale_layers``) — CSR's Eq. 1: softmax·V of token i times
  (1 + w_i) (or w_i), before the output projection and the residual;
* **w** — fixed for every scaled layer (``weights``, or ``score`` applied to the states entering the
  first scaled layer: the router's query–key scorer), or read off each layer's own attention
  (``score_rows``/``score_cols``) — the head-averaged attention probabilities of the query rows ``score_rows`` (the sentence's
  [CLS]: the released code's ``router_type`` 3; the condition's tokens inside the bi-encoder) on the
  keys ``score_cols`` (the sentence's tokens), averaged over those rows and renormalised to sum to 1
  over the sentence's tokens.

The layers keep their weights and state-dict names: :class:`RoutedAttention` replaces ``forward`` of the
chosen ``attention.self`` modules by one that reads the :class:`Route` set for one pass (``with
routing.route(...)``) and is the plain attention outside it (the tail tower, the condition's own pass).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Route:
    """What the routed layers do during one pass; row-aligned with the batch that pass encodes."""

    mask: torch.Tensor  # (batch, len) 1 for the sequence's real tokens
    scale_layers: frozenset[int] = frozenset()  # layers whose context vectors are multiplied by the factor
    cross_layers: frozenset[int] = frozenset()  # layers whose keys/values also cover the condition's tokens
    cond_states: torch.Tensor | None = None  # (batch, m, H) the condition's token states
    cond_mask: torch.Tensor | None = None  # (batch, m)
    weights: torch.Tensor | None = None  # (batch, len) a fixed w for every scaled layer
    score: Callable[[torch.Tensor], torch.Tensor] | None = None  # states entering the first scaled layer → w
    score_rows: torch.Tensor | None = None  # (batch, len) query rows whose attention gives w
    score_cols: torch.Tensor | None = None  # (batch, len) keys w is spread over (the sentence's tokens)
    weighting: str = "one_plus_w"
    order: torch.Tensor | None = None  # batch row → row of this route where the pass ran distinct rows only
    seen: dict[int, torch.Tensor] = field(default_factory=dict)  # layer → the w it used (detached), for explain


def weights_from_attention(probs: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """w (batch, len) from attention probabilities ``probs`` (batch, heads, len, len) over the sequence's keys:
    head-averaged, averaged over the query ``rows``, restricted to the key ``cols`` and renormalised there."""
    a = probs.mean(1)  # (batch, len, len)
    r = rows.to(a.dtype)
    r = r / r.sum(1, keepdim=True).clamp_min(1)
    w = torch.einsum("bq,bqk->bk", r, a) * cols.to(a.dtype)  # (batch, len)
    return w / w.sum(1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)


class RoutedAttention:
    """Takes over ``forward`` of ``backbone.encoder.layer[i].attention.self`` for each i in ``layers``."""

    def __init__(self, backbone: nn.Module, layers) -> None:
        self.current: Route | None = None
        for i in layers:
            module = backbone.encoder.layer[i].attention.self
            module.forward = functools.partial(self._forward, module, i, module.forward)

    @contextlib.contextmanager
    def route(self, route: Route):
        self.current = route
        try:
            yield route
        finally:
            self.current = None

    def _forward(self, module, layer: int, plain, hidden_states, attention_mask=None, **kwargs):
        r = self.current
        if r is None or (layer not in r.scale_layers and layer not in r.cross_layers):
            return plain(hidden_states, attention_mask=attention_mask, **kwargs)
        b, n, _ = hidden_states.shape
        split = lambda x: x.view(x.shape[0], x.shape[1], module.num_attention_heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = (split(p(hidden_states)) for p in (module.query, module.key, module.value))  # (b, heads, n, dh)
        keep = r.mask.to(hidden_states.device)
        m = 0
        if layer in r.cross_layers and r.cond_states is not None:
            c = r.cond_states.to(hidden_states.dtype)  # (b, m, H)
            m = c.shape[1]
            k = torch.cat([split(module.key(c)), k], 2)  # (b, heads, m + n, dh)
            v = torch.cat([split(module.value(c)), v], 2)
            keep = torch.cat([r.cond_mask.to(keep), keep], 1)
        scores = q @ k.transpose(-1, -2) * module.scaling  # (b, heads, n, m + n)
        scores = scores.masked_fill(keep[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1)
        context = F.dropout(probs, module.dropout.p, module.training) @ v  # (b, heads, n, dh)
        context = context.transpose(1, 2).reshape(b, n, -1)  # (b, n, H)
        if layer in r.scale_layers:
            if r.weights is None and r.score is not None:  # the first scaled layer scores its input once
                r.weights = r.score(hidden_states)
            w = r.weights if r.weights is not None else weights_from_attention(probs[..., m:], r.score_rows,
                                                                               r.score_cols)
            r.seen[layer] = w.detach()
            factor = (1 + w) if r.weighting == "one_plus_w" else w
            context = context * factor.unsqueeze(-1).to(context.dtype)
        return context, probs
