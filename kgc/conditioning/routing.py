"""Routed self-attention: what CSR does inside a BERT layer's attention, for the router and the bi-encoder.

CSR changes a layer's self-attention in up to three ways, each optional per layer:

* **extra keys and values** (``cross_layers``) — the sentence's tokens also attend to the condition's
  token states: keys and values over ``[condition tokens ; sentence tokens]``, the condition's padding
  masked (the authors' released code: ``torch.cat([condition, hidden_states])`` before the key/value
  projections);
* **a factor** (``scale_layers``) — CSR's Eq. 1: softmax·V of token i times (1 + w_i) (or w_i), before the
  output projection and the residual (``scales="context"``); or token j's value vector times (1 + w_j) before the
  attention, so every token reads more of the routed ones (``scales="values"``, the router's default); tokens in
  ``unscaled`` (special tokens w does not cover) keep factor 1;
* **w** — fixed for every scaled layer (``weights``, or ``score`` applied to the states entering the
  first scaled layer: the router's query–key scorer), or read off each layer's own attention
  (``score_rows``/``score_cols``) — the head-averaged attention probabilities of the query rows ``score_rows``
  (the sentence's [CLS]: the released code's ``router_type`` 3; the condition's tokens inside the bi-encoder) on the
  keys ``score_cols`` (the sentence's tokens), averaged over those rows and renormalised to sum to 1
  over the sentence's tokens.

:class:`RoutedAttention` installs a :class:`RoutedSelfAttention` in place of each chosen
``encoder.layer[i].attention.self``. The substitute is a subclass of the module's own class (BERT's, RoBERTa's, …)
made once per class, built around the *same* query/key/value/dropout modules, so

* the state-dict keys stay ``encoder.layer.N.attention.self.query.weight`` … (old checkpoints load);
* it is still an instance of the original class, so Hugging Face's output recording
  (``output_attentions=True`` hooks on ``BertSelfAttention``) and ``set_attn_implementation`` see it;
* outside a routed pass (``with routing.route(...)``: the tail tower, the condition's own pass) it runs the
  original class's ``forward`` unchanged, so unrouted outputs are bit-identical to the plain model;
* ``copy.deepcopy`` and ``.to()`` / ``.train()`` work as for any module (no bound methods stored on it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Sequence

import torch
from torch import nn

from kgc.conditioning.base import Explained
from kgc.encoding.dropout import dropout


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
    score_layer: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # (layer, states entering it) → its w
    score_rows: torch.Tensor | None = None  # (batch, len) query rows whose attention gives w
    score_cols: torch.Tensor | None = None  # (batch, len) keys w is spread over (the sentence's tokens)
    weighting: str = "one_plus_w"
    scales: str = "context"  # what the factor multiplies: token i's attention context (CSR's Eq. 1) or its value
    unscaled: torch.Tensor | None = None  # (batch, len) 1 where the factor stays 1 (special tokens w does not cover)
    renormalise: bool = True  # w read off attention (score_rows/cols) sums to 1 over the sentence's tokens
    order: torch.Tensor | None = None  # batch row → row of this route where the pass ran distinct rows only
    seen: dict[int, torch.Tensor] = field(default_factory=dict)  # layer → the w it used (detached), for explain


def weights_from_attention(probs: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, *,
                           renormalise: bool = True) -> torch.Tensor:
    """w (batch, len) from attention probabilities ``probs`` (batch, heads, len, len) over the sequence's keys:
    head-averaged, averaged over the query ``rows``, restricted to the key ``cols`` and (``renormalise``)
    renormalised there; without it, the raw probabilities (the rest of the mass went to other keys)."""
    a = probs.mean(1)  # (batch, len, len)
    r = rows.to(a.dtype)
    r = r / r.sum(1, keepdim=True).clamp_min(1)
    w = torch.einsum("bq,bqk->bk", r, a) * cols.to(a.dtype)  # (batch, len)
    return w / w.sum(1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny) if renormalise else w


def word_mask(mask: torch.Tensor, prefix: int, suffix: int) -> torch.Tensor:
    """(batch, len) 1 on a sentence's own tokens: the real tokens of ``mask`` (right-padded) less the tokenizer's
    ``prefix`` special tokens before the sentence and ``suffix`` after it ([CLS] and [SEP] for BERT). A row with no
    token left keeps its real tokens, so a softmax over it is defined."""
    pos = torch.arange(mask.shape[1], device=mask.device)
    ends = mask.sum(1, keepdim=True) - suffix  # (batch, 1) the first suffix position
    words = mask * ((pos[None, :] >= prefix) & (pos[None, :] < ends)).to(mask.dtype)
    return torch.where(words.sum(1, keepdim=True) > 0, words, mask)


def explained(route: Route, rows: torch.Tensor, width: int, token_ids: Sequence[int]) -> Explained:
    """``kgc explain``'s numbers from the w a routed pass used (``route.seen``): averaged over the layers, the
    route's ``rows`` in condition order, the first ``width`` positions (``token_ids``), rows renormalised to 1."""
    layers = sorted(route.seen)
    w = torch.stack([route.seen[i] for i in layers]).mean(0).float().cpu()[rows][:, :width]  # (conditions, tokens)
    w = w / w.sum(1, keepdim=True).clamp_min(1e-12)
    return Explained("tokens", w, tuple(int(i) for i in token_ids), tuple(layers))


