"""A CSR router that routes: w over the sentence's words, (1 + w) on the values, the paper's q^c — computed by
hand; ``kgc explain``'s spread and its condition-blind warning; the synthetic graph where the condition decides which
token matters, on which a trained router must put w on that token (and a relation-blind weighting must not)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kgc.conditioning import build_conditioner
from kgc.conditioning.routing import word_mask
from kgc.encoding.backbone import pool
from kgc.errors import KGCError
from tests.test_layered import batch_of, encoder, special  # noqa: F401  (fixtures shared with it)

SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005]]
CONDS = [[3000], [3001, 3002, 3003], [3004, 3005]]
NEG = torch.finfo(torch.float32).min


def router(encoder, special, **kw):
    return build_conditioner("router", encoder=encoder, special=special, max_tokens=24, **kw).eval()


def test_word_mask_drops_the_special_tokens_around_each_sentence():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    assert word_mask(mask, 1, 1).tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [1, 1, 0, 0, 0]]  # no word: all
    assert word_mask(mask, 1, 0).tolist() == [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [0, 1, 0, 0, 0]]


def values_layer_by_hand(layer, hidden, mask, factor):
    """One BERT layer from its submodules with token j's value × factor_j (the router's route_scales: values)."""
    attn = layer.attention.self
    b, n, _ = hidden.shape
    split = lambda x: x.view(b, n, attn.num_attention_heads, -1).transpose(1, 2)  # noqa: E731
    scores = split(attn.query(hidden)) @ split(attn.key(hidden)).transpose(-1, -2) * attn.scaling
    probs = (scores + (1 - mask[:, None, None, :].float()) * NEG).softmax(-1)
    values = split(attn.value(hidden) * factor.unsqueeze(-1))
    ctx = (probs @ values).transpose(1, 2).reshape(b, n, -1)
    out = layer.attention.output(ctx, hidden)
    return layer.output(layer.intermediate(out), out)


def test_the_default_router_is_the_papers_query_over_words_scaling_values(encoder, special):
    """k = 1: q^c = the last layer's query projection of the condition's [CLS]; w = softmax over the sentence's
    words of q^c · K / √H; [CLS] and [SEP] get w = 0 and factor 1; 1 + w_j − 1/n (the default, centred) or 1 + w_j
    (one_plus_w) multiplies token j's value."""
    rc = router(encoder, special)
    assert (rc.scorer, rc.route_over, rc.route_scales, rc.weighting) == ("paper", "words", "values", "centred")
    r = router(encoder, special, weighting="one_plus_w")
    last = encoder.backbone.encoder.layer[r.t]
    with torch.no_grad():
        sb, cb = batch_of(special, SENTS), batch_of(special, CONDS)
        hidden = encoder.hidden_at(sb, r.t)[:, :, -1]  # (batch, len, H) entering the router layer
        cls = encoder.hidden_at(cb, r.t)[:, 0, -1]  # the condition's [CLS] entering the last layer
        q = last.attention.self.query(cls)  # (batch, H)
        k = last.attention.self.key(hidden)  # (batch, len, H)
        mask = sb["attention_mask"]
        words = mask.clone()
        words[:, 0] = 0
        words[torch.arange(len(SENTS)), mask.sum(1) - 1] = 0  # [SEP]
        scores = torch.einsum("bh,bnh->bn", q, k) / math.sqrt(k.shape[-1])
        w = scores.masked_fill(words == 0, float("-inf")).softmax(-1)
        out = values_layer_by_hand(last, hidden, mask, 1 + w)
        ref = F.normalize(pool(out, mask, "mean"), dim=-1)
        torch.testing.assert_close(r(SENTS, CONDS), ref, atol=1e-5, rtol=1e-5)
        # the old routing (w over every token, on the context vectors) is another model on the same weights
        old = router(encoder, special, route_over="all", route_scales="context")
        assert (old(SENTS, CONDS) - ref).abs().max() > 1e-3
        # centred: 1 + w − 1/n on the n words (1 on [CLS], [SEP]); a one-word sentence is left as the plain encoder
        n = words.sum(1, keepdim=True).float()
        centred = torch.where(words > 0, 1 + w - 1 / n, torch.ones_like(w))
        out_c = values_layer_by_hand(last, hidden, mask, centred)
        torch.testing.assert_close(rc(SENTS, CONDS), F.normalize(pool(out_c, mask, "mean"), dim=-1), atol=1e-5,
                                   rtol=1e-5)
        plain = F.normalize(pool(encoder.backbone(**sb).last_hidden_state, mask, "mean"), dim=-1)
        torch.testing.assert_close(rc(SENTS, CONDS)[1], plain[1], atol=1e-5, rtol=1e-5)  # SENTS[1] is one word
        assert (r(SENTS, CONDS)[1] - plain[1]).abs().max() > 1e-3  # (1 + w) doubles that word's value
        got = r.explain(CONDS, SENTS[0]).values  # explain shows that w: 0 on [CLS] and [SEP], words sum to 1
        assert got[:, 0].abs().max() == 0 and got[:, -1].abs().max() == 0
        torch.testing.assert_close(got[0], w[0, :6], atol=1e-6, rtol=0)


