"""CSR, condition-specified routing: zero new parameters (with the default scorer).

As the paper describes it: condition and sentence are encoded separately. At layer t = T − k
(``router_layers`` k, default 1) the condition's [CLS] *query* vector (that layer's query projection,
per head) scores the sentence tokens' *keys* of that layer: per-head scaled dot product, softmax over
the sentence's non-padding tokens, averaged over heads → one weight w per token. In each of the top k
layers the attention context vectors (softmax·V, heads merged) are multiplied by (1 + w) before the
output projection and the residual.

Variants: ``weighting`` ``one_plus_w`` (default) or ``w_only``; ``scorer`` ``query_key`` (default),
``hidden`` (hidden-state dot product / √H) or ``heavy`` (new trainable W_q, W_k, initialised from the
layer's own projections).

Note: the authors' released C-STS code differs from this description — it also cross-attends to the
condition tokens at every layer. We follow the paper, which keeps everything below layer t
condition-free and therefore cacheable once per text.

Works with BERT-family encoders (BERT, RoBERTa, MiniLM); anything else fails with a clear message.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from kgc.conditioning.base import Conditioner, TokenLists, register
from kgc.encoding.backbone import unique_rows
from kgc.encoding.layers import check_bert_family
from kgc.errors import KGCError


@register
class Router(Conditioner):
    name = "router"
    enters_at = "layer"
    options = ("router_layers", "weighting", "scorer")

    def __init__(self, *, router_layers: int = 1, weighting: str = "one_plus_w", scorer: str = "query_key",
                 **kwargs) -> None:
        super().__init__(**kwargs)
        backbone = self.encoder.backbone
        check_bert_family(backbone, "model.conditioner=router")
        total = self.encoder.num_layers
        if not 1 <= router_layers < total:  # at t = 0 the condition's [CLS] is the bare [CLS] embedding
            raise KGCError(f"model.router_layers={router_layers}: choose 1..{total - 1} (with {total} the condition's "
                           "[CLS] vector would be read before any layer has seen the condition)")
        if weighting not in ("one_plus_w", "w_only"):
            raise KGCError(f"model.weighting {weighting!r}: choose one_plus_w or w_only")
        if scorer not in ("query_key", "hidden", "heavy"):
            raise KGCError(f"model.scorer {scorer!r}: choose query_key, hidden or heavy")
        self.t, self.weighting, self.scorer = total - router_layers, weighting, scorer
        attn = backbone.encoder.layer[self.t].attention.self
        self.heads, self.head_dim = attn.num_attention_heads, attn.attention_head_size
        if scorer == "heavy":
            self.w_q, self.w_k = copy.deepcopy(attn.query), copy.deepcopy(attn.key)
        self._factor: torch.Tensor | None = None  # (batch, len, 1) while combine() runs the top layers
        self._hooks = [layer.attention.self.register_forward_hook(self._scale_context)
                       for layer in backbone.encoder.layer[self.t:]]

    @property
    def entry_layer(self) -> int:
        return self.t

    def _scale_context(self, module, args, output):
        """Multiply the merged-head context vectors by the routing factor, before the output projection."""
        if self._factor is None:
            return output
        return (output[0] * self._factor.to(output[0].dtype),) + tuple(output[1:])

    def _projections(self):
        attn = self.encoder.backbone.encoder.layer[self.t].attention.self
        return (self.w_q, self.w_k) if self.scorer == "heavy" else (attn.query, attn.key)

    def encode_sentences(self, sentences: TokenLists) -> tuple[torch.Tensor, torch.Tensor]:
        """(states at layer t (batch, len, K, H), attention mask (batch, len)); duplicates run once.

        K > 1 only when the pooling reads layer outputs below t (S²Sent): they are condition-free too.
        """
        batch = self.single_batch(sentences)
        sub, inverse = unique_rows(batch)
        states = self.encoder.hidden_at(sub, self.t)
        return states[inverse], sub["attention_mask"][inverse]

    def encode_conditions(self, conditions: TokenLists) -> torch.Tensor:
        """The condition's routing query: (conditions, heads, head_dim), or its [CLS] state for ``hidden``."""
        cls = self.encoder.hidden_at(self.single_batch(conditions), self.t)[:, 0, -1]  # (conditions, H)
        if self.scorer == "hidden":
            return cls
        return self._projections()[0](cls).view(len(cls), self.heads, self.head_dim)

    def weights(self, states: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """w (batch, len): softmax over the sentence's real tokens of the condition's scores, head-averaged.

        ``states`` (batch, len, K, H) as :meth:`encode_sentences` gives them; the last is the one entering t.
        """
        hidden = states[:, :, -1]  # (batch, len, H)
        b, n, h = hidden.shape
        if self.scorer == "hidden":
            scores = torch.einsum("bh,bnh->bn", query, hidden) / math.sqrt(h)  # (batch, len)
            return scores.masked_fill(mask == 0, float("-inf")).softmax(-1)
        keys = self._projections()[1](hidden).view(b, n, self.heads, self.head_dim)  # (batch, len, heads, dh)
        scores = torch.einsum("bhd,bnhd->bhn", query, keys) / math.sqrt(self.head_dim)  # (batch, heads, len)
        scores = scores.masked_fill(mask[:, None, :] == 0, float("-inf"))
        return scores.softmax(-1).mean(1)  # (batch, len)

    def combine(self, sentence_state, condition_state, condition_index):
        states, mask = sentence_state
        w = self.weights(states, mask, condition_state[condition_index])  # (batch, len)
        self._factor = ((1 + w) if self.weighting == "one_plus_w" else w).unsqueeze(-1)
        try:
            return self.encoder.run_from(states, mask, self.t)  # (batch, dim)
        finally:
            self._factor = None

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
