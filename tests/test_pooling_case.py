"""S²Sent pooling against a hand loop of its equations, carried states through split encoders and the
layer cache, and CASE's subtraction and projection by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kgc.conditioning import build_conditioner
from kgc.data.texts import SpecialTokens
from kgc.encoding.backbone import TextEncoder
from kgc.encoding.cache import LayerCache, lower_weights_hash
from kgc.encoding.pooling import S2SentPooling, build_pooling

SENTS = [[2000, 2001, 2002, 2010], [2003], [2004, 2005], [2000, 2001, 2002, 2010]]
CONDS = [[3000], [3001, 3002], [3000], [3001, 3002]]


@pytest.fixture(scope="module")
def special(tokenizer):
    return SpecialTokens.from_tokenizer(tokenizer)


def backbone3(tokenizer):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=64, initializer_range=0.2)
    return BertModel(config, add_pooling_layer=False).eval()


def s2sent_by_hand(pool: S2SentPooling, states: torch.Tensor, mask: torch.Tensor, freqs) -> torch.Tensor:
    """The paper's equations, one sentence and one feature at a time."""
    bsz, _, _, h = states.shape
    n, m = pool.n, len(freqs)
    out = []
    for i in range(bsz):
        tokens = [j for j in range(mask.shape[1]) if mask[i, j]]
        big_l = len(tokens)
        x = states[i, :, -n:]  # (len, n, H)
        z = torch.zeros(h)
        for d in range(h):
            u, v = freqs[d // (h // m)]
            total = 0.0
            for b in range(n):
                for p, j in enumerate(tokens):
                    bu = math.cos(math.pi * u * (b + 0.5) / n) * (1 if u == 0 else math.sqrt(2))
                    bv = math.cos(math.pi * v * (p + 0.5) / big_l) * (1 if v == 0 else math.sqrt(2))
                    total += float(x[j, b, d]) * bu * bv
            z[d] = total / (n * big_l)
        s = torch.relu(pool.excite.weight @ z + pool.excite.bias)
        gates = torch.stack([torch.sigmoid(w2.weight @ s + w2.bias) for w2 in pool.gates])  # (n, H)
        alpha = torch.exp(gates) / torch.exp(gates).sum(0, keepdim=True)  # softmax over blocks, per feature
        fused = [sum(alpha[b] * x[j, b] for b in range(n)) for j in tokens]  # (L, H)
        out.append(torch.stack(fused).mean(0))
    return torch.stack(out)


@pytest.mark.parametrize("contiguous", [True, False])
def test_s2sent_follows_the_equations(contiguous):
    torch.manual_seed(0)
    pool = S2SentPooling(8, blocks=3, frequencies=4, reduction=2)
    states = torch.randn(2, 6, 3, 8)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]) if contiguous else \
        torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0]])  # a span, as CASE pools its condition
    assert pool.freqs == [(0, 0), (0, 1), (1, 0), (1, 1)]  # the zig-zag order's lowest four with u < 3
    with torch.no_grad():
        torch.testing.assert_close(pool(states, mask), s2sent_by_hand(pool, states, mask, pool.freqs),
                                   atol=1e-5, rtol=1e-5)
        far = states.clone()
        far[mask == 0] = 1e3  # what is not pooled never matters
        torch.testing.assert_close(pool(far, mask), pool(states, mask))


