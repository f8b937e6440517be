"""Layer-split encoding, the layer cache, partial fine-tuning, and the conditioners' defining equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kgc.conditioning import build_conditioner
from kgc.data.texts import SpecialTokens
from kgc.encoding.backbone import TextEncoder, load_backbone, pool
from kgc.encoding.cache import LayerCache, lower_weights_hash
from kgc.encoding.layers import frozen_below
from tests.conftest import sharpen_attention

SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005], [2000, 2001, 2002, 2010]]
CONDS = [[3000], [3001, 3002], [3000], [3001, 3002]]


@pytest.fixture()
def encoder(tiny_bert):
    return TextEncoder(sharpen_attention(load_backbone(tiny_bert))).eval()


@pytest.fixture(scope="module")
def special(tokenizer):
    return SpecialTokens.from_tokenizer(tokenizer)


def batch_of(special, seqs):
    return special.pad([special.wrap(s, 24) for s in seqs])


def test_layer_by_layer_equals_the_hugging_face_forward(encoder, special):
    batch = batch_of(special, SENTS)
    with torch.no_grad():
        full = encoder.backbone(**batch).last_hidden_state
        for t in range(encoder.num_layers + 1):
            split = encoder.run_from(encoder.hidden_at(batch, t), batch["attention_mask"], t)
            ref = F.normalize(pool(full, batch["attention_mask"], "mean"), dim=-1)
            torch.testing.assert_close(split, ref, atol=1e-5, rtol=1e-5)


def test_cached_and_uncached_forward_agree(encoder, special, tmp_path):
    batch = batch_of(special, SENTS)
    with torch.no_grad():
        plain = encoder(**batch)
        encoder.cache = LayerCache(layer=1, model_hash=lower_weights_hash(encoder.backbone, 1), tokenizer_hash="t",
                                   hidden=encoder.dim, folder=tmp_path / "c")
        first = encoder(**batch)  # fills the cache
        assert encoder.cache.misses == 3 and encoder.cache.hits == 1  # rows 0 and 3 are the same text
        second = encoder(**batch)  # served from it
    assert encoder.cache.hits == 5
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, plain, atol=2e-3, rtol=0)  # fp16 storage of the layer-1 states


def test_a_cache_that_does_not_store_answers_the_same_and_stays_bounded(encoder, special, tmp_path):
    """kgc serve turns storing off: misses are computed and rounded as stored ones are, hits still hit, and the
    cache does not grow with every new text."""
    batch = batch_of(special, SENTS)
    cache = LayerCache(layer=1, model_hash=lower_weights_hash(encoder.backbone, 1), tokenizer_hash="t",
                       hidden=encoder.dim, folder=tmp_path / "c")
    encoder.cache = cache
    with torch.no_grad():
        stored = encoder(**batch)  # store=True: 3 texts kept
        kept, unsaved = len(cache.states), len(cache.fresh)
        cache.store = False
        assert torch.equal(encoder(**batch), stored) and cache.misses == 3  # all hits
        other = batch_of(special, [[2020, 2021, 2022], SENTS[0]])
        fresh = encoder(**other)
        assert len(cache.states) == kept and len(cache.fresh) == unsaved  # the new text was not kept
        cache.store = True
        assert torch.equal(encoder(**other), fresh)  # the same value a stored miss gives
        assert len(cache.states) == kept + 1


def test_cache_persists_and_refuses_other_weights(encoder, special, tmp_path):
    h = lower_weights_hash(encoder.backbone, 1)
    cache = LayerCache(layer=1, model_hash=h, tokenizer_hash="t", hidden=encoder.dim, folder=tmp_path / "c")
    encoder.cache = cache
    with torch.no_grad():
        ref = encoder(**batch_of(special, SENTS))
    cache.save()
    # once saved, the states are read from the segment (memory-mapped) instead of held in the process's memory
    assert cache.fresh == [] and all(isinstance(v, np.memmap) for v in cache.states.values())
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch_of(special, SENTS)), ref)
    again = LayerCache(layer=1, model_hash=h, tokenizer_hash="t", hidden=encoder.dim, folder=tmp_path / "c")
    assert len(again.states) == 3 and isinstance(next(iter(again.states.values())), np.memmap)
    encoder.cache = again
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch_of(special, SENTS)), ref)
    assert again.misses == 0
    stale = LayerCache(layer=1, model_hash="0" * 64, tokenizer_hash="t", hidden=encoder.dim, folder=tmp_path / "c")
    assert stale.states == {} and not (tmp_path / "c").exists()  # other weights: rebuilt, not trusted


def test_partial_fine_tuning_freezes_and_silences_lower_layers(encoder):
    t = encoder.frozen_layers = frozen_below(encoder.backbone, 1)
    assert t == encoder.num_layers - 1
    encoder.train()
    assert not any(p.requires_grad for p in encoder.backbone.embeddings.parameters())
    assert not any(p.requires_grad for p in encoder.backbone.encoder.layer[0].parameters())
    assert all(p.requires_grad for p in encoder.backbone.encoder.layer[-1].parameters())
    assert not encoder.backbone.encoder.layer[0].training and encoder.backbone.encoder.layer[-1].training
    with pytest.raises(Exception, match="trainable_layers=9"):
        frozen_below(encoder.backbone, 9)


def test_router_with_zero_weights_is_the_plain_encoder(encoder, special, monkeypatch):
    router = build_conditioner("router", encoder=encoder, special=special, max_tokens=24,
                               scorer="query_key", route_over="all", route_scales="context", weighting="one_plus_w").eval()
    monkeypatch.setattr(router, "weights", lambda hidden, mask, query: torch.zeros(mask.shape))
    with torch.no_grad():
        torch.testing.assert_close(router(SENTS, CONDS), encoder(**batch_of(special, SENTS)), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(router(SENTS, CONDS)[0], router(SENTS, CONDS)[0] * 0)  # not degenerate


def test_router_weights_follow_the_papers_equation(encoder, special):
    router = build_conditioner("router", encoder=encoder, special=special, max_tokens=24,
                               scorer="query_key", route_over="all", route_scales="context", weighting="one_plus_w").eval()
    t = router.t
    sb, cb = batch_of(special, SENTS), batch_of(special, CONDS)
    with torch.no_grad():
        hs = encoder.backbone(**sb, output_hidden_states=True).hidden_states[t]  # entering layer t
        hc = encoder.backbone(**cb, output_hidden_states=True).hidden_states[t][:, 0]  # condition [CLS]
        attn = encoder.backbone.encoder.layer[t].attention.self
        nh, dh = attn.num_attention_heads, attn.attention_head_size
        got = router.weights(*router.encode_sentences(SENTS), router.encode_conditions(CONDS).query)
    for i in range(len(SENTS)):
        n = int(sb["attention_mask"][i].sum())
        q = attn.query(hc[i]).view(nh, dh)
        k = attn.key(hs[i, :n]).view(n, nh, dh)
        per_head = [torch.softmax(torch.stack([q[h] @ k[j, h] / math.sqrt(dh) for j in range(n)]), 0)
                    for h in range(nh)]
        ref = torch.stack(per_head).mean(0)
        torch.testing.assert_close(got[i, :n], ref, atol=1e-5, rtol=1e-5)
        assert float(got[i, n:].abs().sum()) == 0.0  # padding gets no weight
        assert float(got[i, :n].sum()) == pytest.approx(1.0, abs=1e-5)


def test_router_multiplies_context_by_one_plus_w(encoder, special):
    """Recompute the top layer by hand from its submodules with context × (1 + w)."""
    router = build_conditioner("router", encoder=encoder, special=special, max_tokens=24,
                               scorer="query_key", route_over="all", route_scales="context", weighting="one_plus_w").eval()
    with torch.no_grad():
        states, mask = router.encode_sentences(SENTS)  # (batch, len, K = 1, H): the state entering layer t
        assert states.shape[2] == 1
        hidden = states[:, :, -1]
        w = router.weights(states, mask, router.encode_conditions(CONDS).query)
        layer = encoder.backbone.encoder.layer[router.t]
        attn = layer.attention.self
        b, n, _ = hidden.shape
        split = lambda x: x.view(b, n, attn.num_attention_heads, -1).transpose(1, 2)  # noqa: E731
        scores = split(attn.query(hidden)) @ split(attn.key(hidden)).transpose(-1, -2) * attn.scaling
        scores = scores + (1 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        ctx = (scores.softmax(-1) @ split(attn.value(hidden))).transpose(1, 2).reshape(b, n, -1)
        ctx = ctx * (1 + w).unsqueeze(-1)
        out = layer.attention.output(ctx, hidden)
        out = layer.output(layer.intermediate(out), out)
        ref = F.normalize(pool(out, mask, "mean"), dim=-1)
        torch.testing.assert_close(router(SENTS, CONDS), ref, atol=1e-5, rtol=1e-5)
        plain = encoder(**batch_of(special, SENTS))
        assert (router(SENTS, CONDS) - plain).abs().max() > 1e-3  # the routing really changes the output
        spread = [float(w[i, : int(mask[i].sum())].max() - w[i, : int(mask[i].sum())].min()) for i in range(len(w))]
        assert min(spread) > 0.05  # and w is not uniform


@pytest.mark.parametrize("form", ["lowrank", "residual", "full"])
def test_hypernet_equals_explicit_matrix_product(encoder, special, form):
    torch.manual_seed(0)
    hyper = build_conditioner("hypernet", encoder=encoder, special=special, max_tokens=24, rank=3,
                              hypernet_form=form).eval()
    with torch.no_grad():
        hs = encoder(**batch_of(special, SENTS))
        hc = encoder(**batch_of(special, CONDS))
        h = encoder.dim
        refs = []
        for i in range(len(SENTS)):
            if form == "full":
                wc = hyper.gen(hc[i]).view(h, h)
            else:
                wc = hyper.gen1(hc[i]).view(h, 3) @ hyper.gen2(hc[i]).view(h, 3).t()
                if form == "residual":
                    wc = wc + torch.eye(h)
            refs.append(F.normalize(hs[i] @ wc, dim=-1))
        torch.testing.assert_close(hyper(SENTS, CONDS), torch.stack(refs), atol=1e-5, rtol=1e-5)
        if form == "residual":  # W2 starts at zero: W_c = I, the plain sentence embedding
            torch.testing.assert_close(hyper(SENTS, CONDS), hs, atol=1e-6, rtol=0)


def test_hypernet_builds_each_distinct_matrix_once(encoder, special, monkeypatch):
    hyper = build_conditioner("hypernet", encoder=encoder, special=special, max_tokens=24,
                              hypernet_form="full").eval()
    seen = []
    real = hyper.gen.forward
    monkeypatch.setattr(hyper.gen, "forward", lambda x: (seen.append(x.shape[0]), real(x))[1])
    with torch.no_grad():
        hyper(SENTS * 8, CONDS * 8)  # 32 rows, 2 distinct conditions
    assert seen == [2]


def test_tri_encoder_compositions(encoder, special):
    with torch.no_grad():
        hs = encoder(**batch_of(special, SENTS))
        hc = encoder(**batch_of(special, CONDS))
        had = build_conditioner("hadamard", encoder=encoder, special=special, max_tokens=24).eval()
        torch.testing.assert_close(had(SENTS, CONDS), F.normalize(hs * had.proj(hc), dim=-1), atol=1e-6, rtol=0)
        cat = build_conditioner("concat", encoder=encoder, special=special, max_tokens=24).eval()
        ref = F.normalize(F.gelu(cat.proj(torch.cat([hs, hc], -1))), dim=-1)
        torch.testing.assert_close(cat(SENTS, CONDS), ref, atol=1e-6, rtol=0)


def test_backbones_built_side_by_side_leave_torch_initialisation_alone(tiny_bert):
    """load_backbone(weights=False) skips initialisation through transformers' no_init_weights, which swaps
    torch.nn.init's functions for no-ops process-wide and restores what it found: two threads inside it at once left
    the no-ops in place for good, and every nn.Linear made later in the process started from uninitialised memory
    (the conditioners' equation tests above then saw NaN when a threaded test ran before them in one worker). Forced
    here: A inside, B asks to enter, A leaves, B leaves — B must have waited for A (else B put back A's no-ops)."""
    import threading
    import time

    import transformers  # noqa: F401 — its lazy names imported here, not first from two threads at once
    from transformers import AutoConfig, AutoModel  # noqa: F401

    from kgc.encoding import backbone

    modules = [m for m in (torch.nn.init, torch.nn.modules.linear, torch.nn.modules.sparse)]
    real = {(m, n): getattr(m, n) for m in modules for n in ("kaiming_uniform_", "normal_", "uniform_", "zeros_")
            if hasattr(m, n)}
    inside, asked = threading.Event(), threading.Event()

    def first():
        with backbone._no_init():
            inside.set()
            asked.wait(5)
            time.sleep(0.3)  # the second would be inside by now were it let in

    def second():
        inside.wait(5)
        asked.set()
        with backbone._no_init():
            time.sleep(0.6)  # leaves after the first (unless it waited for the first to leave)

    def built():
        for _ in range(3):
            load_backbone(tiny_bert, weights=False)

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        threads += [threading.Thread(target=built) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(getattr(m, n) is f for (m, n), f in real.items()), "torch.nn.init left patched"
        torch.manual_seed(0)
        weight = torch.nn.Linear(64, 64).weight
        assert torch.isfinite(weight).all() and 0.01 < float(weight.std()) < 0.2  # kaiming_uniform_, bound 1/8
    finally:
        for (m, n), f in real.items():  # a failure here must not spoil every later test of this worker
            setattr(m, n, f)
