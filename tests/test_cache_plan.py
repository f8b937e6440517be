"""The layer cache is sized before its first byte (kgc/training/cache_plan.py): the estimate is the bytes it holds once
filled, a cache that would not fit what it may hold is left off in one line with the numbers (encoder.cache: true,
the default) or refused (encoder.cache: required)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from kgc.encoding.cache import LayerCache
from kgc.errors import KGCError
from kgc.training.cache_plan import CachedTexts, plan


def test_the_estimate_is_the_bytes_of_a_filled_cache(tmp_path):
    """By hand: 3 sequences of 4, 7 and 2 tokens at depth 2, hidden 16: (4 + 7 + 2) × 2 × 16 × 2 B = 832 B."""
    cache = LayerCache(layer=1, model_hash="0" * 64, tokenizer_hash="t", hidden=16, depth=2, folder=tmp_path / "c")
    lengths = [4, 7, 2]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.arange(100 + 10 * i, 100 + 10 * i + n)
        mask[i, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    cache.lookup(batch, lambda b: torch.ones(b["input_ids"].shape[0], b["input_ids"].shape[1], 2, 16))
    texts = [CachedTexts("texts", 3, sum(lengths) / 3)]
    assert cache.nbytes == 832 == plan(texts, hidden=16, depth=2, max_gb=1.0).states
    cache.save()  # read back from the mapped segment: the same bytes
    assert LayerCache(layer=1, model_hash="0" * 64, tokenizer_hash="t", hidden=16, depth=2,
                      folder=tmp_path / "c").nbytes == 832


def test_wikidata5m_scale_line_says_the_numbers():
    p = plan([CachedTexts("entity texts", 4_594_485, 50.0)], hidden=384, max_gb=9.6)
    assert p.states == 4_594_485 * 50 * 384 * 2 and not p.fits
    assert p.line() == ("layer cache: would hold 4,594,485 entity texts × 50.0 tokens × 384 × 2 B = 176.4 GB of states, "
                        "180.3 GB of it in memory at once (every state: evaluation saves none; + 3.9 GB of lookup "
                        "index), more than the 9.6 GB allowed (encoder.cache_max_gb); running without it: every step "
                        "encodes the frozen layers too (encoder.cache=required would stop instead)")
    training = plan([CachedTexts("entity texts", 10, 5.0), CachedTexts("query sequences", 1000, 4.0)], hidden=8,
                    max_gb=1.0, between_saves=100)  # every entity text and 100 queries held, 3.5 times while saving
    assert training.held == int(3.5 * (10 * 5 + 100 * 4) * 8 * 2) and training.states == (50 + 4000) * 8 * 2
    default = plan([CachedTexts("entity texts", 10, 5.0)], hidden=8, available=2 * 10**9)
    assert default.allowed == 10**9 and "50% of the 2.0 GB available" in default.where and default.fits


def small_model(tmp_path, tiny_bert, toy_dir, *sets):
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\ndata: {{path: {toy_dir}, neighbor_text: false, max_tokens: 16}}\n"
                    f"model: {{backbone: {tiny_bert}, conditioner: biencoder}}\n"
                    "encoder: {trainable_layers: 1}\ntrain: {epochs: 1, batch_size: 4}\n")
    recipe = load_recipe(path, list(sets))
    model, _ = LinkPredTraining(recipe).build_model(tiny_bert)
    return recipe, model


def test_a_models_entity_texts_estimate_what_they_fill(tiny_bert, toy_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe, model = small_model(tmp_path, tiny_bert, toy_dir)
    said = []
    model.attach_layer_cache(recipe, examples=8, say=said.append)
    texts = model.layer_cache_texts(recipe, 8)
    entities, queries = texts
    assert (entities.what, entities.count, queries.count) == ("entity texts", 6, 8 + 2 * 3)  # 12 directions ≥ 8
    assert said and said[0].startswith("layer cache: up to (6 entity texts") and "within the" in said[0]
    assert "the states between two saves" in said[0]  # training: saved at every checkpoint
    model.eval()
    model.entity_table(4)  # every entity's text through the frozen layer once
    sized = plan(texts[:1], hidden=model.tail_encoder.dim, max_gb=1.0)
    assert model.layer_cache.nbytes == sized.states  # exact: no neighbour names here


def test_a_cache_that_does_not_fit_is_left_off_or_refused(tiny_bert, toy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe, model = small_model(tmp_path, tiny_bert, toy_dir, "encoder.cache_max_gb=1e-6")
    said = []
    model.attach_layer_cache(recipe, examples=8, say=said.append)
    assert model.layer_cache is None and not (tmp_path / "cache").exists()  # not a byte written
    assert model.query_encoder.frozen_layers == 1  # the layers below still freeze
    assert len(said) == 1 and re.fullmatch(
        r"layer cache: would hold \(6 entity texts × [\d.]+ tokens \+ 14 query sequences × [\d.]+ tokens\) × 32 × 2 B "
        r"= [\d.]+ kB of states, [\d.]+ kB of it in memory at once \(the states between two saves, 3\.5× while "
        r"saving; \+ [\d.]+ kB of lookup index\), more than the 1\.0 kB allowed \(encoder\.cache_max_gb\); running "
        r"without it: every step encodes the frozen layers too \(encoder\.cache=required would stop instead\)",
        said[0]), said[0]
    model.eval()
    with torch.no_grad():
        assert model.entity_table(4).shape == (6, 32)  # it runs without the cache
    recipe, model = small_model(tmp_path, tiny_bert, toy_dir, "encoder.cache_max_gb=1e-6")
    model.attach_layer_cache(recipe)  # evaluation: no say, the line goes to stderr
    assert "layer cache: would hold" in capsys.readouterr().err
    recipe, model = small_model(tmp_path, tiny_bert, toy_dir, "encoder.cache_max_gb=1e-6", "encoder.cache=required")
    with pytest.raises(KGCError, match=r"the layer cache would hold .* more than the 1\.0 kB allowed "
                                       r"\(encoder\.cache_max_gb\), and the recipe requires it \(encoder\.cache: "
                                       r"required\)\. To go on, run without it: `--set encoder\.cache=true` .*; or allow "
                                       r"it more: `--set encoder\.cache_max_gb=0\.1` .*Nothing was written\."):
        model.attach_layer_cache(recipe, examples=8)
    recipe, model = small_model(tmp_path, tiny_bert, toy_dir, "encoder.cache=false")
    said.clear()
    model.attach_layer_cache(recipe, examples=8, say=said.append)
    assert model.layer_cache is None and not said
    assert np.isclose(plan([CachedTexts("x", 1, 1.0)], hidden=1, max_gb=1.0).allowed, 1e9)


def test_stage_memory_of_the_wikidata5m_laptop_recipe_at_its_size():
    """kgc bench scale's numbers: Wikidata5M's counts, 22 GB available, an 80 GB GPU; MiniLM's shape."""
    from kgc.recipe import load_recipe
    from kgc.training.estimate import BackboneShape
    from kgc.linkpred.bench.memory import stage_memory, stage_table

    minilm = BackboneShape(hidden=384, layers=6, heads=12, intermediate=1536, vocab=30522,
                           embedding_params=11_918_592, layer_params=1_774_464)
    recipe = load_recipe("recipes/wikidata5m_laptop.yaml")
    stages = stage_memory(recipe, entities=4_594_485, triples=20_614_279, available=22 * 10**9, shape=minilm)
    by = {s.name: s for s in stages}
    assert list(by) == ["data", "layer cache", "training step", "evaluation"]
    cache = by["layer cache"]
    assert not cache.fits and cache.note.startswith("left off (encoder.cache: true)")
    assert cache.parts["states on disk"] == (4_594_485 * 50 + (20_614_279 * 2 + 2 * 10_000) * 50) * 384 * 2
    step = by["training step"]
    assert step.fits_gpu and step.parts["entity table"] == 4_594_485 * 384 * 4 and "65,536 table rows" in step.note
    assert "layer cache" not in step.parts  # left off: the step runs the frozen layers instead
    assert by["evaluation"].bytes == 4_594_485 * 384 * 4 + recipe.eval.max_score_bytes
    assert stage_table(stages).splitlines()[0].split()[:3] == ["stage", "here", "fits"]