def test_s2sent_reduces_to_mean_pooling():
    torch.manual_seed(0)
    states, mask = torch.randn(3, 5, 3, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    last_mean = (states[:, :, -1] * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    one = S2SentPooling(8, blocks=1, frequencies=1, reduction=2)  # n = 1, m = 1: the last block, averaged
    torch.testing.assert_close(one(states, mask), last_mean)
    equal = S2SentPooling(8, blocks=3, frequencies=1, reduction=2)
    with torch.no_grad():  # equal gates: α = 1/n, the mean over blocks of each block's mean pooling
        for w2 in equal.gates:
            w2.weight.zero_()
            w2.bias.fill_(0.3)
        blocks_mean = (states.mean(2) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        torch.testing.assert_close(equal(states, mask), blocks_mean)
        # and m = 1 squeezes to the plain average of every block and token
        z = (states * mask[:, :, None, None]).sum((1, 2)) / (3 * mask.sum(1, keepdim=True))
        torch.testing.assert_close(equal.squeeze(states, mask), z)


def test_s2sent_rejects_bad_options():
    from kgc.errors import KGCError

    with pytest.raises(KGCError, match="s2sent_frequencies=3 must divide the hidden size 8"):
        S2SentPooling(8, blocks=2, frequencies=3)
    with pytest.raises(KGCError, match="s2sent_blocks=5: the backbone has only 3 layers"):
        build_pooling("s2sent", 32, 3, s2sent_blocks=5)


def test_split_encoders_carry_the_pooled_blocks(tokenizer, special, tmp_path):
    """With S²Sent over the last 3 of 3 layers, a split at t carries the outputs below t that it fuses."""
    enc = TextEncoder(backbone3(tokenizer), "s2sent", s2sent_blocks=3, s2sent_frequencies=2,
                      s2sent_reduction=4).eval()
    batch = special.pad([special.wrap(s, 24) for s in SENTS])
    with torch.no_grad():
        hs = enc.backbone(**batch, output_hidden_states=True).hidden_states  # embeddings + 3 layers
        ref = F.normalize(enc.pooler(torch.stack(hs[-3:], 2), batch["attention_mask"]), dim=-1)
        torch.testing.assert_close(enc(**batch), ref, atol=1e-5, rtol=1e-5)
        for t in range(4):
            states = enc.hidden_at(batch, t)
            assert states.shape[2] == enc.carried(t) == {0: 1, 1: 1, 2: 2, 3: 3}[t]
            torch.testing.assert_close(states[:, :, -1], hs[t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(enc.run_from(states, batch["attention_mask"], t), ref, atol=1e-5, rtol=1e-5)
        enc.cache = LayerCache(layer=2, model_hash=lower_weights_hash(enc.backbone, 2), tokenizer_hash="t",
                               hidden=enc.dim, depth=enc.carried(2), folder=tmp_path / "c")
        cached = enc(**batch)
        assert enc.cache.misses == 3
        enc.cache.save()
        again = LayerCache(layer=2, model_hash=lower_weights_hash(enc.backbone, 2), tokenizer_hash="t",
                           hidden=enc.dim, depth=2, folder=tmp_path / "c")
        assert next(iter(again.states.values())).shape[1:] == (2, enc.dim)  # (len, K, H) per sequence
        enc.cache = again
        torch.testing.assert_close(enc(**batch), cached)
    torch.testing.assert_close(cached, ref, atol=3e-3, rtol=0)  # fp16 storage of the layer-1 and -2 outputs


def test_router_with_s2sent_keeps_the_lower_blocks_per_sentence(tokenizer, special, monkeypatch):
    enc = TextEncoder(backbone3(tokenizer), "s2sent", s2sent_blocks=3, s2sent_frequencies=2,
                      s2sent_reduction=4).eval()
    router = build_conditioner("router", encoder=enc, special=special, max_tokens=24,
                               scorer="query_key", route_over="all", route_scales="context", weighting="one_plus_w").eval()
    states, _ = router.encode_sentences(SENTS)
    assert states.shape[2] == 2  # the output of layer 1 (fused later) and the state entering layer 2
    monkeypatch.setattr(router, "weights", lambda s, mask, query: torch.zeros(mask.shape))
    with torch.no_grad():  # w ≡ 0: the router is the plain encoder, S²Sent and all
        torch.testing.assert_close(router(SENTS, CONDS), enc(**special.pad([special.wrap(s, 24) for s in SENTS])),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", ["paper", "legacy"])
@pytest.mark.parametrize("projection", ["linear", "mlp"])
def test_case_subtracts_the_unconditional_condition_then_projects(tokenizer, special, projection, head):
    """e(s | c) = P(f(c; s) − f(c; ∅)), P by hand: the paper's heads (eqs. 3–5: linear W e; mlp ReLU(W2 ReLU(W1 e)),
    no biases) or the legacy ones (mlp W2 LeakyReLU(W1 e + b1) + b2); dropout is off in eval mode."""
    enc = TextEncoder(backbone3(tokenizer)).eval()
    torch.manual_seed(0)
    case = build_conditioner("case", encoder=enc, special=special, max_tokens=24, case_projection=projection,
                             case_dim=12, case_head=head).eval()
    cls, sep = special.single[0][0], special.single[1][0]
    with torch.no_grad():
        refs = []
        for s, c in zip(SENTS, CONDS):
            pair = torch.tensor([[cls, *c, sep, *s, sep]])
            types = torch.tensor([[0] * (len(c) + 2) + [1] * (len(s) + 1)])
            hidden = enc.backbone(input_ids=pair, token_type_ids=types).last_hidden_state[0]
            given = F.normalize(hidden[1: 1 + len(c)].mean(0), dim=-1)  # the condition's tokens only
            alone = enc.backbone(input_ids=torch.tensor([[cls, *c, sep]])).last_hidden_state[0]
            alone = F.normalize(alone[1: 1 + len(c)].mean(0), dim=-1)
            diff = given - alone
            if projection == "linear":
                proj = case.proj.weight @ diff
            elif head == "paper":
                l1, l2 = case.proj[0], case.proj[3]
                assert l1.bias is None and l2.bias is None
                proj = F.relu(l2.weight @ F.relu(l1.weight @ diff))
            else:
                l1, l2 = case.proj[0], case.proj[3]
                proj = l2.weight @ F.leaky_relu(l1.weight @ diff + l1.bias) + l2.bias
            refs.append(F.normalize(proj, dim=-1))
        torch.testing.assert_close(case(SENTS, CONDS), torch.stack(refs), atol=1e-5, rtol=1e-5)
        tokens, alone = case.encode_conditions([[3000], [3001, 3002]])
        assert alone.shape == (2, enc.dim) and tokens == [[3000], [3001, 3002]]


def test_case_paper_heads_drop_out_as_the_paper_says(tokenizer, special):
    """Training mode: Dropout(0.2) after the linear head; Dropout(0.15) after each ReLU of the MLP (the paper's §4);
    the legacy linear head had none, and a legacy checkpoint's keys are what the legacy head loads."""
    enc = TextEncoder(backbone3(tokenizer))
    rates = lambda m: [x.p for x in m.modules() if isinstance(x, torch.nn.Dropout) and x.p > 0]  # noqa: E731
    lin = build_conditioner("case", encoder=enc, special=special, max_tokens=24, case_head="paper")
    mlp = build_conditioner("case", encoder=enc, special=special, max_tokens=24, case_projection="mlp")
    old = build_conditioner("case", encoder=enc, special=special, max_tokens=24, case_projection="mlp",
                            case_head="legacy")
    assert rates(lin.proj_dropout) == [0.2] and rates(mlp.proj) == [0.15, 0.15] and rates(old.proj) == [0.1]
    assert rates(build_conditioner("case", encoder=enc, special=special, max_tokens=24,
                                   case_head="legacy").proj_dropout) == []
    lin.train()
    torch.manual_seed(1)
    out = lin(SENTS, CONDS)  # dropout bites in training: some coordinates are exactly zero before normalising
    assert (out == 0).any() and torch.allclose(out.norm(dim=-1), torch.ones(len(SENTS)))
    keys = lambda m: sorted(k for k in m.state_dict() if k.startswith("proj"))  # noqa: E731
    assert keys(old) == ["proj.0.bias", "proj.0.weight", "proj.3.bias", "proj.3.weight"]
    assert keys(mlp) == ["proj.0.weight", "proj.3.weight"]  # an old checkpoint cannot load silently into the new head


def test_a_saved_case_recipe_from_before_case_head_reads_as_legacy(tmp_path):
    import yaml

    from kgc.recipe import load_recipe

    tree = {"name": "old", "model": {"conditioner": "case", "case_projection": "mlp"}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(tree))
    assert load_recipe(tmp_path / "recipe.yaml", saved=True).model.case_head == "legacy"
    assert load_recipe(tmp_path / "recipe.yaml").model.case_head == "paper"  # a recipe written today
    tree["model"]["case_head"] = "paper"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(tree))
    assert load_recipe(tmp_path / "recipe.yaml", saved=True).model.case_head == "paper"


def test_case_refuses_cls_pooling_and_a_width_the_entities_lack(tokenizer, special, tmp_path):
    from kgc.data.formats import read_graph
    from kgc.data.texts import TextBank
    from kgc.errors import KGCError
    from kgc.linkpred.model import LinkPredictor
    from tests.conftest import write_toy

    with pytest.raises(KGCError, match="pools the condition's own tokens"):
        build_conditioner("case", encoder=TextEncoder(backbone3(tokenizer), "cls"), special=special, max_tokens=24)
    bank = TextBank(read_graph(write_toy(tmp_path / "TOY")), tokenizer, max_tokens=24)
    enc = TextEncoder(backbone3(tokenizer))
    with pytest.raises(KGCError, match="gives 12-dimensional queries but entities are 32-dimensional"):
        LinkPredictor(enc, enc, bank, "case", case_dim=12)
    assert LinkPredictor(enc, enc, bank, "case").conditioner.out_dim == 32
