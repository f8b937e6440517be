"""A graph of millions read as arrays: the array reader of clean triple files, the graph and token caches, the
vectorised neighbours, answers and text lengths — each equal to the line-by-line, list-of-lists way it replaced,
on a generated graph big enough to take the array paths."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from kgc.data.synth_graph import synth_graph

    out = tmp_path_factory.mktemp("scale") / "g"
    synth_graph(out, entities=25_000, seed=3)
    return out


def _line_by_line(monkeypatch, folder):
    import kgc.data.formats as g

    with monkeypatch.context() as m:
        m.setattr(g.triples, "_clean_triples", lambda *a, **k: None)
        m.setenv("KGC_GRAPH_CACHE", "0")
        return g.read_graph(folder)


def _same(a, b) -> None:
    assert (a.entities, a.names, a.descriptions) == (b.entities, b.names, b.descriptions)
    assert (a.relations, a.relation_texts) == (b.relations, b.relation_texts)
    for split in ("train", "dev", "test"):
        assert np.array_equal(a.splits[split], b.splits[split]), split


def test_the_array_reader_equals_the_line_reader_and_steps_aside_for_what_it_cannot_read(folder, monkeypatch,
                                                                                      tmp_path):
    import shutil

    import kgc.data.formats as g
    from kgc.errors import KGCError

    monkeypatch.setenv("KGC_GRAPH_CACHE", "0")
    used = []
    real = g.triples._clean_triples
    monkeypatch.setattr(g.triples, "_clean_triples", lambda *a: used.append(a[0].name) or real(*a))
    fast = g.read_graph(folder)
    assert "train.tsv" in used and (folder / "train.tsv").stat().st_size > 1_000_000
    assert g.triples._clean_triples is not real and fast.splits["train"].shape[0] > 100_000
    _same(fast, _line_by_line(monkeypatch, folder))
    # a blank padded field, a CRLF line, an unknown entity: the line reader reads (or refuses) them
    for damage, check in [(lambda t: t.replace("\t", " \t", 1), "same"), (lambda t: t.replace("\n", "\r\n", 3), "same"),
                          (lambda t: t + "E9999999\tR0001\tE0000001\n", "unknown entity 'E9999999'")]:
        bad = tmp_path / f"bad{len(used)}"
        shutil.copytree(folder, bad)
        (bad / "train.tsv").write_text(damage((folder / "train.tsv").read_text()))
        if check == "same":
            _same(g.read_graph(bad), _line_by_line(monkeypatch, bad))
        else:
            with pytest.raises(KGCError, match=check):
                g.read_graph(bad)
        used.append("x")


def test_neighbours_answers_and_lengths_equal_the_python_way(folder, monkeypatch):
    import kgc.data.formats as g

    monkeypatch.setenv("KGC_GRAPH_CACHE", "0")
    graph = g.read_graph(folder)
    nbrs = [set() for _ in range(graph.num_entities)]
    for h, _, t in graph.splits["train"].tolist():
        nbrs[h].add(t)
        nbrs[t].add(h)
    assert list(graph.train_neighbors) == [sorted(s, key=lambda i: graph.entities[i]) for s in nbrs]
    q = np.concatenate([graph.both_directions(s) for s in ("train", "dev", "test")])
    keys = graph.hr_keys(q[:, 0], q[:, 1])
    answers = graph.all_answers
    some = np.unique(keys)[::997]
    for key, row in zip(some, answers[some]):
        assert row.indices.tolist() == sorted(set(q[keys == key, 2].tolist()))


def test_the_graph_and_token_caches_give_the_same_graph_and_bank_and_follow_the_files(folder, monkeypatch, tmp_path,
                                                                                     tokenizer):
    import os

    import kgc.data.formats as g
    from kgc.data import graph_cache
    from kgc.data.texts import TextBank

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(graph_cache, "MIN_ENTITIES", 1_000)
    first = g.read_graph(folder)
    assert first.cache_dir is not None and not any("graph cache" in n for n in first.notes)
    again = g.read_graph(folder)
    assert again.cache_dir == first.cache_dir and "graph cache" in again.notes[-1]
    _same(again, _line_by_line(monkeypatch, folder))
    assert list(again.train_neighbors) == list(first.train_neighbors)
    assert (again.cache_dir / "neighbors" / "done").is_file()
    answers, cached_answers = first.all_answers, g.read_graph(folder).all_answers  # computed, then memory-mapped
    assert isinstance(cached_answers.answers, np.memmap)
    assert all(np.array_equal(getattr(answers, k), getattr(cached_answers, k)) for k in ("keys", "indptr", "answers"))
    assert list(g.read_graph(folder).train_neighbors) == list(first.train_neighbors)  # memory-mapped
    # "did you mean": its word index written with the cache, read back memory-mapped, the same suggestions
    assert (first.cache_dir / "name_index" / "done").is_file()
    built, read = first._name_index, g.read_graph(folder)._name_index
    assert isinstance(read.names, np.memmap) and read.words == built.words
    typo = first.names[7][:-1] + "q"
    assert np.array_equal(read.candidates(typo), built.candidates(typo)) and len(built.candidates(typo))
    assert g.read_graph(folder).near_misses(typo) == _line_by_line(monkeypatch, folder).near_misses(typo)

    small = _line_by_line(monkeypatch, folder)
    plain = TextBank(small, tokenizer)  # no cache: a graph read without one
    cached = TextBank(again, tokenizer)  # tokenised, stored
    reread = TextBank(g.read_graph(folder), tokenizer)  # memory-mapped
    for bank in (cached, reread):
        assert bank.base == plain.base and bank.base_colon == plain.base_colon and bank.name_ids == plain.name_ids
        assert np.array_equal(bank.short, plain.short)
    assert cached.fingerprint() == plain.fingerprint()
    assert TextBank(g.read_graph(folder), tokenizer)._fingerprint == plain.fingerprint()  # read, not recomputed
    assert np.array_equal(plain.eval_lengths(), [len(plain.entity_ids(e)) for e in range(small.num_entities)])

    os.utime(folder / "dev.tsv", ns=(1, 1))  # a file changed: another key, the files are read again
    changed = g.read_graph(folder)
    assert changed.cache_dir != first.cache_dir and not any("graph cache" in n for n in changed.notes)
