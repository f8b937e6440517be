"""The checks a conditioner must pass, kgc's own and a plugin's alike (:func:`check_conditioner`; ``kgc.testing``
gathers every family's checks), and the small random parts they build: BERT's special tokens without a tokenizer, a
3-layer BERT 32 wide (no download)."""

from __future__ import annotations

import json
from typing import Any

BERT_IDS = {"cls": 101, "sep": 102, "pad": 0}  # bert-base-uncased's (and MiniLM's) special token ids


def special_tokens():
    """BERT's layout of special tokens ([CLS] a [SEP], [CLS] a [SEP] b [SEP]), without a tokenizer."""
    from kgc.data.texts import SpecialTokens

    cls, sep = BERT_IDS["cls"], BERT_IDS["sep"]
    return SpecialTokens(single=([cls], [sep]), pair=([cls], [sep], [sep]), pair_types=(0, 1), pad_id=BERT_IDS["pad"])


def tiny_encoder(layers: int = 3, hidden: int = 32, seed: int = 0):
    """A random BERT text encoder (``layers`` × ``hidden``, 2 heads, BERT's vocabulary size), in eval mode."""
    import torch
    from transformers import BertConfig, BertModel

    from kgc.encoding.backbone import TextEncoder

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, initializer_range=0.2)
    return TextEncoder(BertModel(config, add_pooling_layer=False)).eval()


SENTENCES = [[2000, 2001, 2002], [2003], [2004, 2005], [2000, 2001, 2002]]
CONDITIONS = [[3000], [3001, 3002], [3000], [3001, 3002]]  # rows 0 and 3: one sentence under two conditions


def fail(what: str, message: str) -> None:
    """The one way a check fails: AssertionError naming the member."""
    raise AssertionError(f"{what}: {message}")


def checked_build(name: str, encoder: Any, special: Any, **options: Any):
    """Conditioner ``name`` as the checks build it: seeded, in eval mode, its zero-initialised parts (a residual's
    second weight) drawn small, which would otherwise hide the condition."""
    import torch

    from kgc.conditioning import build_conditioner

    torch.manual_seed(0)
    cond = build_conditioner(name, encoder=encoder, special=special, max_tokens=24, **options).eval()
    with torch.no_grad():
        for n, p in cond.named_parameters():
            if not n.startswith("encoder.") and not p.any():
                p.normal_(0, 0.1)
    return cond


def check_conditioner(name: str, *, encoder: Any = None, **options: Any) -> None:
    """The contract of conditioner ``name`` (``kgc.registry.CONDITIONERS``) built with ``options``."""
    import torch

    from kgc.conditioning import CONDITIONERS

    what = f"conditioner {name!r}"
    if name not in CONDITIONERS:
        fail(what, f"not registered (known: {', '.join(CONDITIONERS)})")
    cond = checked_build(name, encoder if encoder is not None else tiny_encoder(), special_tokens(), **options)
    with torch.no_grad():
        out = cond(SENTENCES, CONDITIONS)
        if out.shape != (len(SENTENCES), cond.out_dim):
            fail(what, f"returned {tuple(out.shape)}, not (rows, out_dim={cond.out_dim})")
        if not torch.allclose(out.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-4):
            fail(what, "rows are not unit vectors (kgc scores by inner product: a score must be a cosine)")
        alone = torch.cat([cond([s], [c]) for s, c in zip(SENTENCES, CONDITIONS)])
        if not torch.allclose(out, alone, atol=1e-5, rtol=1e-5):
            fail(what, "a row depends on the other rows of its batch (batching must not change an embedding)")
        if (out[0] - out[3]).abs().max() <= 1e-6:
            fail(what, "the same sentence under another condition gives the same vector: the condition is unused")
        staged = cond.combine(cond.encode_sentences(SENTENCES), cond.encode_conditions(CONDITIONS),
                              torch.arange(len(SENTENCES)))
        if not torch.allclose(staged, out, atol=1e-5, rtol=1e-5):
            fail(what, "combine(encode_sentences, encode_conditions) differs from forward (kgc runs the stages "
                        "apart to encode each distinct condition once)")
    line = type(cond).describe(dict(options))
    if not isinstance(line, str) or not line.startswith(name) or "\n" in line:
        fail(what, f"describe() gave {line!r}: one line starting with its name, for kgc compare's tables")
    spec = cond.export_spec()
    if not isinstance(spec.get("query"), str) or not isinstance(spec.get("reproducible_outside_kgc"), bool):
        fail(what, "export_spec() needs 'query' (a string) and 'reproducible_outside_kgc' (a bool)")
    if list(spec.get("options", {})) != list(cond.options):
        fail(what, f"export_spec()'s options {list(spec.get('options', {}))} are not its declared {list(cond.options)}")
    if json.loads(json.dumps(spec)) != spec:
        fail(what, "export_spec() is not JSON as it is (it goes into kgc.json)")