class RoutedSelfAttention(nn.Module):
    """Mixin for a BERT-family self-attention module that routes when a :class:`Route` is active.

    Never built directly: :meth:`substitute` makes a ``Routed<Class>`` subclass of the module's own class (once
    per class, so ``isinstance(m, BertSelfAttention)`` stays true for Hugging Face's hooks) and an instance of it
    that shares the original's submodules, parameters, hooks and config.
    """

    layer: int  # this module's layer index
    switches: list["RoutedAttention"]  # every router installed here (conditioners built on one encoder share it)
    original: ClassVar[type]  # the class this one routes (set on each Routed<Class>)

    _classes: ClassVar[dict[type, type]] = {}  # original class → its routed subclass

    @classmethod
    def routed_class(cls, original: type) -> type:
        """``Routed<Class>``: this mixin over ``original``, made once per class."""
        if original not in cls._classes:
            cls._classes[original] = type(f"Routed{original.__name__}", (RoutedSelfAttention, original),
                                          {"__module__": __name__, "original": original})
        return cls._classes[original]

    @classmethod
    def substitute(cls, module: nn.Module, layer: int, switch: "RoutedAttention") -> "RoutedSelfAttention":
        """A routed copy of ``module`` (its submodules and parameters are shared, not copied); a module that
        already routes just listens to one more switch."""
        if isinstance(module, RoutedSelfAttention):
            module.switches.append(switch)
            return module
        routed = _bare(type(module))
        # the original's state, with its own containers (parameters, submodules, hooks) copied one level
        routed.__dict__.update({k: v.copy() if isinstance(v, (dict, set)) else v for k, v in vars(module).items()})
        routed.layer, routed.switches = layer, [switch]
        return routed

    def __reduce_ex__(self, protocol):
        # pickle cannot name a class made at run time: name the original class and rebuild the routed one from it
        return _bare, (self.original,), self.__dict__

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any):
        r = next((s.current for s in self.switches if s.current is not None), None)
        if r is None or (self.layer not in r.scale_layers and self.layer not in r.cross_layers):
            return super().forward(hidden_states, attention_mask=attention_mask, **kwargs)  # the original class's
        return self._routed(r, hidden_states)

    def _routed(self, r: Route, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(context (b, n, H), attention probabilities (b, heads, n, m + n)) under the route ``r``."""
        b, n, _ = hidden_states.shape
        split = lambda x: x.view(x.shape[0], x.shape[1], self.num_attention_heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = (split(p(hidden_states)) for p in (self.query, self.key, self.value))  # (b, heads, n, dh)
        keep = r.mask.to(hidden_states.device)
        m = 0
        if self.layer in r.cross_layers and r.cond_states is not None:
            c = r.cond_states.to(hidden_states.dtype)  # (b, m, H)
            m = c.shape[1]
            k = torch.cat([split(self.key(c)), k], 2)  # (b, heads, m + n, dh)
            v = torch.cat([split(self.value(c)), v], 2)
            keep = torch.cat([r.cond_mask.to(keep), keep], 1)
        scaled = self.layer in r.scale_layers
        factor = self._factor(r, hidden_states) if scaled and r.scales == "values" else None
        if factor is not None:  # every position reads the routed tokens' values × (1 + w): heavier attention to them
            vs = v[:, :, m:]  # (b, heads, n, dh); + vs·(factor − 1): bf16 would round a factor near 1 to 1
            v = torch.cat([v[:, :, :m], vs + vs * (factor - 1)[:, None, :, None].to(v.dtype)], 2)
        scores = q @ k.transpose(-1, -2) * self.scaling  # (b, heads, n, m + n)
        scores = scores.masked_fill(keep[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1)
        context = dropout(probs, self.dropout.p, self.training) @ v  # (b, heads, n, dh)
        context = context.transpose(1, 2).reshape(b, n, -1)  # (b, n, H)
        if scaled and r.scales == "context":  # CSR's Eq. 1: token i's context × (1 + w_i)
            factor = self._factor(r, hidden_states, probs[..., m:])
            context = context + context * (factor - 1).unsqueeze(-1).to(context.dtype)
        return context, probs

    def _factor(self, r: Route, hidden_states: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        """(b, n) the factor of each sentence token in this layer: 1 + w (or w), 1 where ``r.unscaled``; w as the
        route says (fixed, scored from the states entering the first scaled layer, scored per layer, or read off
        this layer's attention ``probs`` over the sentence's keys); recorded in ``r.seen`` for ``kgc explain``."""
        if r.score_layer is not None:  # every scaled layer scores its own input (the CSR paper's w_t)
            w = r.score_layer(self.layer, hidden_states)
        else:
            if r.weights is None and r.score is not None:  # the first scaled layer scores its input once
                r.weights = r.score(hidden_states)
            w = r.weights if r.weights is not None else weights_from_attention(probs, r.score_rows, r.score_cols,
                                                                               renormalise=r.renormalise)
        r.seen[self.layer] = w.detach()
        if r.weighting == "one_plus_w":
            factor = 1 + w
        elif r.weighting == "centred":  # 1 + w − 1/n over the n tokens w covers: uniform w (or one token) is a no-op
            cols = (r.score_cols if r.score_cols is not None else r.mask).to(w.device, w.dtype)
            n = cols.sum(1, keepdim=True).clamp_min(1)
            factor = (1 + w - 1 / n) * cols + (1 - cols)
        else:
            factor = w
        if r.unscaled is not None:  # tokens outside w's softmax keep their context as it is
            factor = torch.where(r.unscaled.to(factor.device) > 0, torch.ones_like(factor), factor)
        return factor


def _bare(original: type) -> RoutedSelfAttention:
    """An empty ``Routed<original>`` whose state is filled in next (by :meth:`RoutedSelfAttention.substitute`,
    pickle or deepcopy)."""
    cls = RoutedSelfAttention.routed_class(original)
    return cls.__new__(cls)


class RoutedAttention:
    """The switch of one conditioner: installs :class:`RoutedSelfAttention` at ``backbone.encoder.layer[i]
    .attention.self`` for each i in ``layers`` and holds the :class:`Route` of the current pass.

    Not a module on purpose: the routed layers belong to the backbone (their weights are saved once, under the
    backbone's names), this only says when they route.
    """

    def __init__(self, backbone: nn.Module, layers: Iterable[int]) -> None:
        self.current: Route | None = None
        for i in layers:
            attention = backbone.encoder.layer[i].attention
            attention.self = RoutedSelfAttention.substitute(attention.self, i, self)

    @contextlib.contextmanager
    def route(self, route: Route):
        self.current = route
        try:
            yield route
        finally:
            self.current = None
