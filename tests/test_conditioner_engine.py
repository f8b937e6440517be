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


@pytest.mark.parametrize("case", sorted(CASES))
def test_pair_engine_encodes_only_the_sentences_asked_for(case, encoder, special):  # noqa: F811
    """``only``: those sentences' states up front, the others the first time a pair needs them, each once; the
    vectors are the ones the engine that encodes every sentence up front gives."""
    cond = make(case, encoder, special)
    with torch.no_grad():
        full = PairEncoder(cond, SENTENCES, CONDITIONS, batch_size=2)(SENTENCE_INDEX, CONDITION_INDEX)
        engine = PairEncoder(cond, SENTENCES, CONDITIONS, batch_size=2, only=[3, 1, 3])
        before = dict(engine.passes)
        first = engine(SENTENCE_INDEX[:4], CONDITION_INDEX[:4])  # sentences 5 and 0 are new, 3 and 1 are not
        after_first = dict(engine.passes)
        rest = engine(SENTENCE_INDEX[4:], CONDITION_INDEX[4:])  # 4 and 2 are new
    torch.testing.assert_close(torch.cat([first, rest]), full, atol=2e-3 if CASES[case][0] in FP16_TABLES else 1e-5,
                               rtol=0)
    if cond.enters_at == "input":
        assert engine.passes["sentences"] == 0 and engine.ensure([0, 1]) == 0
    else:
        assert before["sentences"] == 2 and after_first["sentences"] == 4
        assert engine.passes["sentences"] == len(SENTENCES) and engine.ensure(range(len(SENTENCES))) == 0


@pytest.fixture()
def sharp(tiny_bert):
    """The 2-layer random BERT with peaked attention, so w is far from uniform."""
    return TextEncoder(sharpen_attention(load_backbone(tiny_bert))).eval()


SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005]]
CONDS = [[3000], [3001, 3002, 3003], [3000]]


def router(sharp, special, **kw):  # noqa: F811
    """The routing before 2026-11-24 unless told otherwise (query_key, w over every token, context × (1 + w)): the
    hand computations below follow it; tests/test_router_routes.py checks the defaults."""
    old = {"scorer": "query_key", "route_over": "all", "route_scales": "context", "weighting": "one_plus_w"}
    return build_conditioner("router", encoder=sharp, special=special, max_tokens=24, **{**old, **kw}).eval()


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


def test_hypernet_drops_out_the_condition_before_the_generators(tiny_bert, tokenizer):
    """Hyper-CL's released code: Dropout(0.1) on h_c before the generators while training; none in eval mode."""
    import torch

    from kgc.conditioning.pooled import GENERATOR_DROPOUT, HyperNet
    from kgc.data.texts import SpecialTokens
    from kgc.encoding.backbone import TextEncoder, load_backbone

    enc = TextEncoder(load_backbone(tiny_bert), "mean")
    cond = HyperNet(encoder=enc, special=SpecialTokens.from_tokenizer(tokenizer), max_tokens=16, rank=2)
    assert GENERATOR_DROPOUT == 0.1 and cond.gen_dropout.p == 0.1
    ids = tokenizer(["a colour", "a shape"], add_special_tokens=False)["input_ids"]
    seen = []
    cond.gen1.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    cond.eval()
    with torch.no_grad():
        cond.encode_conditions(ids)
        hc = PooledReference(cond, ids)
    torch.testing.assert_close(seen[-1], hc)  # eval: the generators read h_c as it is
    cond.train()
    cond.encoder.eval()  # the encoder's own dropout off: only the generators' input dropout acts
    torch.manual_seed(0)
    with torch.no_grad():
        cond.encode_conditions(ids)
    dropped = seen[-1]
    zero = dropped == 0
    assert zero.any() and not zero.all()  # some features dropped …
    torch.testing.assert_close(dropped[~zero], hc[~zero] / 0.9)  # … the rest scaled by 1 / (1 - p)