def test_temperature_and_the_learned_scorer(encoder, special):
    r1, r_half = router(encoder, special, scorer="query_key"), router(encoder, special, scorer="query_key",
                                                                       route_temperature=0.5)
    with torch.no_grad():
        w1 = r1.explain(CONDS, SENTS[0]).values
        w_half = r_half.explain(CONDS, SENTS[0]).values
    assert (w_half.max(1).values >= w1.max(1).values - 1e-6).all()  # τ < 1 concentrates w
    learned = router(encoder, special, scorer="learned")
    with torch.no_grad():
        sb, cb = batch_of(special, SENTS), batch_of(special, CONDS)
        hidden = encoder.hidden_at(sb, learned.t)[:, :, -1]
        cstates = encoder.hidden_at(cb, learned.t)[:, :, -1]
        cm = cb["attention_mask"].unsqueeze(-1).float()
        query = learned.w_route((cstates * cm).sum(1) / cm.sum(1))  # W c̄
        scores = torch.einsum("bh,bnh->bn", query, hidden) / (learned.heads * math.sqrt(learned.head_dim))
        words = word_mask(sb["attention_mask"], 1, 1)
        w = scores.masked_fill(words == 0, float("-inf")).softmax(-1)
        torch.testing.assert_close(learned.explain(CONDS, SENTS[0]).values[0], w[0, :6], atol=1e-6, rtol=0)
    assert "w_route.weight" in dict(learned.named_parameters())  # trained, saved with the conditioner
    with pytest.raises(KGCError, match="route_temperature applies"):
        router(encoder, special, scorer="cls_attention", cross_attend="top", route_temperature=0.5)
    assert router(encoder, special, scorer="cls_attention", cross_attend="top").route_scales == "context"
    with pytest.raises(KGCError, match="route_scales=values"):
        router(encoder, special, scorer="cls_attention", cross_attend="top", route_scales="values")


def test_runs_saved_before_word_routing_route_as_they_were_trained(tmp_path):
    from kgc.recipe import load_recipe

    old = tmp_path / "recipe.yaml"
    old.write_text("name: old\nmodel: {conditioner: router, router_layers: 1, scorer: query_key}\n")
    m = load_recipe(old, saved=True).model
    assert (m.scorer, m.route_over, m.route_scales, m.weighting) == ("query_key", "all", "context", "one_plus_w")
    m = load_recipe(old).model  # a recipe someone writes today gets today's routing
    assert (m.scorer, m.route_over, m.route_scales, m.weighting) == ("query_key", "words", "values", "centred")
    (tmp_path / "metrics.jsonl").write_text("")  # the file in a run folder: `kgc train RUN/recipe.yaml` reads it as
    m = load_recipe(old).model                    # the run was trained
    assert (m.scorer, m.route_over, m.route_scales, m.weighting) == ("query_key", "all", "context", "one_plus_w")
    new = load_recipe(None, ["model.conditioner=router"])  # a new run's recipe.yaml names its routing
    assert "route_scales: values" in new.to_yaml() and "weighting: centred" in new.to_yaml()
    assert load_recipe(None, ["model.conditioner=router"]).model.scorer == "paper"
    # every key was saved then, weighting: one_plus_w included, also by conditioners that do not read it
    old = tmp_path / "other" / "recipe.yaml"
    old.parent.mkdir()
    old.write_text("name: old\nmodel: {conditioner: hypernet, weighting: one_plus_w, scorer: query_key}\n")
    m = load_recipe(old, saved=True).model  # version 1's unread keys dropped on upgrade: hypernet has none of them
    assert m.conditioner == "hypernet" and "weighting" not in m.model_dump() and "scorer" not in m.model_dump()


