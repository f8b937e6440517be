"""kgc.encoding.dropout: a bf16 CPU step's dropout masks from bulk random bits — the keep probability and scale
exact, the output and gradient x·keep·scale with the mask the generator gives, everything outside a bf16 CPU step
bit for bit torch's and transformers' own, and a tiny BERT's bf16 training forward draws no bernoulli mask."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kgc.encoding import dropout as bits


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_the_keep_probability_and_scale_are_exact_and_the_draws_keep_it():
    p = 0.1
    drop = round(p * 65536)
    every_lane = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    assert int((every_lane >= drop - 32768).sum()) == 65536 - drop  # the threshold keeps exactly this many lanes
    torch.manual_seed(0)
    keep, scale = bits.keep_mask((1 << 22,), p)
    assert keep.dtype == torch.bool and keep.shape == (1 << 22,)
    assert scale == 65536 / (65536 - drop)
    rate, want = keep.double().mean().item(), 1 - drop / 65536
    assert abs(rate - want) < 5 * (want * (1 - want) / (1 << 22)) ** 0.5  # within 5 standard deviations
    for lanes in (keep[0::4], keep[1::4], keep[2::4], keep[3::4]):  # every lane of a draw, the top one too
        assert abs(lanes.double().mean().item() - want) < 5 * (want * (1 - want) / len(lanes)) ** 0.5
    torch.manual_seed(0)
    assert torch.equal(bits.keep_mask((1 << 22,), p)[0], keep)  # the generator's seed makes it repeatable


def test_outside_a_bf16_cpu_step_it_is_torchs_dropout_bit_for_bit():
    x = torch.randn(8, 16, 32)
    torch.manual_seed(3)
    want = F.dropout(x, 0.1, True)
    torch.manual_seed(3)
    assert torch.equal(bits.dropout(x, 0.1, True), want)
    torch.manual_seed(3)
    module = bits.BitsDropout(0.1)
    assert torch.equal(module(x), want)
    assert torch.equal(module.eval()(x), x) and torch.equal(bits.dropout(x, 0.1, False), x)
    with bf16():
        assert torch.equal(bits.dropout(x, 0.1, False), x)  # evaluation in bf16: nothing dropped


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_a_bf16_cpu_step_the_output_and_gradient_are_x_keep_scale(dtype):
    x = torch.randn(4, 16, 48, dtype=dtype, requires_grad=True)
    torch.manual_seed(7)
    keep, scale = bits.keep_mask(x.shape, 0.25)
    torch.manual_seed(7)
    with bf16():
        y = bits.dropout(x, 0.25, True)
    want = x.detach().mul(keep).mul_(scale)
    assert y.dtype == dtype and torch.equal(y.detach(), want)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g.mul(keep).mul_(scale))
    ones = torch.ones(1 << 21)
    with bf16():
        mean = bits.dropout(ones, 0.1, True).double().mean().item()
    assert mean == pytest.approx(1.0, abs=5 * (0.1 / 0.9 / (1 << 21)) ** 0.5)  # the expectation is the input's


def test_the_attention_is_sdpa_outside_a_bf16_step_and_sdpas_math_with_bits_inside():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    module.is_causal = False
    q, k, v = (torch.randn(3, 2, 7, 8) for _ in range(3))
    mask = torch.ones(3, 1, 7, 7, dtype=torch.bool)
    mask[1, :, :, 5:] = False
    for p in (0.0, 0.2):
        torch.manual_seed(1)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=p, scaling=0.3)
        torch.manual_seed(1)
        got, _ = bits.attention(module, q, k, v, mask, dropout=p, scaling=0.3)
        assert torch.equal(got, want)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    torch.manual_seed(5)
    keep, scale = bits.keep_mask((3, 2, 7, 7), 0.2)
    scores = (qb.float() @ kb.float().transpose(-2, -1) * 0.3).masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = F.softmax(scores, dim=-1).to(torch.bfloat16).mul(keep).mul_(scale)
    want = (probs.float() @ vb.float()).transpose(1, 2)
    torch.manual_seed(5)
    with bf16():
        got, _ = bits.attention(module, qb, kb, vb, mask, dropout=0.2, scaling=0.3)
    assert got.shape == (3, 7, 2, 8)
    assert torch.allclose(got.float(), want, atol=3e-2)
    assert torch.equal(got[1, :, :, :].float() != 0, want[1] != 0)  # the padded keys are never attended


def test_a_tiny_berts_fp32_forward_is_unchanged_and_its_bf16_step_draws_no_bernoulli_mask():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, attn_implementation="sdpa")
    torch.manual_seed(0)
    plain = BertModel(config, add_pooling_layer=False).train()
    swapped = bits.install(copy.deepcopy(plain))
    assert swapped.config._attn_implementation == bits.NAME
    assert sum(isinstance(m, bits.BitsDropout) for m in swapped.modules()) == 1 + 3 * 2
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(1, 100, (4, 9))
    attention = torch.ones(4, 9, dtype=torch.long)
    attention[2, 6:] = 0
    torch.manual_seed(11)
    want = plain(input_ids=ids, attention_mask=attention).last_hidden_state
    torch.manual_seed(11)
    assert torch.equal(swapped(input_ids=ids, attention_mask=attention).last_hidden_state, want)  # fp32: as before
    with torch.profiler.profile() as prof, bf16():
        out = swapped(input_ids=ids, attention_mask=attention).last_hidden_state
    out.float().sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "aten::bernoulli_" not in names and "aten::random_" in names
    with torch.profiler.profile() as prof, bf16():
        plain(input_ids=ids, attention_mask=attention)
    assert "aten::bernoulli_" in {e.key for e in prof.key_averages()}  # what it replaced


def test_a_bf16_rows_softmax_is_the_fp32_softmax_rounded_once():
    """What :func:`kgc.encoding.dropout.attention` relies on to skip the fp32 copy: the same bits either way."""
    torch.manual_seed(2)
    scores = (torch.randn(8, 4, 33, 33) * 4).to(torch.bfloat16)
    scores[0, :, :, 20:] = torch.finfo(torch.bfloat16).min  # masked keys, as the attention fills them
    assert torch.equal(F.softmax(scores, dim=-1), F.softmax(scores, dim=-1, dtype=torch.float32).to(torch.bfloat16))


def test_with_the_bf16_stream_the_attentions_forward_is_the_same_bits():
    """train.bf16_stream takes the softmax in bf16 (kgc.encoding.stream): a forward equal to the fp32 softmax's."""
    module = torch.nn.Module()
    module.is_causal = False
    q, k, v = (torch.randn(3, 2, 7, 8).to(torch.bfloat16) for _ in range(3))
    mask = torch.ones(3, 1, 7, 7, dtype=torch.bool)
    mask[1, :, :, 5:] = False
    outs = []
    for on in (False, True):
        setattr(module, bits.STREAM, on)
        torch.manual_seed(5)
        with bf16():
            outs.append(bits.attention(module, q, k, v, mask, dropout=0.2, scaling=0.3)[0])
    assert torch.equal(outs[0], outs[1])
