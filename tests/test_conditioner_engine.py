"""The evaluation engine against the conditioners themselves, and the router's w against hand computations.

* :class:`~kgc.conditioning.engine.PairEncoder` caches condition and sentence states in tables (chunked, padded,
  sentences sorted by length) and gathers rows per pair; whatever the order, repetition and padding of the
  pairs, it must give what ``cond(sentences, conditions)`` gives for the same pairs.
* CSR's w: the ``hidden`` and ``heavy`` scorers and the ``w_only`` weighting recomputed with plain torch ops
  from the layer's weights, compared with the w the routed pass used (``Route.seen``) and its output.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kgc.conditioning import build_conditioner
from kgc.conditioning.engine import PairEncoder
from kgc.encoding.backbone import TextEncoder, load_backbone, pool
from tests.conftest import sharpen_attention
from tests.test_conditioners import CASES, encoder, make, special  # noqa: F401  (fixtures shared with it)

# a table of sentences of different lengths and one of conditions; pairs repeat and reorder both
SENTENCES = [[2000, 2001, 2002, 2010, 2011, 2012], [2003], [2004, 2005], [2006, 2007, 2008, 2009],
             [2013, 2014, 2015], [2016, 2017, 2018, 2019, 2020, 2021, 2022]]
CONDITIONS = [[3000, 3001, 3002], [3003], [3004, 3005]]
SENTENCE_INDEX = [5, 0, 3, 1, 0, 4, 2, 5, 1]
CONDITION_INDEX = [2, 0, 2, 1, 1, 0, 0, 0, 2]
FP16_TABLES = {"router"}  # sentence states kept in fp16 between passes (Router.cat_states), by design


@pytest.mark.parametrize("case", sorted(CASES))
def test_pair_engine_equals_calling_the_conditioner(case, encoder, special, monkeypatch):  # noqa: F811
    cond = make(case, encoder, special)
    with torch.no_grad():
        engine = PairEncoder(cond, SENTENCES, CONDITIONS, batch_size=2)  # several chunks of unequal widths
        got = engine(SENTENCE_INDEX, CONDITION_INDEX)
        if CASES[case][0] in FP16_TABLES:  # the reference rounds the sentence states as the table stores them
            real = cond.encode_sentences
            monkeypatch.setattr(cond, "encode_sentences", lambda s: (lambda st: (st[0].half().float(), st[1]))(real(s)))
        ref = cond([SENTENCES[i] for i in SENTENCE_INDEX], [CONDITIONS[j] for j in CONDITION_INDEX])
    assert got.shape == ref.shape == (len(SENTENCE_INDEX), cond.out_dim)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got[0] - got[7]).abs().max() > 1e-6  # same sentence, other condition
    if cond.enters_at == "input":  # the whole encoder per pair, nothing per sentence
        assert engine.passes["queries_full"] == len(SENTENCE_INDEX) and engine.passes["sentences"] == 0
    else:  # each sentence once, however often the pairs use it
        assert engine.passes["sentences"] == len(SENTENCES)


@pytest.fixture()
def sharp(tiny_bert):
    """The 2-layer random BERT with peaked attention, so w is far from uniform."""
    return TextEncoder(sharpen_attention(load_backbone(tiny_bert))).eval()


SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005]]
CONDS = [[3000], [3001, 3002, 3003], [3000]]


def router(sharp, special, **kw):  # noqa: F811
    return build_conditioner("router", encoder=sharp, special=special, max_tokens=24, **kw).eval()


def states_at(encoder, special, seqs, t):  # noqa: F811
    """(hidden states entering layer t (batch, len, H), attention mask (batch, len)) from Hugging Face's forward."""
    batch = special.pad([special.wrap(s, 24) for s in seqs])
    return encoder.backbone(**batch, output_hidden_states=True).hidden_states[t], batch["attention_mask"]


def routed_w(r, sents=SENTS, conds=CONDS):
    _, route = r.route(r.encode_sentences(sents), r.encode_conditions(conds), torch.arange(len(sents)))
    return route