def test_explain_measures_the_spread_and_says_when_routing_is_condition_blind():
    from kgc.explain import Explanation, render_text

    values = np.array([[0.90, 0.05, 0.05, 0.00], [0.90, 0.04, 0.06, 0.00]])
    ex = Explanation("tokens", ["r1", "r2"], values, tokens=["[CLS]", "a", "b", "[SEP]"],
                     layers=[1], special=[True, False, False, True])
    np.testing.assert_allclose(ex.special_share(), [0.90, 0.90])
    np.testing.assert_allclose(ex.spread(), [0.005, 0.005])  # ½ (|0.05 − 0.045| + |0.05 − 0.055|)
    assert ex.condition_blind() is True
    text = render_text(ex)
    assert "condition-blind" in text and "w on special tokens: 0.900" in text
    routed = Explanation("tokens", ["r1", "r2"], np.array([[0, 0.8, 0.2, 0], [0, 0.2, 0.8, 0]]),
                         tokens=["[CLS]", "a", "b", "[SEP]"], layers=[1], special=[True, False, False, True])
    np.testing.assert_allclose(routed.spread(), [0.3, 0.3])
    assert routed.condition_blind() is False and "condition-blind" not in render_text(routed)
    assert routed.to_json()["spread"] == {"r1": 0.3, "r2": 0.3} and routed.to_json()["condition_blind"] is False


# --- the synthetic graph where the condition decides ---------------------------------------------------------------

def test_the_routing_graph_answers_relation_i_with_the_heads_ith_word(tmp_path, tokenizer):
    from kgc.data.routing_synth import routing_graph, write_routing_graph

    g = routing_graph(slots=3, heads=60, seed=1)
    assert g == routing_graph(slots=3, heads=60, seed=1)  # deterministic
    ents = g["entities"]
    for h, r, t in g["train"] + g["dev"] + g["test"]:
        words = ents[h].split()
        assert ents[t] == words[g["positions"][r] - 1]
        assert tokenizer.tokenize(ents[h]) == words  # one token per word: position i + 1 is slot i
    tails = {t for _, _, t in g["train"]}
    assert all(e in tails for e in ents if e.startswith("w_"))  # every answer word is seen in training
    heads_train = {h for h, _, _ in g["train"]}
    assert all(h in heads_train for h, _, _ in g["dev"] + g["test"])
    out = write_routing_graph(tmp_path / "g", slots=3, heads=60, seed=1)
    assert sorted(p.name for p in out.iterdir()) == ["dev.tsv", "entity2text.txt", "relation2text.txt",
                                                     "test.tsv", "train.tsv"]
    with pytest.raises(KGCError, match="heads=600"):
        routing_graph(slots=3, heads=600)
    from tests.conftest import cli

    res = cli("data", "synth-routing", str(tmp_path / "c"), "--heads", "60", "--seed", "1")
    assert "train " + str(len(g["train"])) in res.stdout
    assert (tmp_path / "c" / "train.tsv").read_text() == (out / "train.tsv").read_text()
    assert cli("data", "synth-routing", str(tmp_path / "d"), "--slots", "9", check=False).exit_code == 2


