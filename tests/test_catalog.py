"""Dataset lookup order and readers (KG-BERT folder, PyKEEN label TSV, bundled pykeen sets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgc.data.catalog import find_dataset, list_datasets
from kgc.data.formats import load_graph, read_graph
from kgc.errors import KGCError


def test_data_home_wins(data_home):
    folder, where = find_dataset("umls")
    assert folder == data_home / "UMLS" and where == "$KGC_DATA_HOME"
    g = load_graph("WN18RR")
    assert (g.num_entities, g.num_relations) == (40943, 11)
    assert [len(g.splits[s]) for s in ("train", "dev", "test")] == [86835, 3034, 3134]
    dog = g.entity_index["02084071"]
    assert g.names[dog] == "domestic dog" and g.descriptions[dog].startswith("a member of the genus Canis")


def test_local_data_folder_then_pykeen_bundle(tmp_path, monkeypatch, toy_dir):
    monkeypatch.setenv("KGC_DATA_HOME", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    folder, where = find_dataset("umls")
    assert where.startswith("pykeen wheel")
    g = read_graph(folder)
    assert g.num_entities == 135 and len(g.splits["train"]) == 5216
    assert g.names[g.entity_index["idea_or_concept"]] == "idea or concept"  # label text, _ → space
    (tmp_path / "data").mkdir()
    toy_dir.rename(tmp_path / "data" / "UMLS")
    folder, where = find_dataset("umls")
    assert where == "./data" and folder == Path("data") / "UMLS"


def test_missing_dataset_names_the_folder_to_populate(tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KGCError, match=r"home/WN18RR.*kgc data fetch wn18rr"):
        find_dataset("wn18rr")
    rows = {r["name"]: r["where"] for r in list_datasets()}
    assert rows["wn18rr"] == "missing" and rows["nations"].startswith("pykeen")


def test_explicit_path_and_label_tsv(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train.txt").write_text("a_b\tlikes\tc\nc\tlikes\ta_b\n")
    (folder / "valid.txt").write_text("a_b\tlikes\tc\n")
    (folder / "test.txt").write_text("c\thates_it\ta_b\n")
    g = load_graph("ignored", path=str(folder))
    assert g.names == ["a b", "c"] and g.relation_texts == ["likes", "hates it"]
    assert g.splits["test"].tolist() == [[1, 1, 0]]
    with pytest.raises(KGCError, match="no train.tsv or train.txt"):
        load_graph("x", path=str(tmp_path / "nope"))


def test_fetch_checks_sha256_and_leaves_nothing_on_failure(tmp_path, monkeypatch, data_home):
    import dataclasses

    from kgc.data import catalog

    entry = catalog.CATALOG["umls"]
    entry = dataclasses.replace(entry, source=dataclasses.replace(entry.source, url=(data_home / "UMLS").as_uri()))
    monkeypatch.setitem(catalog.CATALOG, "umls", entry)
    home = tmp_path / "home"
    target = catalog.fetch_dataset("umls", home)
    assert target == home / "UMLS" and read_graph(target).num_entities == 135
    assert sorted(p.name for p in home.iterdir()) == ["UMLS"]

    bad = dataclasses.replace(entry, source=dataclasses.replace(entry.source,
                                                                files={**entry.source.files, "test.tsv": "0" * 64}))
    monkeypatch.setitem(catalog.CATALOG, "umls", bad)
    other = tmp_path / "other"
    with pytest.raises(KGCError, match="test.tsv: sha256 .* does not match"):
        catalog.fetch_dataset("umls", other)
    assert list(other.iterdir()) == []  # the partial download was removed
    offline = dataclasses.replace(entry, source=dataclasses.replace(entry.source, url=(tmp_path / "nowhere").as_uri()))
    monkeypatch.setitem(catalog.CATALOG, "umls", offline)
    with pytest.raises(KGCError, match=r"could not download .*Copy the files"):
        catalog.fetch_dataset("umls", other)
