"""A bf16 training step on a CPU carries the encoder's residual stream in bf16.

Why: under autocast the matrix products run in bf16 but the stream between them does not. A BERT layer's input
arrives in fp32 (the embeddings' output, a cached state, the layer norm before), so autocast casts it to bf16 once
for each product that reads it — three times for the query, key and value projections of the same tensor, once
for the feed-forward input — and casts each of their input gradients back to fp32 in the backward pass; the
residual sums and layer norms then run in fp32 again. On a CPU with bf16 matrix units those casts were the largest
cost of a bf16 step after the products themselves (docs/results/cpu.md: ``aten::copy_`` 17 % of the quickstart's
step, 1,111 calls). Here the layer-0 input of a bf16 CPU training step is cast to bf16 once; the layers then keep
it: torch's CPU layer norm takes a bf16 input with fp32 weights (its statistics in fp32) and gives bf16, and the
residual sums are bf16 + bf16.

What departs from plain autocast, on purpose: the residual sums and the layer norms' outputs of such a step are
rounded to bf16 (8 bits of mantissa) instead of kept in fp32, as in pure-bf16 training, and attention's softmax
(where :mod:`kgc.encoding.dropout` writes attention out) runs in bf16: its forward gives the same bits as an fp32
softmax rounded once, its backward reads those rounded probabilities. The weights, their
gradients, AdamW's state, the pooling, the loss, the softmax over every entity and the temperature stay fp32, and
an fp32 step, evaluation, inference (no gradient) and every GPU run are untouched (the saved runs' digests hold).

Opt-in (``train.bf16_stream: true``, :func:`enable`) until it is measured on a CPU with bf16 matrix units: written
on 2026-12-03 on a machine without them (an AVX2-only AMD EPYC, where bf16 is emulated and nothing can time it),
it is tested for what it does — one cast instead of one per product, bf16 inputs everywhere, fp32 outputs, the
fp32 gradient's direction kept (tests/test_stream.py) — but neither its speed nor its MRR at equal steps is known.
``kgc bench precision RECIPE --set train.bf16_stream=true`` beside the same command without it measures both.
"""

from __future__ import annotations

import torch
from torch import nn

from kgc.encoding.dropout import STREAM, in_bf16_cpu_step


def in_bf16_training_step(x: torch.Tensor) -> bool:
    """Whether ``x`` (a floating tensor) is computed in a bf16 CPU training step: inside a CPU autocast to bf16,
    with gradients on."""
    return torch.is_grad_enabled() and x.is_floating_point() and in_bf16_cpu_step(x)


def to_stream(hidden: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``hidden`` as a layer's input: bf16 in a bf16 CPU training step of a ``module`` (a backbone or its
    embeddings) the stream is enabled on (one cast, kept by every layer after), unchanged elsewhere."""
    if getattr(module, STREAM, False) and hidden.dtype == torch.float32 and in_bf16_training_step(hidden):
        return hidden.to(torch.bfloat16)
    return hidden


def _embeddings_out(module: nn.Module, args, output):
    return to_stream(output, module) if isinstance(output, torch.Tensor) else output


def install(backbone: nn.Module) -> nn.Module:
    """Cast the output of ``backbone.embeddings`` by :func:`to_stream` (a forward hook; no weights, no state-dict
    change), so a whole-model call starts its stream in bf16 in a bf16 CPU training step where :func:`enable` has
    turned it on; returns ``backbone``. :func:`kgc.encoding.layers.run_layers` does the same for a stream entering at
    any layer."""
    embeddings = getattr(backbone, "embeddings", None)
    if isinstance(embeddings, nn.Module) and not getattr(embeddings, "_kgc_stream", False):
        embeddings.register_forward_hook(_embeddings_out)
        embeddings._kgc_stream = True
    return backbone


def enable(backbone: nn.Module, on: bool = True) -> None:
    """Turn the bf16 stream on (or off) for ``backbone`` (``train.bf16_stream``); off by default. Set on every
    module of it: the embeddings' hook, :func:`~kgc.encoding.layers.run_layers` and the attention of
    :func:`kgc.encoding.dropout.attention` (its softmax then in bf16) read it."""
    for module in backbone.modules():
        setattr(module, STREAM, bool(on))
