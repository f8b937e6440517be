"""Names that name nothing: :class:`kgc.errors.UnknownName` with its kind, the name asked, near misses and (for
relations) every valid name — what an HTTP server answers 404 with — and the spelling rule for a head's typo."""

from __future__ import annotations

import pickle

import pytest

from kgc.data.formats import read_graph
from kgc.data.graph import NEAR_MISS
from kgc.errors import KGCError, UnknownName
from tests.conftest import ROOT

EXAMPLE = ROOT / "data" / "examples" / "capitals"


@pytest.fixture(scope="module")
def graph():
    return read_graph(EXAMPLE)


def test_an_unknown_relation_lists_every_valid_name_and_the_near_misses(graph):
    with pytest.raises(UnknownName) as info:
        graph.relation_id("capitol of")
    e = info.value
    assert isinstance(e, KGCError) and (e.kind, e.name) == ("relation", "capitol of")
    assert e.suggestions == ["capital_of"]
    assert e.valid == ["capital_of", "official_language", "located_in", "flows_through", "borders"]
    assert str(e) == ("unknown relation 'capitol of'. Did you mean: capital_of? Relations: capital_of, "
                      "official_language, located_in, flows_through, borders")
    with pytest.raises(UnknownName) as info:
        graph.relation_id("eats", inverse=True)
    assert info.value.suggestions == [] and str(info.value).startswith("unknown relation 'eats'. Relations: ")
    copy = pickle.loads(pickle.dumps(info.value))  # survives a worker process
    assert (copy.kind, copy.name, copy.suggestions, copy.valid, str(copy)) == \
        ("relation", "eats", [], info.value.valid, str(info.value))


def test_near_misses_are_typos_of_an_id_or_name_and_resolve_back(graph):
    assert NEAR_MISS == 0.8
    assert graph.near_misses("Lisbn") == ["Lisbon"]
    assert graph.near_misses("lisbon ") == ["Lisbon"]  # case and blanks ignored
    assert graph.near_misses("Madird")[0] == "Madrid" and graph.near_misses("washington_d")[0] == "Washington, D.C."
    assert graph.near_misses("a city on the Atlantic coast") == []  # a description is no typo
    assert graph.near_misses("capital of portugal") == []
    for typo in ("Lisbn", "Pariss", "Madird", "Berln"):
        for s in graph.near_misses(typo):
            assert graph.lookup_entity(s) is not None  # every suggestion can be given back as the head
    # a name shared by two entities is suggested as the id, which resolves
    from dataclasses import replace

    twin = replace(graph, names=[("Paris" if e == "madrid" else n) for e, n in zip(graph.entities, graph.names)])
    assert twin.near_misses("Pariss") == ["madrid", "paris"]

def test_an_unknown_entity_carries_its_closest_spellings(graph):
    with pytest.raises(UnknownName, match=r"unknown entity 'Lisbn'\. Closest: 'Lisbon'") as info:
        graph.find_entity("Lisbn")
    assert info.value.kind == "entity" and info.value.suggestions[0] == "Lisbon" and info.value.valid is None
