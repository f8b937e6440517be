"""Near misses ("did you mean") on a large graph come from a word index (kgc/data/spelling.py): on generated names
that are alike by design (two or three words from short lists), each typo's own name is suggested, the best
suggestion is difflib's best over every id and name, and nothing is suggested that the full pass would not."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from kgc.data.formats import read_graph
    from kgc.data.synth_graph import synth_graph

    folder = tmp_path_factory.mktemp("spelling") / "g"
    synth_graph(folder, entities=12_000, seed=1)
    return read_graph(folder)


def _typos(names: list[str], rng: np.random.Generator) -> list[str]:
    out = []
    for name in names:
        i = int(rng.integers(1, len(name) - 1))
        out += [name[:i] + name[i + 1:],  # a letter dropped
                name[:i] + name[i + 1] + name[i] + name[i + 2:],  # two swapped
                name[:i] + "x" + name[i + 1:],  # one replaced
                name.upper()]  # case
    return out


def test_indexed_near_misses_find_what_the_full_pass_finds_first(graph, monkeypatch):
    import kgc.data.graph as g

    monkeypatch.setattr(g, "BRUTE_SPELLINGS", 1000)  # the index answers here, over 12,000 names
    rng = np.random.default_rng(0)
    names = [graph.names[int(i)] for i in rng.integers(0, graph.num_entities, 15)]
    queries = _typos(names, rng)
    assert max(len(graph._name_index.candidates(q)) for q in queries) < graph.num_entities / 10  # not a full pass
    indexed = [graph.near_misses(q) for q in queries]
    monkeypatch.setattr(g, "BRUTE_SPELLINGS", 10 ** 9)
    full = [graph.near_misses(q) for q in queries]
    for query, name, got, want in zip(queries, np.repeat(names, 4), indexed, full):
        assert name in got, query  # the name the typo came from is suggested
        assert got[0] == want[0], query  # the best suggestion is the full pass's best
        assert set(got) <= set(want) or len(want) == 5, query  # nothing the full pass would not suggest
    assert graph.near_misses("nothing like any name at all") == [] == graph.near_misses("zz")
    with pytest.raises(g.UnknownName) as info:
        graph.find_entity(queries[0])
    assert info.value.suggestions


def test_the_index_is_compact_and_its_candidates_share_bigrams():
    from kgc.data.spelling import SpellingIndex, bigrams

    texts = ["lisbon", "london", "lisburn", "porto", "boston"]
    index = SpellingIndex(texts)
    assert index.nbytes <= 65537 * 8 + 4 * sum(len(t) + 1 for t in texts)
    assert [texts[i] for i in index.candidates("lisbn", limit=2)] == ["lisbon", "lisburn"]
    assert set(bigrams("ab")) == {ord(" ") << 8 | ord("a"), ord("a") << 8 | ord("b"), ord("b") << 8 | ord(" ")}
    assert len(index.candidates("")) <= len(texts) and len(index.candidates("qqqq")) == 0


def test_words_stand_for_their_near_spellings_and_exact_names_are_found_by_hash():
    from kgc.data.spelling import ExactNames, NameIndex

    names = ["Lunar Kestrel Hold", "Lunar Kestrel Fold", "Quiet Plover Reef", "Lisbon", "lisbon", "Porto"]
    index = NameIndex(names)
    assert [names[i] for i in index.candidates("Lunr Kestrel Hold")] == names[:2]  # 3 words, 2 matched first
    assert set(index.candidates("lisbn").tolist()) == {3, 4}
    assert len(index.candidates("nothing here")) == 0 and len(index.candidates("")) == 0
    assert index.words[index.similar_words("plovr")[0][0]] == "plover" and index.similar_words("porto")[0][1] == 1.0
    again = NameIndex.from_arrays(index.arrays())  # as kept beside a graph cache
    assert again.words == index.words and again.vocab == index.vocab
    assert all(np.array_equal(again.candidates(q), index.candidates(q)) for q in ("Lunr Kestrel Hold", "lisbn", "x"))
    assert NameIndex.from_arrays(NameIndex([]).arrays()).words == []
    with pytest.raises(ValueError):  # a damaged copy is refused, not read as another index
        NameIndex.from_arrays({**index.arrays(), "indptr": index.indptr[:-1]})
    exact = ExactNames(names + ["A: b"], [n + ": a place" for n in names] + ["A: b: c"])
    assert exact.find("Lisbon", fold=False) == [3] and exact.find("LISBON", fold=True) == [3, 4]
    assert exact.find("Porto: a place", fold=False) == [5] and exact.find("Oporto", fold=True) == []
    assert exact.find("porto: A PLACE", fold=True) == [5] and exact.find("porto: A PLACE", fold=False) == []
    assert exact.find("A: b: c", fold=False) == [6] and exact.find("a: b", fold=True) == [6]  # a name with ": "


def test_prefixes_find_names_then_ids_by_bisection():
    from kgc.data.spelling import Prefixes

    names, ids = ["Lisbon", "Lisburn", "London", "porto", "Lis"], ["Q10", "Q2", "Q3", "Q4", "Q11"]
    prefixes = Prefixes(names, ids)
    assert prefixes.find("lis", 10) == [4, 0, 1]  # sorted names: lis, lisbon, lisburn
    assert prefixes.find("LISB", 1) == [0]
    assert prefixes.find("q1", 10) == [0, 4]  # ids q10, q11
    assert prefixes.find("zzz", 10) == []
