"""CSR as the released code runs it: cross-attention to the condition's tokens, the [CLS]-attention scorer,
routing inside the bi-encoder, and ``kgc explain``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from kgc.conditioning import build_conditioner
from kgc.conditioning.router import RouterCondition
from kgc.encoding.backbone import pool
from kgc.encoding.cache import LayerCache, lower_weights_hash
from kgc.errors import KGCError
from tests.test_layered import batch_of, encoder, special  # noqa: F401  (fixtures shared with it)

SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005], [2000, 2001, 2002, 2010]]
CONDS = [[3000], [3001, 3002, 3003], [3000], [3001, 3002, 3003]]
NEG = torch.finfo(torch.float32).min


def router(encoder, special, **kw):
    """A router with the routing before 2026-11-24 unless told otherwise (query_key, w over every token, context
    scaled): these tests check the cross-attention and the scorers by hand on it (tests/test_router_routes.py: the
    defaults)."""
    old = {"scorer": "query_key", "route_over": "all", "route_scales": "context", "weighting": "one_plus_w"}
    return build_conditioner("router", encoder=encoder, special=special, max_tokens=24, **{**old, **kw}).eval()


def top_layer_by_hand(layer, hidden, mask, cond, cond_mask, factor):
    """One BERT layer from its submodules: keys/values over [condition ; sentence], context × factor."""
    attn = layer.attention.self
    b, n, _ = hidden.shape
    split = lambda x: x.view(b, x.shape[1], attn.num_attention_heads, -1).transpose(1, 2)  # noqa: E731
    both = torch.cat([cond, hidden], 1)  # (b, m + n, H)
    keep = torch.cat([cond_mask, mask], 1)
    scores = split(attn.query(hidden)) @ split(attn.key(both)).transpose(-1, -2) * attn.scaling  # (b, heads, n, m+n)
    probs = (scores + (1 - keep[:, None, None, :].float()) * NEG).softmax(-1)
    ctx = (probs @ split(attn.value(both))).transpose(1, 2).reshape(b, n, -1) * factor.unsqueeze(-1)
    out = layer.attention.output(ctx, hidden)
    return layer.output(layer.intermediate(out), out), probs


def test_cross_attend_top_is_attention_over_condition_and_sentence_keys(encoder, special):
    r = router(encoder, special, cross_attend="top")
    with torch.no_grad():
        states, mask = r.encode_sentences(SENTS)
        cond = r.encode_conditions(CONDS)
        cb = batch_of(special, CONDS)
        final = encoder.backbone(**cb).last_hidden_state  # the condition's final token states
        torch.testing.assert_close(cond.tokens, final, atol=1e-5, rtol=1e-5)
        assert cond.mask.tolist() == cb["attention_mask"].tolist()
        w = r.weights(states, mask, cond.query)  # the paper's query-key score, read at layer t
        out, _ = top_layer_by_hand(encoder.backbone.encoder.layer[r.t], states[:, :, -1], mask, final,
                                   cb["attention_mask"], 1 + w)
        ref = F.normalize(pool(out, mask, "mean"), dim=-1)
        torch.testing.assert_close(r(SENTS, CONDS), ref, atol=1e-5, rtol=1e-5)
        plain = router(encoder, special)  # cross_attend none on the same weights
        assert (plain(SENTS, CONDS) - ref).abs().max() > 1e-3  # the condition's tokens really are read


def test_top_with_an_all_padding_condition_equals_none(encoder, special):
    top, none = router(encoder, special, cross_attend="top"), router(encoder, special)
    with torch.no_grad():
        sent = top.encode_sentences(SENTS)
        cond = top.encode_conditions(CONDS)
        empty = RouterCondition(cond.query, cond.tokens, torch.zeros_like(cond.mask))
        idx = torch.arange(len(SENTS))
        torch.testing.assert_close(top.combine(sent, empty, idx),
                                   none.combine(sent, RouterCondition(cond.query, None, None), idx), atol=1e-6, rtol=0)
        assert (top.combine(sent, cond, idx) - none.combine(sent, cond, idx)).abs().max() > 1e-3


def test_cls_attention_scorer_is_the_cls_row_transformers_returns(encoder, special):
    r = router(encoder, special, cross_attend="top", scorer="cls_attention")
    encoder.backbone.set_attn_implementation("eager")  # so that transformers returns attention probabilities
    sb = batch_of(special, SENTS)
    with torch.no_grad():
        attentions = encoder.backbone(**sb, output_attentions=True).attentions[r.t]  # (b, heads, n, n)
        ref = attentions[:, :, 0, :].mean(1)  # the [CLS] row, head-averaged
        sent = r.encode_sentences(SENTS)
        cond = r.encode_conditions(CONDS)
        empty = RouterCondition(None, cond.tokens, torch.zeros_like(cond.mask))
        _, route = r.route(sent, empty, torch.arange(len(SENTS)))
        torch.testing.assert_close(route.seen[r.t], ref * sb["attention_mask"], atol=1e-5, rtol=1e-5)
        # with the condition's tokens as keys, w is the [CLS] row over the sentence's keys, renormalised
        _, route = r.route(sent, cond, torch.arange(len(SENTS)))
        cb = batch_of(special, CONDS)
        _, probs = top_layer_by_hand(encoder.backbone.encoder.layer[r.t], sent[0][:, :, -1], sent[1],
                                     cond.tokens, cb["attention_mask"], torch.ones(sent[1].shape))
        m = cb["attention_mask"].shape[1]
        part = probs[:, :, 0, m:].mean(1) * sent[1]
        torch.testing.assert_close(route.seen[r.t], part / part.sum(1, keepdim=True), atol=1e-5, rtol=1e-5)
        assert (route.seen[r.t] - ref * sb["attention_mask"]).abs().max() > 1e-3
    with pytest.raises(KGCError, match="cross_attend=top"):
        router(encoder, special, scorer="cls_attention")


def test_cross_attend_top_cached_equals_uncached(encoder, special, tmp_path):
    r = router(encoder, special, cross_attend="top")
    with torch.no_grad():
        plain = r(SENTS, CONDS)
        encoder.cache = LayerCache(layer=r.t, model_hash=lower_weights_hash(encoder.backbone, r.t), tokenizer_hash="t",
                                   hidden=encoder.dim, folder=tmp_path / "c")
        first = r(SENTS, CONDS)  # fills the cache (sentences and conditions below t)
        misses = encoder.cache.misses
        second = r(SENTS, CONDS)
    assert misses == 5 and encoder.cache.misses == misses and encoder.cache.hits > 0  # 3 sentences + 2 conditions
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, plain, atol=2e-3, rtol=0)  # fp16 storage of the states at layer t


def test_biencoder_router_with_zero_weights_is_the_plain_biencoder(encoder, special, monkeypatch):
    plain = build_conditioner("biencoder", encoder=encoder, special=special, max_tokens=24).eval()
    routed = build_conditioner("biencoder", encoder=encoder, special=special, max_tokens=24, router_layers=1).eval()
    with torch.no_grad():
        ref = plain(SENTS, CONDS)
        _, route = routed.route(SENTS, CONDS, torch.arange(len(SENTS)))
        w = route.seen[1]  # the top layer's w: the condition's rows over the sentence's tokens
        cols = route.score_cols.float()
        torch.testing.assert_close(w.sum(1), torch.ones(len(w)))
        assert float((w * (1 - cols)).abs().sum()) == 0.0  # the condition's own tokens get no weight
        assert (routed(SENTS, CONDS) - ref).abs().max() > 2e-4  # (1e-5 below, with w ≡ 0)
        monkeypatch.setattr("kgc.conditioning.routing.weights_from_attention",
                            lambda probs, rows, cols, renormalise=True: torch.zeros(cols.shape))
        torch.testing.assert_close(routed(SENTS, CONDS), ref, atol=1e-5, rtol=1e-5)


def test_biencoder_router_weights_are_the_conditions_attention_on_the_sentence(encoder, special):
    routed = build_conditioner("biencoder", encoder=encoder, special=special, max_tokens=24, router_layers=1).eval()
    encoder.backbone.set_attn_implementation("eager")
    s, c = SENTS[0], CONDS[1]
    ids, types = special.wrap_pair(s, c, 24)
    batch = special.pad([(ids, types)])
    with torch.no_grad():
        att = encoder.backbone(**batch, output_attentions=True).attentions[1][0].mean(0)  # (n, n) head-averaged
        _, route = routed.route([s], [c], torch.tensor([0]))
    n_sent = 1 + len(s)  # [CLS] + the sentence's tokens
    cond_rows = list(range(n_sent + 1, n_sent + 1 + len(c)))  # after the [SEP]: the condition's tokens
    ref = att[cond_rows][:, :n_sent].mean(0)
    torch.testing.assert_close(route.seen[1][0, :n_sent], ref / ref.sum(), atol=1e-5, rtol=1e-5)


def test_routing_substitutes_the_attention_modules_and_keeps_names_weights_and_outputs(encoder, special):
    """RoutedSelfAttention replaces ``attention.self`` in place: same state-dict keys (checkpoints saved without
    routing load), the same parameter tensors, bit-identical outputs outside a route, deepcopy, train/eval and
    Hugging Face's ``output_attentions`` hooks keep working, and a second router on the same layers adds a switch."""
    import copy
    import pickle

    from transformers.models.bert.modeling_bert import BertSelfAttention

    from kgc.conditioning.routing import RoutedSelfAttention

    backbone = encoder.backbone
    backbone.set_attn_implementation("eager")
    batch = batch_of(special, SENTS)
    before_keys = list(backbone.state_dict())
    saved = {k: v.clone() for k, v in backbone.state_dict().items()}
    weights = [layer.attention.self.query.weight for layer in backbone.encoder.layer]
    alone = copy.deepcopy(encoder)  # never routed: the reference for a second router below
    with torch.no_grad():
        plain = encoder(**batch)
        plain_att = backbone(**batch, output_attentions=True).attentions
    r = router(encoder, special, cross_attend="all")  # routes every layer
    for layer, w in zip(backbone.encoder.layer, weights):
        assert isinstance(layer.attention.self, RoutedSelfAttention)
        assert isinstance(layer.attention.self, BertSelfAttention) and layer.attention.self.query.weight is w
    assert list(backbone.state_dict()) == before_keys and "encoder.layer.0.attention.self.query.weight" in before_keys
    assert not [k for k in r.state_dict() if not k.startswith("encoder.")]  # the switch owns no weights
    backbone.load_state_dict(saved, strict=True)
    with torch.no_grad():
        assert torch.equal(encoder(**batch), plain)  # outside a route: the original forward, bit for bit
        att = backbone(**batch, output_attentions=True).attentions
        assert len(att) == len(plain_att) and all(torch.equal(a, b) for a, b in zip(att, plain_att))
        twin = copy.deepcopy(encoder)
        assert torch.equal(twin(**batch), plain)
        assert twin.backbone.encoder.layer[0].attention.self.query.weight is not weights[0]
        routed = r(SENTS, CONDS)
        assert (routed - plain).abs().max() > 1e-3
    encoder.train()
    assert all(layer.attention.self.training for layer in backbone.encoder.layer)
    encoder.eval()
    second = router(encoder, special)  # k = 1: the top layer, already routed by the first
    assert len(backbone.encoder.layer[-1].attention.self.switches) == 2
    assert len(backbone.encoder.layer[0].attention.self.switches) == 1
    with torch.no_grad():
        assert torch.equal(second(SENTS, CONDS), router(alone, special)(SENTS, CONDS))
        assert torch.equal(r(SENTS, CONDS), routed)
        # a routed encoder pickles (torch.save(model)); this one never had Hugging Face's output hooks, which do not
        pickled = pickle.loads(pickle.dumps(alone))
        top = pickled.backbone.encoder.layer[-1].attention.self
        assert type(top) is type(backbone.encoder.layer[-1].attention.self)
        assert torch.equal(pickled(**batch), plain)


