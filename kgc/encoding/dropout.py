"""Dropout in a bf16 step on a CPU: keep-masks from bulk random bits instead of ``bernoulli_``.

Why: with the matrix products on a CPU's bf16 matrix units (AMX), torch's CPU dropout became the largest cost of a
bf16 training step (docs/results/cpu.md: ``aten::bernoulli_`` 20 % of the quickstart's bf16 step, ~5 ns a value
whatever the dtype). Here one 64-bit draw gives four 16-bit lanes, and a lane keeps its value when it is at least
the threshold ``round(p · 65536)`` (counted from the lanes' minimum): the keep probability is exactly
``1 − round(p · 65536) / 65536`` (p = 0.1: 0.0999939 dropped instead of 0.1, 6 · 10⁻⁶ apart), and kept values are
scaled by its inverse, so the expected output equals the input exactly, as with torch's dropout. The lanes come
from torch's own generator (``Tensor.random_`` over the full int64 range), so ``torch.manual_seed`` makes a run
repeatable as before; the masks differ from ``bernoulli_``'s, which is why only a bf16 CPU step uses them.

Where: :func:`install` puts :class:`BitsDropout` (an ``nn.Dropout``, same ``p``, same state-dict: none) in place of
every dropout module of a Hugging Face encoder, and :func:`attention` in place of its SDPA attention (registered
as ``kgc_sdpa`` with transformers' ``AttentionInterface``) for attention-probability dropout. Both do exactly what
they replace — ``F.dropout``, transformers' ``sdpa_attention_forward`` — except inside a CPU autocast in bf16 while
training (a bf16 CPU step, :mod:`kgc.encoding.precision`). So fp32 steps, evaluation, inference and every GPU run
are bit for bit what they were (the saved runs' digests hold), and a bf16 CPU step draws its masks here.
Attention dropout in that step runs SDPA's own math-kernel arithmetic — scores, mask, softmax, dropout, product
with the values — written out, because SDPA draws its mask inside (its CPU kernels with dropout use that path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

STREAM = "_kgc_bf16_stream"  # set on every module of a backbone by kgc.encoding.stream.enable (train.bf16_stream)
LEVELS = 1 << 16  # a lane's values; the keep probability is a multiple of 1/LEVELS
NAME = "kgc_sdpa"  # the attention implementation :func:`install` registers
_SDPA: list = []  # transformers' sdpa_attention_forward, bound at first use (no transformers import at kgc's)


def _sdpa():
    if not _SDPA:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _SDPA.append(sdpa_attention_forward)
    return _SDPA[0]


def in_bf16_cpu_step(x: torch.Tensor) -> bool:
    """Whether ``x`` is computed in a bf16 CPU step: on the CPU, inside a CPU autocast to bf16."""
    return (x.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu"
              ) -> tuple[torch.Tensor, float]:
    """A boolean keep-mask of ``shape`` (each value kept with probability ``1 − round(p·65536)/65536``) and the
    scale of kept values (that probability's inverse): four 16-bit lanes of each 64-bit draw of torch's generator."""
    n = 1
    for size in shape:
        n *= int(size)
    drop = round(p * LEVELS)
    words = torch.empty(-(-n // 4), dtype=torch.int64, device=device).random_(-(2 ** 63), 2 ** 63 - 1)
    lanes = words.view(torch.int16)[:n].view(shape)
    return lanes >= drop - LEVELS // 2, LEVELS / (LEVELS - drop)


class _Masked(torch.autograd.Function):
    """``x · keep · scale``; the gradient is ``g · keep · scale`` (the boolean mask is what is saved: 1 byte a
    value). The scale multiplies in the tensor's own arithmetic, a Python float against each value, as
    torch's dropout divides by ``1 − p``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, scale = keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with a mask from :func:`keep_mask` in a bf16 CPU step."""
    if not training or p == 0.0 or not in_bf16_cpu_step(x):
        return F.dropout(x, p, training)
    return _Masked.apply(x, p)


class BitsDropout(nn.Dropout):
    """``nn.Dropout`` whose mask in a bf16 CPU step comes from :func:`keep_mask` (elsewhere: ``nn.Dropout``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' SDPA attention, except with dropout in a bf16 CPU step: there SDPA's math path written out
    (``attention_mask``: SDPA's boolean form, True attends, or None), its dropout from :func:`keep_mask`."""
    plain = (dropout == 0.0 or not in_bf16_cpu_step(query) or getattr(module, "num_key_value_groups", 1) > 1
             or kwargs.get("position_bias") is not None or getattr(module, "is_causal", False)
             or (attention_mask is not None and attention_mask.dtype != torch.bool))
    if plain:
        return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (batch, heads, n, m)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    # train.bf16_stream: the softmax in the scores' own dtype (dtype None). torch's CPU kernel computes a bf16 row in
    # fp32 and rounds once, the same bits as an fp32 softmax cast to bf16, without the fp32 copy and its cast back; its
    # backward reads the rounded probabilities (kgc.encoding.stream)
    dtype = None if getattr(module, STREAM, False) else torch.float32
    probs = _Masked.apply(F.softmax(scores, dim=-1, dtype=dtype).to(value.dtype), dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def install(backbone: nn.Module) -> nn.Module:
    """Put :class:`BitsDropout` in place of each ``nn.Dropout`` of ``backbone`` and :func:`attention` in place of
    its SDPA attention (other attention implementations are left as they are); returns ``backbone``. Weights,
    state-dict keys and every computation outside a bf16 CPU step are unchanged."""
    for name, child in list(backbone.named_modules()):
        for attr, sub in list(child.named_children()):
            if type(sub) is nn.Dropout:
                swapped = BitsDropout(sub.p, sub.inplace)
                swapped.train(sub.training)
                setattr(child, attr, swapped)
    config = getattr(backbone, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(NAME, attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        config._attn_implementation = NAME
    return backbone


def is_sdpa(implementation: str | None) -> bool:
    """Whether an attention implementation's masks are SDPA's (``sdpa``, or :func:`install`'s own)."""
    return implementation in ("sdpa", NAME)
