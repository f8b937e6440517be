"""Entity/relation texts: SimKGC's rules, neighbour exclusion, tokenise-once equivalence, truncation."""

from __future__ import annotations

import pytest

from kgc.data.formats import read_graph
from kgc.data.texts import SpecialTokens, TextBank


@pytest.fixture()
def bank(toy_dir, tokenizer):
    return TextBank(read_graph(toy_dir), tokenizer, max_tokens=50)


def test_name_and_description_split_and_prefix_drop(bank):
    g = bank.graph
    i = g.entity_index["e_pet"]
    assert g.names[i] == "pet"
    assert g.descriptions[i] == "a domesticated animal kept for companionship"  # repeated "pet," dropped
    assert g.relation_text(g.relation_index["_has_part"]) == "has part"
    assert g.relation_text(g.relation_index["_has_part"] + g.num_relations) == "inverse has part"


def test_neighbours_appended_to_short_descriptions_excluding_the_other_end(bank):
    g = bank.graph
    dog, tail, animal, pet = (g.entity_index[k] for k in ("e_dog", "e_tail", "e_animal", "e_pet"))
    # train-graph neighbours of dog, sorted by id: e_animal, e_pet, e_tail
    assert bank.entity_text(dog) == "dog: a domesticated carnivorous mammal animal pet tail"
    assert bank.entity_text(dog, exclude=tail) == "dog: a domesticated carnivorous mammal animal pet"
    assert bank.entity_text(dog, exclude=animal) == "dog: a domesticated carnivorous mammal pet tail"
    assert "pet" not in bank.entity_text(dog, exclude=pet).split()


@pytest.mark.parametrize("exclude", [None, "e_tail", "e_animal"])
def test_assembled_ids_equal_tokenising_the_joined_text(bank, tokenizer, exclude):
    g = bank.graph
    for e in range(g.num_entities):
        x = g.entity_index[exclude] if exclude else None
        assert bank.entity_ids(e, x) == tokenizer(bank.entity_text(e, x), add_special_tokens=False)["input_ids"]


def test_long_descriptions_get_no_neighbours(toy_dir, tokenizer):
    bank = TextBank(read_graph(toy_dir), tokenizer, short_description_words=3)
    dog = bank.graph.entity_index["e_dog"]
    assert bank.entity_text(dog) == "dog: a domesticated carnivorous mammal"
    off = TextBank(read_graph(toy_dir), tokenizer, neighbor_text=False)
    assert off.entity_text(dog) == "dog: a domesticated carnivorous mammal"


def test_entity_without_description_gets_colon_then_neighbours(tmp_path, tokenizer):
    from tests.conftest import write_toy

    folder = write_toy(tmp_path / "T")
    text = (folder / "entity2text.txt").read_text().replace("e_tail\ttail, the posterior part of the body of a vertebrate",
                                                           "e_tail\ttail")
    (folder / "entity2text.txt").write_text(text)
    bank = TextBank(read_graph(folder), tokenizer)
    t = bank.graph.entity_index["e_tail"]
    assert bank.entity_text(t) == "tail: dog"
    assert bank.entity_ids(t) == tokenizer("tail: dog", add_special_tokens=False)["input_ids"]
    assert bank.entity_text(t, exclude=bank.graph.entity_index["e_dog"]) == "tail"


@pytest.mark.parametrize("la,lb,max_len", [(5, 3, 20), (30, 4, 20), (12, 12, 15), (3, 30, 16), (9, 8, 12)])
def test_pair_truncation_matches_tokenizer(tokenizer, la, lb, max_len):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    a = " ".join((words * 3)[:la])
    b = " ".join(reversed((words * 3)[:lb]))
    special = SpecialTokens.from_tokenizer(tokenizer)
    ids_a = tokenizer(a, add_special_tokens=False)["input_ids"]
    ids_b = tokenizer(b, add_special_tokens=False)["input_ids"]
    ref = tokenizer(a, b, truncation="longest_first", max_length=max_len)
    ids, types = special.wrap_pair(ids_a, ids_b, max_len)
    assert ids == ref["input_ids"]
    assert types == ref["token_type_ids"]
    single = tokenizer(a, truncation=True, max_length=max_len)["input_ids"]
    assert special.wrap(ids_a, max_len)[0] == single


