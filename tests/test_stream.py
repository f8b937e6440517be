"""kgc.encoding.stream (``train.bf16_stream``, off by default): a bf16 CPU training step carries the encoder's
residual stream in bf16 — every layer and every projection reads bf16 without a cast of its own, the stream cast
once, whichever way the encoder is entered; off, it is autocast's own step; fp32 steps, inference and an fp32
model's outputs are what they were, bit for bit; the recipe key reaches the encoders of a run."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kgc.encoding import stream
from kgc.encoding.backbone import TextEncoder


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


class Casts(TorchDispatchMode):
    """Counts fp32 → bf16 casts of tensors shaped like the stream (batch, len, hidden)."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 \
                and kwargs.get("dtype") == torch.bfloat16 and tuple(args[0].shape) == self.shape:
            self.count += 1
        return func(*args, **kwargs)


@pytest.fixture
def encoder():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, attn_implementation="sdpa")
    torch.manual_seed(0)
    enc = TextEncoder(BertModel(config, add_pooling_layer=False)).train()
    stream.enable(enc.backbone)
    return enc


def inputs():
    ids = torch.randint(1, 100, (4, 9))
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[2, 6:] = 0
    return ids, mask


def record_inputs(encoder) -> list:
    """The dtype of what each layer and each Linear of the encoder reads, appended as they run."""
    seen = []
    for module in encoder.backbone.encoder.modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "BertLayer":
            module.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    return seen


def test_a_bf16_training_step_reads_bf16_everywhere_after_one_cast(encoder):
    ids, mask = inputs()
    seen = record_inputs(encoder)
    with bf16(), Casts((4, 9, 32)) as casts:
        out = encoder(ids, mask)
    assert len(seen) == 3 * 7 and set(seen) == {torch.bfloat16}  # 3 layers: the layer and its 6 projections
    assert casts.count == 1  # the embeddings' output, once (plain autocast: 3 for Q/K/V + 1 feed-forward a layer)
    assert out.dtype == torch.float32  # pooled and normalised in fp32
    out.sum().backward()
    grads = [p.grad for p in encoder.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_off_by_default_and_when_turned_off_a_bf16_step_is_autocasts_own(encoder):
    ids, mask = inputs()
    plain = copy.deepcopy(encoder)
    stream.enable(plain.backbone, False)
    seen = record_inputs(plain)
    with bf16(), Casts((4, 9, 32)) as casts:
        plain(ids, mask)
    assert casts.count == 3 * 4  # autocast's: each layer's fp32 input for Q, K and V, and the feed-forward's
    assert torch.float32 in seen
    from transformers import BertConfig, BertModel

    fresh = TextEncoder(BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, vocab_size=100), add_pooling_layer=False))
    assert not getattr(fresh.backbone, stream.STREAM, False)  # off unless enabled


def test_the_recipe_key_reaches_every_encoder_of_a_run(tmp_path, tiny_bert, data_home, monkeypatch):
    import kgc
    from tests.test_api import tiny_linkpred

    calls = []
    real = stream.enable
    monkeypatch.setattr(stream, "enable", lambda backbone, on=True: (calls.append(on), real(backbone, on)))
    for on in (False, True):
        calls.clear()
        recipe = tiny_linkpred(tiny_bert)
        recipe["train"] = {**recipe["train"], "bf16_stream": on, "max_steps": 1}
        kgc.train(recipe, tmp_path / f"run{on}", progress=False, echo=None)
        assert calls and set(calls) == {on}


def test_entered_at_a_layer_the_stream_is_bf16_too(encoder):
    ids, mask = inputs()
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():  # as the layer cache computes its states: no gradient, fp32
        states = encoder.hidden_at(batch, 1)
    assert states.dtype == torch.float32
    seen = record_inputs(encoder)
    with bf16():
        out = encoder.run_from(states, mask, 1)
    assert len(seen) == 2 * 7 and set(seen) == {torch.bfloat16}
    assert out.dtype == torch.float32


def test_inference_and_fp32_are_unchanged_bit_for_bit(encoder):
    ids, mask = inputs()
    plain = copy.deepcopy(encoder)
    plain.backbone.embeddings._forward_hooks.clear()  # the encoder without the stream's cast
    torch.manual_seed(4)
    want = plain(ids, mask)
    torch.manual_seed(4)
    assert torch.equal(encoder(ids, mask), want)  # an fp32 training forward: the hook does nothing
    encoder.eval()
    plain.eval()
    seen = record_inputs(encoder)
    with torch.no_grad(), bf16():  # inference in bf16 (kgc index, serve): autocast's own stream, fp32 between
        got, expected = encoder(ids, mask), plain(ids, mask)
    assert torch.equal(got, expected) and torch.float32 in seen


def test_the_bf16_stream_keeps_the_fp32_gradient_direction(encoder):
    ids, mask = inputs()
    encoder.eval()  # no dropout: the two precisions compute the same function
    target = torch.randn(4, 32)

    def grads(autocast: bool) -> torch.Tensor:
        encoder.zero_grad(set_to_none=True)
        with (bf16() if autocast else torch.autocast("cpu", enabled=False)):
            out = encoder(ids, mask)
        (out * target).sum().backward()
        return torch.cat([p.grad.flatten() for p in encoder.parameters() if p.grad is not None])

    fp32, half = grads(False), grads(True)
    cosine = torch.nn.functional.cosine_similarity(fp32, half, dim=0).item()
    assert cosine > 0.99, cosine
