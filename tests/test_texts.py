"""Entity/relation texts: SimKGC's rules, neighbour exclusion, tokenise-once equivalence, truncation."""

from __future__ import annotations

import pytest

from kgc.data.graph import read_graph
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