def routed_mass(run_dir: Path, graph: dict, n_heads: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(own, other, w): the mean w on slot i's token under relation i, under the other relations; w itself
    (heads, relations, tokens) over the first ``n_heads`` heads of the graph."""
    import kgc
    from kgc.explain import explain

    run = kgc.load(run_dir, device="cpu", echo=None)
    rels = list(graph["relations"])
    heads = [e for e in graph["entities"] if e.startswith("h")][:n_heads]
    w = np.stack([explain(run.explain_inputs(head=h, relations=rels))[0].values for h in heads])
    return check_routing(w, [graph["positions"][r] for r in rels]) + (w,)


def check_routing(w: np.ndarray, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
    own = np.array([w[:, i, p].mean() for i, p in enumerate(positions)])
    other = np.array([np.mean([w[:, j, p].mean() for j in range(len(positions)) if j != i])
                      for i, p in enumerate(positions)])
    return own, other


def train_router(tmp_path: Path, data: Path, name: str, sets: list[str]) -> Path:
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    recipe = load_recipe(None, [f"data.path={data}", "model.conditioner=router",
                                "data.neighbor_text=false", "data.max_tokens=16", "train.batch_size=32",
                                "train.warmup_steps=5", "eval.validate_every_epoch=false",
                                f"name={name}"] + sets)
    train(recipe, out=tmp_path / name, progress=False, echo=lambda m: None)
    return tmp_path / name


def test_a_tiny_trained_router_puts_w_on_the_token_its_relation_needs(tmp_path, tiny_bert, monkeypatch):
    """A 2-layer random BERT, the learned scorer (the paper's q^c needs a pretrained condition encoder to tell the
    relations apart): after 8 epochs w on slot i's token under relation i is ≥ 1.3× its mean under the others.
    The same check fails for a relation-blind weighting: every relation's w replaced by their mean."""
    from kgc.data.routing_synth import routing_graph, write_routing_graph

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    data = write_routing_graph(tmp_path / "graph")
    run = train_router(tmp_path, data, "tiny", [f"model.backbone={tiny_bert}", "model.scorer=learned", "train.lr=1e-3",
                                                           "train.epochs=8", "encoder.trainable_layers=all"])
    own, other, w = routed_mass(run, routing_graph())
    assert (own >= 1.3 * other).all(), (own, other)  # measured: 1.75×, 1.66×, 1.49×
    blind = np.repeat(w.mean(1, keepdims=True), w.shape[1], axis=1)  # the same w under every relation
    b_own, b_other = check_routing(blind, [1, 2, 3])
    assert not (b_own >= 1.3 * b_other).any()


@pytest.mark.slow
def test_minilm_router_routes_where_the_condition_decides_and_the_old_routing_does_not(tmp_path, monkeypatch):
    """all-MiniLM-L6-v2, router k = 2 over the top 2 layers, 8 epochs of the synthetic graph: the default router
    (the paper's q^c, w over words, values × (1 + w − 1/n)) puts ≥ 3× more w on the needed token under its relation and
    ranks the answers (test MRR ≥ 0.9); the routing before 2026-11-24 (query_key, w over every token, context
    scaled) is condition-blind (own within 10 % of other) and ranks like a blind model."""
    import kgc
    from kgc.data.routing_synth import routing_graph, write_routing_graph

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    data = write_routing_graph(tmp_path / "graph")
    common = ["model.backbone=sentence-transformers/all-MiniLM-L6-v2", "encoder.trainable_layers=2",
              "model.router_layers=2", "train.lr=3e-4", "train.epochs=8"]
    new = train_router(tmp_path, data, "new", common)
    old = train_router(tmp_path, data, "old", common + ["model.scorer=query_key", "model.route_over=all",
                                                         "model.route_scales=context", "model.weighting=one_plus_w"])
    own, other, _ = routed_mass(new, routing_graph())
    assert (own >= 3 * other).all(), (own, other)
    o_own, o_other, _ = routed_mass(old, routing_graph())
    assert (np.abs(o_own - o_other) <= 0.1 * o_other).all(), (o_own, o_other)
    mrr = {name: kgc.load(d, device="cpu", echo=None).evaluate("test")["both"]["realistic"]["inverse_harmonic_mean_rank"]
           for name, d in (("new", new), ("old", old))}
    assert mrr["new"] >= 0.9 and mrr["old"] <= 0.8, mrr