def _random_graph(folder, seed: int):
    """60 entities, some without a description, some with long ones; 400 random train triples (many neighbours)."""
    import random

    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    folder.mkdir(parents=True)
    lines = []
    for i in range(60):
        name = " ".join(rng.sample(words, rng.randint(1, 4)))
        desc = " ".join(rng.choices(words, k=rng.choice([0, 2, 5, 25])))
        lines.append(f"e{i}\t{name}\t{desc}\n")
    (folder / "entity2text.txt").write_text("".join(lines))
    (folder / "relation2text.txt").write_text("r0\tpart of\nr1\tsimilar to\n")
    rows = {(f"e{rng.randrange(60)}", f"r{rng.randrange(2)}", f"e{rng.randrange(60)}") for _ in range(400)}
    (folder / "train.tsv").write_text("".join("\t".join(r) + "\n" for r in sorted(rows)))
    for split in ("dev", "test"):
        (folder / f"{split}.tsv").write_text("e1\tr0\te2\n")
    return folder


@pytest.mark.parametrize("max_tokens,seed", [(50, 0), (12, 1), (6, 2)])
def test_batch_assembly_equals_one_entity_at_a_time(tmp_path, tokenizer, max_tokens, seed):
    """entity_batch / entity_inputs (array code) against entity_ids / wrap / a row-by-row pad, on random texts whose
    names fill max_tokens part-way through the neighbours, with excludes that are neighbours, strangers and None."""
    import numpy as np
    import torch

    bank = TextBank(read_graph(_random_graph(tmp_path / "G", seed)), tokenizer, max_tokens=max_tokens)
    rng = np.random.default_rng(seed)
    n = bank.graph.num_entities
    entities = rng.integers(0, n, 300)
    excludes = [None if k % 5 == 0 else int(bank.neighbors[e][0]) if k % 5 == 1 and bank.neighbors[e]
                else int(rng.integers(0, n)) for k, e in enumerate(entities)]
    expected = [bank.entity_ids(int(e), x) for e, x in zip(entities, excludes)]
    assert any(bank.short[e] and len(bank.neighbors[e]) > 1 for e in entities)
    assert list(bank.entity_batch(entities, excludes)) == expected
    assert list(bank.entity_batch(entities)) == [bank.entity_ids(int(e)) for e in entities]
    assert len(bank.entity_batch([])) == 0
    wrapped = [bank.special.wrap(ids, max_tokens) for ids in expected]
    width = max(len(ids) for ids, _ in wrapped)
    batch = bank.entity_inputs(entities, excludes)
    assert batch["input_ids"].shape == (len(entities), width)
    for row, (ids, types) in enumerate(wrapped):
        assert batch["input_ids"][row].tolist() == ids + [bank.special.pad_id] * (width - len(ids))
        assert batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (width - len(ids))
        assert batch["token_type_ids"][row].tolist() == types + [0] * (width - len(ids))
    pairs = [bank.special.wrap_pair(a, b, max_tokens) for a, b in zip(expected, reversed(expected))]
    padded = bank.special.pad(pairs)
    for row, (ids, types) in enumerate(pairs):
        assert padded["input_ids"][row, : len(ids)].tolist() == ids
        assert padded["token_type_ids"][row, : len(ids)].tolist() == types
        assert int(padded["attention_mask"][row].sum()) == len(ids)
        assert (padded["input_ids"][row, len(ids):] == bank.special.pad_id).all()
    assert all(t.dtype == torch.long for t in padded.values())
