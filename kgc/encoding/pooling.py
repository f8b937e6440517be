"""Pooling: the token states of the last block(s) → one sentence vector ``(batch, H)``.

Every pooling reads a stack of the encoder's last ``blocks`` layer outputs, ``states`` of shape
``(batch, len, blocks, H)`` (oldest block first, the final layer last), and a ``mask`` ``(batch, len)``
of the tokens to pool (the attention mask, or a sub-span such as CASE's condition tokens).

* ``mean`` — the average of the final layer's states over the masked tokens;
* ``cls`` — the final layer's first token;
* ``s2sent`` — S²Sent's cross-layer fusion (Zang et al. 2025): the last n blocks are squeezed with the
  lowest m 2-D DCT basis functions over (block, token), one basis per group of D/m features; the
  squeezed vector z (D) is excited, s = ReLU(W1 z) (D → D/r), and each block gets a gate
  g_b = σ(W2⁽ᵇ⁾ s) (D); a softmax over the blocks, per feature, gives α_b; the fused token states
  Σ_b α_b ⊙ X_b are mean-pooled over the masked tokens.

The DCT basis is B_{u,v}(b, l) = c_u cos(π u (b + ½) / n) · c_v cos(π v (l + ½) / L), with c_0 = 1,
c_f = √2 otherwise, and the squeeze is the *mean* over the n × L grid of X · B, so the (0, 0) component
is exactly the average of the states (m = 1 is average pooling of every block) whatever the sentence
length L (the number of masked tokens of that sentence; padding never enters). Frequencies are taken
in the released code's zig-zag "low" order, keeping those with u < n.

Where this follows the issue's (paper's) description rather than the released code
(github.com/hggzjx/S2Sent ``simcse/layers2.py``): the released code stacks the n blocks *before* the
final layer, resizes (block, token) to 6 × 6 by adaptive average pooling, excites with Tanh and a
BatchNorm before each sigmoid, and normalises the gates with one softmax over blocks, batch and
features together; here the last n blocks are stacked, the DCT runs on the real (block, token) grid,
and the softmax is over blocks per feature, as described.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from kgc.errors import KGCError

# the released code's zig-zag order of low 2-D frequencies (u: block axis, v: token axis)
ZIGZAG_U = [0, 0, 1, 1, 0, 2, 2, 1, 2, 0, 3, 4, 0, 1, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
ZIGZAG_V = [0, 1, 0, 1, 2, 0, 1, 2, 2, 3, 0, 0, 4, 3, 1, 5, 4, 3, 2, 1, 0, 6, 5, 4, 3, 2, 1, 0, 6, 5, 4, 3]


class Pooling(nn.Module):
    """Base: ``forward(states (batch, len, blocks, H), mask (batch, len)) -> (batch, H)``."""

    name: ClassVar[str]

    @property
    def blocks(self) -> int:
        """How many of the last layer outputs this pooling reads."""
        return 1


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``hidden`` (batch, len, H), ``mask`` (batch, len) → (batch, H): the mean over masked tokens."""
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (batch, len, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class MeanPooling(Pooling):
    name = "mean"

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(states[:, :, -1], mask)


class ClsPooling(Pooling):
    name = "cls"

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return states[:, 0, -1]


class S2SentPooling(Pooling):
    name = "s2sent"

    def __init__(self, dim: int, *, blocks: int = 3, frequencies: int = 4, reduction: int = 12) -> None:
        super().__init__()
        if blocks < 1:
            raise KGCError(f"model.s2sent_blocks={blocks}: choose at least 1")
        freqs = [(u, v) for u, v in zip(ZIGZAG_U, ZIGZAG_V) if u < blocks]
        if not 1 <= frequencies <= len(freqs):
            raise KGCError(f"model.s2sent_frequencies={frequencies}: choose 1..{len(freqs)} with {blocks} blocks")
        if dim % frequencies:
            raise KGCError(f"model.s2sent_frequencies={frequencies} must divide the hidden size {dim} "
                           "(each frequency squeezes one equal group of features)")
        if not 1 <= reduction <= dim:
            raise KGCError(f"model.s2sent_reduction={reduction}: choose 1..{dim}")
        self.n, self.freqs = blocks, freqs[:frequencies]
        self.excite = nn.Linear(dim, max(1, dim // reduction))  # W1: D → D/r
        self.gates = nn.ModuleList(nn.Linear(max(1, dim // reduction), dim) for _ in range(blocks))  # W2⁽ᵇ⁾

    @property
    def blocks(self) -> int:
        return self.n

    def basis(self, mask: torch.Tensor) -> torch.Tensor:
        """(batch, len, blocks, m): each frequency's 2-D DCT basis on every sentence's own (block, token) grid."""
        mask = mask.to(torch.float32)
        length = mask.sum(1, keepdim=True).clamp(min=1)  # (batch, 1)
        pos = (mask.cumsum(1) - 1).clamp(min=0)  # (batch, len): token index among the pooled tokens
        b = torch.arange(self.n, device=mask.device, dtype=torch.float32)
        out = []
        for u, v in self.freqs:
            bu = torch.cos(math.pi * u * (b + 0.5) / self.n) * (1.0 if u == 0 else math.sqrt(2))  # (blocks,)
            bv = torch.cos(math.pi * v * (pos + 0.5) / length) * (1.0 if v == 0 else math.sqrt(2))  # (batch, len)
            out.append((bv * mask)[:, :, None] * bu[None, None, :])  # (batch, len, blocks)
        return torch.stack(out, -1)

    def squeeze(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """z (batch, H): feature group g takes frequency g, averaged over the (block, token) grid."""
        bsz, _, n, h = states.shape
        groups = len(self.freqs)
        basis = self.basis(mask).to(states.dtype)  # (batch, len, n, m)
        weight = basis.repeat_interleave(h // groups, dim=-1)  # (batch, len, n, H): group g ← frequency g
        count = (mask.sum(1).to(states.dtype) * n).clamp(min=1).unsqueeze(-1)  # (batch, 1)
        return (states * weight).sum((1, 2)) / count

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = states[:, :, -self.n:]  # (batch, len, n, H)
        z = self.squeeze(x, mask)  # (batch, H)
        s = torch.relu(self.excite(z))  # (batch, H/r)
        g = torch.stack([torch.sigmoid(w2(s)) for w2 in self.gates], 1)  # (batch, n, H)
        alpha = g.softmax(1)  # over blocks, per feature
        fused = (x * alpha[:, None]).sum(2)  # (batch, len, H)
        return masked_mean(fused, mask)


POOLINGS = {"mean": MeanPooling, "cls": ClsPooling, "s2sent": S2SentPooling}


def build_pooling(name: str, dim: int, num_layers: int, *, s2sent_blocks: int = 3, s2sent_frequencies: int = 4,
                  s2sent_reduction: int = 12) -> Pooling:
    if name not in POOLINGS:
        raise KGCError(f"model.pooling {name!r}: choose {', '.join(POOLINGS)}")
    if name != "s2sent":
        return POOLINGS[name]()
    if s2sent_blocks > num_layers:
        raise KGCError(f"model.s2sent_blocks={s2sent_blocks}: the backbone has only {num_layers} layers")
    return S2SentPooling(dim, blocks=s2sent_blocks, frequencies=s2sent_frequencies, reduction=s2sent_reduction)
