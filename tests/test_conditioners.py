"""Generic cases every conditioner must pass, and a meta-test that fails when a new one has no case.

Besides embedding, every conditioner describes itself (``describe``, for ``kgc compare``), says how an exported
query is formed (``export_spec``, for ``kgc export``) and either explains what its conditions select or refuses
with a clear error (``explain``, for ``kgc explain``): those tools never branch on a conditioner's name.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from kgc.conditioning import CONDITIONERS, Conditioner, build_conditioner
from kgc.conditioning.testing import CONDITIONS, SENTENCES, checked_build
from kgc.errors import KGCError
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
    "router-2-paper-top": ("router", {"router_layers": 2, "scorer": "paper", "cross_attend": "top"}),
    "router-top-cls_attention-raw": ("router", {"cross_attend": "top", "scorer": "cls_attention", "renormalise": False,
                                                "route_scales": "context"}),
    "router-top": ("router", {"cross_attend": "top"}),
    "router-top-2-cls_attention": ("router", {"router_layers": 2, "cross_attend": "top", "scorer": "cls_attention",
                                              "route_scales": "context"}),
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
    return checked_build(name, encoder, special, **kwargs)  # as kgc.testing's checks build it


SENTS, CONDS = SENTENCES, CONDITIONS  # rows 0 and 3: one sentence under two conditions


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


# --- describing itself: compare, export and explain ask the conditioner ---------------------------------------------

def constructor_defaults(cls) -> dict:
    """The defaults of the options ``cls`` declares, as its constructor states them."""
    params = inspect.signature(cls.__init__).parameters
    return {k: params[k].default for k in cls.options}


@pytest.mark.parametrize("name", sorted(CONDITIONERS))
def test_every_conditioner_describes_itself_for_its_default_options(name):
    cls = CONDITIONERS[name]
    assert set(cls.options) <= set(inspect.signature(cls.__init__).parameters), "each option is a constructor keyword"
    line = cls.describe(constructor_defaults(cls))
    assert line.startswith(name) and "\n" not in line
    assert cls.describe({}) == line  # a recipe that leaves an option unset means the default


@pytest.mark.parametrize("name, options, line", [
    ("biencoder", {"router_layers": None, "weighting": "one_plus_w"}, "biencoder"),
    ("biencoder", {"router_layers": 2, "weighting": "one_plus_w"}, "biencoder + CSR in the top 2 layers (one_plus_w)"),
    ("hadamard", {}, "hadamard"),
    ("concat", {"dropout": 0.3}, "concat"),
    ("hypernet", {"rank": None, "hypernet_form": "lowrank"}, "hypernet (lowrank, K=H/12)"),
    ("hypernet", {"rank": 8, "hypernet_form": "residual"}, "hypernet (residual, K=8)"),
    ("router", {"router_layers": None, "weighting": "one_plus_w", "scorer": "query_key", "cross_attend": "none"},
     "router (k=1, query_key, one_plus_w)"),
    ("router", {"router_layers": 1, "weighting": "one_plus_w", "scorer": "query_key", "cross_attend": "top"},
     "router (k=1, query_key, one_plus_w, cross-attends top)"),
    ("router", {"router_layers": 2, "weighting": "w_only", "scorer": "heavy", "cross_attend": "none"},
     "router (k=2, heavy, w_only)"),
    ("case", {"case_projection": "linear", "case_dim": None}, "case (linear, k=H)"),
    ("case", {"case_projection": "mlp", "case_dim": 16}, "case (mlp, k=16)"),
])
def test_descriptions_keep_the_compare_tables_wording(name, options, line):
    assert CONDITIONERS[name].describe(options) == line


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_conditioner_states_its_export_recipe(case, encoder, special):
    cond = make(case, encoder, special)
    spec = cond.export_spec()
    assert isinstance(spec["reproducible_outside_kgc"], bool) and isinstance(spec["query"], str) and spec["query"]
    assert list(spec["options"]) == list(cond.options)  # every declared option, with the value in use
    for key, value in CASES[case][1].items():
        assert spec["options"][key] == value
    assert set(spec) <= {"reproducible_outside_kgc", "query", "options", "input", "note", "h_s", "h_c"}
    assert json.loads(json.dumps(spec)) == spec  # it goes into kgc.json as it is
    if not spec["reproducible_outside_kgc"]:
        assert "Use kgc for queries" in spec["query"]


@pytest.mark.parametrize("case, effective", [
    ("biencoder", {"router_layers": 0}), ("router", {"router_layers": 1}), ("hypernet-full", {"rank": None}),
    ("case", {"case_dim": 32}), ("router-2-w_only-hidden", {"router_layers": 2})])
def test_export_spec_resolves_the_defaults_a_recipe_leaves_unset(case, effective, encoder, special):
    options = make(case, encoder, special).export_spec()["options"]
    assert {k: options[k] for k in effective} == effective


def test_a_conditioner_without_an_export_recipe_cannot_be_built(encoder, special):
    class Silent(Conditioner):  # a new conditioner that forgot to say how it exports
        name, enters_at = "silent", "pooled"

        @classmethod
        def describe(cls, options):
            return cls.name

        def encode_conditions(self, conditions):
            return conditions

        def encode_sentences(self, sentences):
            return sentences

        def combine(self, sentence_state, condition_state, condition_index):
            raise NotImplementedError

    with pytest.raises(TypeError, match="export_spec"):
        Silent(encoder=encoder, special=special, max_tokens=24)
    assert "silent" not in CONDITIONERS


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_conditioner_explains_itself_or_refuses_clearly(case, encoder, special, tokenizer):
    from kgc.explain import Explanation, check_explainable, explain_conditioner

    cond = make(case, encoder, special)
    names = ["c0", "c1", "c2"]
    sentence, conditions = SENTS[0], [CONDS[1], CONDS[0], [3003, 3004, 3005]]
    if cond.explain_kind is None:
        with pytest.raises(KGCError, match="kgc explain shows .*this run's conditioner is " + cond.name) as err:
            explain_conditioner(cond, conditions, names, sentence=sentence, tokenizer=tokenizer)
        assert all(f"({n})" in str(err.value) or f"({n} " in str(err.value)
                   for n in CONDITIONERS if CONDITIONERS[n].explains)  # it lists what can be explained
        with pytest.raises(KGCError):
            check_explainable(cond)
        return
    assert check_explainable(cond) == cond.explain_kind
    ex = explain_conditioner(cond, conditions, names, sentence=sentence, tokenizer=tokenizer)
    assert isinstance(ex, Explanation) and ex.kind == cond.explain_kind and ex.conditions == names
    assert ex.values.shape[0] == len(conditions)
    if ex.kind == "tokens":
        assert ex.tokens[0] == "[CLS]" and ex.values.shape[1] == len(ex.tokens) == 1 + len(sentence) + (
            cond.name == "router")  # the router weighs [CLS] s [SEP]; the bi-encoder [CLS] s of [CLS] s [SEP] c [SEP]
        torch.testing.assert_close(torch.from_numpy(ex.values).sum(1), torch.ones(len(conditions)))
        assert ex.layers == list(range(encoder.num_layers - CASES[case][1].get("router_layers", 1),
                                       encoder.num_layers))
        assert (ex.values[0] - ex.values[2]).max() > 1e-4  # another condition, other weights
        with pytest.raises(KGCError, match="give a sentence"):
            cond.explain(conditions)
    else:
        assert ex.values.shape[1] == encoder.dim and (ex.values[:, :-1] >= ex.values[:, 1:] - 1e-6).all()


def test_the_plain_biencoder_says_what_it_lacks(encoder, special):
    from kgc.explain import check_explainable

    with pytest.raises(KGCError, match="this run's conditioner is biencoder without router_layers"):
        check_explainable(make("biencoder", encoder, special))


def test_explain_takes_what_a_run_hands_it(encoder, special, tokenizer):
    """kgc.explain.explain(inputs): the run's conditioner decides the kind; the title describes it."""
    from types import SimpleNamespace

    from kgc.explain import explain

    def inputs(cond, sentence):
        return SimpleNamespace(conditioner=cond, tokenizer=tokenizer, sentence=sentence, subject="s0",
                               conditions=CONDS[:2], names=["a", "b"], sentence_hint="give --head")

    ex, title = explain(inputs(make("hypernet-lowrank", encoder, special), None))
    assert ex.kind == "spectrum" and title == "singular values of W_c: hypernet (lowrank, K=4)"
    with pytest.raises(KGCError, match="give --head"):
        explain(inputs(make("router", encoder, special), None))
    ex, title = explain(inputs(make("router", encoder, special), SENTS[0]))
    assert ex.kind == "tokens" and ex.conditions == ["a", "b"] and title == "router weight w per token: s0"
    with pytest.raises(KGCError, match="this run's conditioner is concat"):
        explain(inputs(make("concat", encoder, special), SENTS[0]))
