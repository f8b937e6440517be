"""Generic cases every conditioner must pass, and a meta-test that fails when a new one has no case."""

from __future__ import annotations

import pytest
import torch

from kgc.conditioning import CONDITIONERS, build_conditioner
from kgc.data.texts import SpecialTokens
from kgc.encoding.backbone import TextEncoder

# case id → (registry name, kwargs) for the generic cases; every registered conditioner needs one
CASES = {
    "biencoder": ("biencoder", {}),
    "biencoder-csr-2": ("biencoder", {"router_layers": 2}),
    "hadamard": ("hadamard", {}),
    "concat": ("concat", {"dropout": 0.1}),
    "hypernet-lowrank": ("hypernet", {"rank": 4}),
    "hypernet-residual": ("hypernet", {"rank": 4, "hypernet_form": "residual"}),
    "hypernet-full": ("hypernet", {"hypernet_form": "full"}),
    "router": ("router", {}),
    "router-2-w_only-hidden": ("router", {"router_layers": 2, "weighting": "w_only", "scorer": "hidden"}),
    "router-heavy": ("router", {"scorer": "heavy"}),
    "router-top": ("router", {"cross_attend": "top"}),
    "router-top-2-cls_attention": ("router", {"router_layers": 2, "cross_attend": "top", "scorer": "cls_attention"}),
    "router-all": ("router", {"cross_attend": "all"}),
    "case": ("case", {}),
    "case-mlp-k16": ("case", {"case_projection": "mlp", "case_dim": 16}),
}


def test_every_registered_conditioner_has_a_case():
    assert set(CONDITIONERS) == {name for name, _ in CASES.values()}, \
        "add the new conditioner to CASES in tests/test_conditioners.py"


@pytest.fixture(scope="module")
def encoder(tokenizer):
    """3 layers (router variants with k = 1, 2), and a wider random init so [CLS] mixes in the condition."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=64, initializer_range=0.2)
    return TextEncoder(BertModel(config, add_pooling_layer=False)).eval()


@pytest.fixture(scope="module")
def special(tokenizer):
    return SpecialTokens.from_tokenizer(tokenizer)


def make(case, encoder, special):
    name, kwargs = CASES[case]
    torch.manual_seed(0)
    cond = build_conditioner(name, encoder=encoder, special=special, max_tokens=24, **kwargs).eval()
    with torch.no_grad():  # zero-initialised parts (residual Hyper-CL's W2) would hide the condition
        for n, p in cond.named_parameters():
            if not n.startswith("encoder.") and not p.any():
                p.normal_(0, 0.1)
    return cond


SENTS = [[2000, 2001, 2002], [2003], [2004, 2005], [2000, 2001, 2002]]
CONDS = [[3000], [3001, 3002], [3000], [3001, 3002]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_unit_vectors_of_the_right_shape(name, encoder, special):
    out = make(name, encoder, special)(SENTS, CONDS)
    assert out.shape == (4, CASES[name][1].get("case_dim", encoder.dim))
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(4))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_row_depends_only_on_its_own_pair(name, encoder, special):
    cond = make(name, encoder, special)
    with torch.no_grad():
        batch = cond(SENTS, CONDS)
        alone = torch.cat([cond([s], [c]) for s, c in zip(SENTS, CONDS)])
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    assert (batch[0] - batch[3]).abs().max() > 1e-6  # same sentence, other condition → other vector


@pytest.mark.parametrize("name", sorted(CASES))
def test_stages_compose_to_forward(name, encoder, special):
    cond = make(name, encoder, special)
    with torch.no_grad():
        staged = cond.combine(cond.encode_sentences(SENTS), cond.encode_conditions(CONDS), torch.arange(4))
        torch.testing.assert_close(staged, cond(SENTS, CONDS))


def test_encode_unique_equals_plain_forward(encoder, special):
    batch = special.pad([special.wrap(s, 24) for s in SENTS + SENTS[:2]])
    with torch.no_grad():
        torch.testing.assert_close(encoder.encode_unique(batch), encoder(**batch), atol=1e-5, rtol=1e-5)
    # gradients through a deduplicated row equal the sum over its uses, as in the plain forward
    weights = torch.randn(len(SENTS) + 2, encoder.dim, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (encoder.encode_unique, lambda b: encoder(**b)):
        encoder.zero_grad()
        (fn(batch) * weights).sum().backward()
        grads.append(encoder.backbone.embeddings.word_embeddings.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_router_refuses_to_read_the_condition_before_any_layer(encoder, special):
    from kgc.errors import KGCError

    with pytest.raises(KGCError, match="router_layers=3: choose 1..2"):
        build_conditioner("router", encoder=encoder, special=special, max_tokens=24, router_layers=3)


def test_unknown_conditioner_lists_the_known_ones(encoder, special):
    from kgc.errors import KGCError

    with pytest.raises(KGCError, match="Available: biencoder, case, concat, hadamard, hypernet, router"):
        build_conditioner("hypernett", encoder=encoder, special=special, max_tokens=24)