def test_hidden_scorer_is_the_hidden_state_dot_product(sharp, special):  # noqa: F811
    r = router(sharp, special, scorer="hidden")
    t = r.t
    with torch.no_grad():
        hs, mask = states_at(sharp, special, SENTS, t)
        hc = states_at(sharp, special, CONDS, t)[0][:, 0]  # the condition's [CLS] entering layer t: (b, H)
        route = routed_w(r)
    for i in range(len(SENTS)):
        n = int(mask[i].sum())
        ref = torch.softmax(hs[i, :n] @ hc[i] / math.sqrt(hs.shape[-1]), 0)  # (n,)
        torch.testing.assert_close(route.seen[t][i, :n], ref, atol=1e-5, rtol=1e-5)
        assert float(route.seen[t][i, n:].abs().sum()) == 0.0
    assert float((route.seen[t][0, :5].max() - route.seen[t][0, :5].min())) > 0.05  # not uniform


def test_heavy_scorer_uses_its_own_projections(sharp, special):  # noqa: F811
    r = router(sharp, special, scorer="heavy")
    t = r.t
    with torch.no_grad():
        for p in (*r.w_q.parameters(), *r.w_k.parameters()):  # its own copies, trained apart from the layer's
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
        hs, mask = states_at(sharp, special, SENTS, t)
        hc = states_at(sharp, special, CONDS, t)[0][:, 0]
        route = routed_w(r)
        plain_qk = routed_w(router(sharp, special)).seen[t]  # the layer's own query/key on the same encoder
    attn = sharp.backbone.encoder.layer[t].attention.self
    nh, dh = attn.num_attention_heads, attn.attention_head_size
    for i in range(len(SENTS)):
        n = int(mask[i].sum())
        q = r.w_q(hc[i]).view(nh, dh)  # (heads, dh)
        k = r.w_k(hs[i, :n]).view(n, nh, dh)
        ref = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / math.sqrt(dh), -1).mean(0)  # (n,)
        torch.testing.assert_close(route.seen[t][i, :n], ref, atol=1e-5, rtol=1e-5)
    assert (route.seen[t] - plain_qk).abs().max() > 1e-3  # not the layer's own projections


def test_w_only_multiplies_the_context_by_w_alone(sharp, special):  # noqa: F811
    r = router(sharp, special, weighting="w_only")
    t = r.t
    layer = sharp.backbone.encoder.layer[t]
    attn = layer.attention.self
    with torch.no_grad():
        hidden, mask = states_at(sharp, special, SENTS, t)
        hc = states_at(sharp, special, CONDS, t)[0][:, 0]
        b, n, _ = hidden.shape
        nh, dh = attn.num_attention_heads, attn.attention_head_size
        # w by hand: the condition's [CLS] query against the sentence's keys, per head, softmax over real tokens
        scores = torch.einsum("bhd,bnhd->bhn", attn.query(hc).view(b, nh, dh), attn.key(hidden).view(b, n, nh, dh))
        w = (scores / math.sqrt(dh)).masked_fill(mask[:, None] == 0, float("-inf")).softmax(-1).mean(1)  # (b, n)
        route = routed_w(r)
        torch.testing.assert_close(route.seen[t], w, atol=1e-5, rtol=1e-5)
        # the top layer by hand with context × w (not 1 + w)
        split = lambda x: x.view(b, n, nh, dh).transpose(1, 2)  # noqa: E731
        s = split(attn.query(hidden)) @ split(attn.key(hidden)).transpose(-1, -2) * attn.scaling
        s = s + (1 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        ctx = (s.softmax(-1) @ split(attn.value(hidden))).transpose(1, 2).reshape(b, n, -1) * w.unsqueeze(-1)
        out = layer.attention.output(ctx, hidden)
        out = layer.output(layer.intermediate(out), out)
        ref = F.normalize(pool(out, mask, "mean"), dim=-1)
        torch.testing.assert_close(r(SENTS, CONDS), ref, atol=1e-5, rtol=1e-5)
        one_plus = router(sharp, special)(SENTS, CONDS)
    assert (one_plus - ref).abs().max() > 1e-3  # the weighting really differs
