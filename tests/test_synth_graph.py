"""``kgc data synth-graph``: a graph of any size — exact counts, one seed one set of bytes, no duplicates or
self-loops, dev/test entities and relations all in train, heavy-tailed degrees, unique names, read by kgc's own
reader and passed by ``kgc data check``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgc.data import synth_graph as sg
from kgc.data.check import check_graph
from kgc.data.formats import read_graph
from kgc.errors import KGCError
from tests.conftest import cli

FILES = ["dev.tsv", "entity2text.txt", "meta.json", "relation2text.txt", "test.tsv", "train.tsv"]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_counts_are_exact_and_meta_records_the_parameters(tmp_path):
    out = tmp_path / "g"
    s = sg.synth_graph(out, entities=3000, relations=40, triples=12000, dev_triples=700, test_fraction=0.05, seed=3)
    assert s["triples"] == {"train": 12000 - 700 - 600, "dev": 700, "test": 600}  # test: 5 % of 12,000
    assert (s["entities"], s["relations"]) == (3000, 40)
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert s["bytes"] == sum(p.stat().st_size for p in out.iterdir())
    ents, rels = _lines(out / "entity2text.txt"), _lines(out / "relation2text.txt")
    assert len(ents) == 3000 and ents[0].startswith("E0000001\t") and ents[-1].startswith("E0003000\t")
    assert len(rels) == 40 and rels[0].startswith("R0001\t") and rels[-1].startswith("R0040\t")
    assert [len(_lines(out / f"{split}.tsv")) for split in ("train", "dev", "test")] == [10700, 700, 600]
    import json

    meta = json.loads((out / "meta.json").read_text())
    assert meta["seed"] == 3 and meta["parameters"]["entities"] == 3000 and meta["parameters"]["triples"] == 12000
    assert meta["triples"] == s["triples"]
    # the defaults: Wikidata5M's triples per entity, entities / 100 relations (at least 10), 10 % cap on dev/test
    d = sg.synth_graph(tmp_path / "d", entities=2000)
    assert d["relations"] == 20 and sum(d["triples"].values()) == round(4.49 * 2000)
    assert d["triples"]["dev"] == d["triples"]["test"] == int(0.1 * round(4.49 * 2000))


def test_one_seed_gives_the_same_bytes_another_seed_others(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    sg.synth_graph(a, entities=2500, seed=11)
    sg.synth_graph(b, entities=2500, seed=11)
    sg.synth_graph(c, entities=2500, seed=12)
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for name in ("entity2text.txt", "train.tsv", "dev.tsv", "test.tsv"):
        assert (a / name).read_bytes() != (c / name).read_bytes(), name


def test_kgc_reads_it_transductive_no_duplicates_no_self_loops(tmp_path):
    out = tmp_path / "g"
    sg.synth_graph(out, entities=4000, relations=60, seed=5)
    g = read_graph(out)
    assert g.layout == "KG-BERT" and g.num_entities == 4000 and g.num_relations == 60  # every relation in a triple
    splits = [g.splits[s] for s in ("train", "dev", "test")]
    allt = np.concatenate(splits)
    keys = (allt[:, 0] * g.num_relations + allt[:, 1]) * g.num_entities + allt[:, 2]
    assert len(np.unique(keys)) == len(keys)  # no duplicates within or across splits: the splits are disjoint
    assert not (allt[:, 0] == allt[:, 2]).any()
    for split in ("dev", "test"):
        ents, rels = g.unseen_in_train(split)
        assert len(ents) == 0 and len(rels) == 0, split
    assert len(np.unique(g.splits["train"][:, [0, 2]])) == 4000  # every entity has a train triple
    report = check_graph(g)
    assert report.errors == [] and report.of("warning") == []


def test_degrees_are_heavy_tailed(tmp_path):
    out = tmp_path / "g"
    sg.synth_graph(out, entities=5000, seed=0)
    g = read_graph(out)
    allt = np.concatenate([g.splits[s] for s in ("train", "dev", "test")])
    degree = np.sort(np.bincount(allt[:, 0], minlength=5000) + np.bincount(allt[:, 2], minlength=5000))[::-1]
    assert degree[: 5000 // 100].sum() >= 0.10 * degree.sum()  # the top 1 % hold at least 10 % of the endpoints
    assert np.median(degree) <= 6 and degree.min() >= 1
    assert degree[0] >= 20 * np.median(degree)
    relation = np.sort(np.bincount(allt[:, 1]))[::-1]
    assert relation[0] >= 5 * np.median(relation)  # relations are skewed too


def test_names_are_unique_and_descriptions_short_and_typed(tmp_path):
    out = tmp_path / "g"
    sg.synth_graph(out, entities=3000, seed=2)
    g = read_graph(out)
    assert len(set(g.names)) == 3000 and len(set(g.full_texts)) == 3000
    assert all(2 <= len(n.split()) <= 3 for n in g.names)
    lengths = [len(d.split()) for d in g.descriptions]
    assert 5 <= min(lengths) and max(lengths) <= 15
    # each description names its class, a word the texts of relations into that class carry
    classes = {text.split()[-1] for text in g.relation_texts}
    assert all(d.split()[2] in classes for d in g.descriptions)
    assert len(set(g.relation_texts)) == g.num_relations
    # many names need three words (more entities than half the two-word names), and a number only beyond all
    codes, words = sg.name_codes(np.random.default_rng(0), 30000)
    assert words == 3 and len(set(sg.names(codes, words))) == 30000
    three = len(sg.FIRST) * len(sg.SECOND) * len(sg.THIRD)
    assert sg.names(np.array([three - 1, three, 2 * three]), 3)[1:] == ["Amber Acorn Abbey 2", "Amber Acorn Abbey 3"]
    for words_list in (sg.FIRST, sg.SECOND, sg.THIRD, sg.CLASSES, sg.VERBS, sg.ADJECTIVES, sg.NOUNS):
        assert len(set(words_list)) == len(words_list) and not any("," in w for w in words_list)


def test_an_impossible_request_is_one_message_and_leaves_nothing(tmp_path, monkeypatch):
    with pytest.raises(KGCError, match="could not draw 200 distinct triples"):
        sg.synth_graph(tmp_path / "x", entities=10, relations=1, triples=200)
    with pytest.raises(KGCError, match="at least 10"):
        sg.synth_graph(tmp_path / "x", entities=3)
    with pytest.raises(KGCError, match="--dev-triples"):
        sg.synth_graph(tmp_path / "x", entities=20, triples=25, dev_fraction=0.4, test_fraction=0.4)
    assert list(tmp_path.iterdir()) == []

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sg, "_triple_lines", broken)
    with pytest.raises(KGCError, match="No space left"):
        sg.synth_graph(tmp_path / "x", entities=100)
    assert list(tmp_path.iterdir()) == []  # the half-written folder beside it is gone too


def test_cli_writes_refuses_a_non_empty_folder_and_replaces_with_force(tmp_path):
    out = tmp_path / "g"
    out.mkdir()  # an empty folder is fine
    res = cli("data", "synth-graph", out, "--entities", "2000", "--seed", "4")
    assert res.stdout.startswith("wrote 2,000 entities, 20 relations, triples train 7,184 / dev 898 / test 898 in ")
    assert f"→ {out}" in res.stdout and ("KiB" in res.stdout or "MiB" in res.stdout)
    first = (out / "train.tsv").read_bytes()
    res = cli("data", "synth-graph", out, "--entities", "2000", "--seed", "5", check=False)
    assert res.exit_code == 2 and "exists and is not empty" in res.stderr and "--force" in res.stderr
    assert (out / "train.tsv").read_bytes() == first
    cli("data", "synth-graph", out, "--entities", "2000", "--seed", "4", "--force")
    assert (out / "train.tsv").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
    res = cli("data", "check", out)
    assert "no problems found" in res.stdout and "error" not in res.stdout
    assert cli("data", "check", out, "--strict").exit_code == 0
    assert cli("data", "synth-graph", tmp_path / "h", "--entities", "5", check=False).exit_code == 2