def run_dir(tmp_path, tiny_bert, model, name):
    from tests.test_end_to_end import kgc, write_recipe

    run = tmp_path / name
    kgc("train", write_recipe(tmp_path / f"{name}.yaml", tiny_bert, model, {"trainable_layers": 1}, max_steps=2),
        "--out", run, "--no-progress")
    return run


@pytest.mark.slow
@pytest.mark.parametrize("model", [{"conditioner": "router", "cross_attend": "top"},
                                   {"conditioner": "biencoder", "router_layers": 1}],
                         ids=["router-top", "biencoder-csr"])
def test_explain_prints_one_weight_per_token_summing_to_one(model, tiny_bert, tmp_path, data_home, monkeypatch):
    from tests.test_end_to_end import kgc

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = run_dir(tmp_path, tiny_bert, model, "run")
    out = kgc("explain", run, "--head", "virus", "--relation", "isa", "--relation", "causes").stdout
    lines = out.splitlines()
    assert lines[0].split() == ["token", "R1", "R2", "Δ"] and "R1 = isa  R2 = causes" in out
    assert "(moved)" in out and "w on special tokens:" in out
    rows = lines[1: lines.index(next(x for x in lines if x.startswith("(sum)")))]
    assert rows[0].split()[0] == "[CLS]" and "virus" in [r.split()[0] for r in rows]
    # the router weighs [CLS] s [SEP]; inside the bi-encoder, [CLS] and the head's tokens of [CLS] s [SEP] r [SEP]
    assert (rows[-1].split()[0] == "[SEP]") == (model["conditioner"] == "router")
    weights = torch.tensor([[float(v) for v in r.split()[1:3]] for r in rows])  # (tokens, 2)
    torch.testing.assert_close(weights.sum(0), torch.ones(2), atol=3e-3, rtol=0)  # printed to 3 decimals
    png = run / "explain.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    every = json.loads(kgc("explain", run, "--head", "virus", "--json", "--out", tmp_path / "all.png").stdout)
    assert len(every["conditions"]) == 46 and (tmp_path / "all.png").is_file()  # default: every relation
    for row in every["weights"].values():
        assert len(row) == len(every["tokens"]) and sum(row) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_explain_hypernet_spectra_and_clear_refusals(tiny_bert, tmp_path, data_home, monkeypatch):
    from tests.test_end_to_end import kgc

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    run = run_dir(tmp_path, tiny_bert, {"conditioner": "hypernet", "rank": 4}, "hyper")
    out = json.loads(kgc("explain", run, "--relation", "isa", "--json").stdout)
    sv = torch.tensor(out["singular_values"]["isa"])
    assert len(sv) == 32 and bool((sv[:-1] >= sv[1:] - 1e-6).all())
    assert float(sv[4:].max()) < 1e-4 * float(sv[0])  # W1 W2ᵀ has rank K = 4
    assert 1.0 <= out["effective_rank"]["isa"] <= 4.0
    plain = run_dir(tmp_path, tiny_bert, {"conditioner": "biencoder"}, "plain")
    bad = kgc("explain", plain, "--head", "virus", check=False)
    assert bad.returncode == 2 and "biencoder without router_layers" in bad.stderr