def PooledReference(cond, ids):
    """h_c: the pooled, normalised condition embedding (what the generators read before any dropout)."""
    from kgc.conditioning.pooled import PooledConditioner

    return PooledConditioner.encode_conditions(cond, ids)


def test_paper_scorer_is_the_csr_equation_in_every_router_layer(tiny_bert, special, tmp_path):  # noqa: F811
    """``scorer: paper`` — the CSR paper's w_t = softmax(q^c · K_tᵀ / √d): q^c the condition's [CLS] query vector
    in the last layer (full width, the last layer's query projection), K_t each router layer's own keys of the
    states entering it, one softmax over the sentence's real tokens; recomputed here with plain torch ops on a
    3-layer random BERT with k = 2 router layers."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(3)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "bert3")
    enc = TextEncoder(sharpen_attention(load_backbone(tmp_path / "bert3"))).eval()
    r = router(enc, special, scorer="paper", router_layers=2)
    assert r.t == 1 and r.router_layers == 2
    layers = enc.backbone.encoder.layer
    entering = {}  # router layer -> the states entering it in the routed pass (layer 2's input was routed at 1)
    hooks = [layers[i].register_forward_pre_hook(lambda m, args, i=i: entering.__setitem__(i, args[0].detach()))
             for i in (1, 2)]
    with torch.no_grad():
        route = routed_w(r)
        for h in hooks:
            h.remove()
        hc = states_at(enc, special, CONDS, 2)[0][:, 0]  # the condition's [CLS] entering the last layer
        q = layers[2].attention.self.query(hc)  # (conditions, H): its query vector in the last layer
        _, mask = states_at(enc, special, SENTS, 1)
        plain_entering_1 = states_at(enc, special, SENTS, 1)[0]
    torch.testing.assert_close(entering[1], plain_entering_1, atol=1e-6, rtol=1e-6)  # below t: unrouted
    for layer in (1, 2):
        keys = layers[layer].attention.self.key(entering[layer])  # (batch, len, H)
        for i in range(len(SENTS)):
            n = int(mask[i].sum())
            ref = torch.softmax(keys[i, :n] @ q[i] / math.sqrt(keys.shape[-1]), 0)
            torch.testing.assert_close(route.seen[layer][i, :n], ref, atol=1e-5, rtol=1e-5)
            assert float(route.seen[layer][i, n:].abs().sum()) == 0.0
    assert (route.seen[1] - route.seen[2]).abs().max() > 1e-3  # each layer its own w (query_key reuses layer t's)
    reused = routed_w(router(enc, special, scorer="query_key", router_layers=2))
    assert torch.equal(reused.seen[1], reused.seen[2])


def test_cls_attention_without_renormalising_is_the_raw_cls_row(sharp, special):  # noqa: F811
    """``scorer: cls_attention`` with ``renormalise: false`` (the released code): w is the head-averaged attention
    of the sentence's [CLS] on its tokens, not renormalised — the mass on the condition's tokens (cross-attention)
    is missing, so w sums to less than 1; with ``renormalise`` it is the same row divided by its sum."""
    raw = routed_w(router(sharp, special, scorer="cls_attention", cross_attend="top", renormalise=False))
    norm = routed_w(router(sharp, special, scorer="cls_attention", cross_attend="top"))
    layer = max(raw.seen)
    for i in range(len(SENTS)):
        n = int(raw.mask[i].sum())
        total = float(raw.seen[layer][i, :n].sum())
        assert 0 < total < 1 - 1e-3  # some attention went to the condition's tokens
        torch.testing.assert_close(norm.seen[layer][i, :n], raw.seen[layer][i, :n] / total, atol=1e-5, rtol=1e-5)
    from kgc.errors import KGCError

    with pytest.raises(KGCError, match="renormalise=false applies to model.scorer=cls_attention"):
        router(sharp, special, renormalise=False)