def test_conditioner_lr_puts_the_conditioners_own_parameters_in_their_own_groups(encoder, special):
    from kgc.training.common import make_optimizer

    hyper = build_conditioner("hypernet", encoder=encoder, special=special, max_tokens=24, rank=4)
    own = {id(p) for n, p in hyper.named_parameters() if not n.startswith("encoder.")}
    opt = make_optimizer([hyper], 1e-4, 0.01, other=own, other_lr=1e-2)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(lr) == len(list(hyper.parameters())) == sum(len(g["params"]) for g in opt.param_groups)
    assert len(own) == 4 and all(lr[i] == 1e-2 for i in own)  # the two generators' weights and biases
    assert all(lr[id(p)] == 1e-4 for p in encoder.parameters())
    assert decay[id(hyper.gen1.bias)] == 0.0 and decay[id(hyper.gen1.weight)] == 0.01
    plain = make_optimizer([hyper], 1e-4, 0.01, other=own)  # no conditioner_lr: one lr for all
    assert {g["lr"] for g in plain.param_groups} == {1e-4} and len(plain.param_groups) == 2


def test_an_option_of_another_conditioner_is_an_error_not_a_silent_no_op():
    from kgc.recipe import load_recipe

    with pytest.raises(KGCError, match="model.cross_attend: not read by model.conditioner=biencoder .only by router"):
        load_recipe(None, ["model.conditioner=biencoder", "model.cross_attend=top"])
    with pytest.raises(KGCError, match="model.rank: not read by model.conditioner=router .only by hypernet"):
        load_recipe(None, ["model.conditioner=router", "model.rank=8"])
    assert load_recipe(None, ["model.conditioner=router", "model.cross_attend=top"]).model.cross_attend == "top"
    assert load_recipe(None, ["model.conditioner=biencoder", "model.router_layers=2"]).model.router_layers == 2


def test_runs_saved_before_cross_attend_existed_keep_their_plain_bi_encoder(tmp_path):
    """Their recipe.yaml lists router_layers: 1 for every conditioner (the router's default then)."""
    from kgc.recipe import load_recipe

    old = tmp_path / "recipe.yaml"
    old.write_text("name: old\nmodel: {conditioner: biencoder, router_layers: 1, weighting: one_plus_w}\n")
    assert load_recipe(old, saved=True).model.router_layers is None
    assert load_recipe(old).model.router_layers == 1  # a recipe someone writes today means it
    old.write_text("name: old\nmodel: {conditioner: router, router_layers: 2}\n")
    assert load_recipe(old, saved=True).model.router_layers == 2
