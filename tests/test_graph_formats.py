"""Graph formats are a family (kgc.data.formats, kgc.registry.GRAPH_FORMATS): a folder is read by the format of
lowest rank that recognises it — KG-BERT's layout by its entity2text.txt, PyKEEN's label TSV as the last resort, a
registered format (the plugin demo's JSON lines, one module) by its own markers — and the dataset finder, the
catalog and `kgc data check` know a registered format's folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kgc.data.catalog import dataset_task, graph_markers
from kgc.data.check import check_graph
from kgc.data.formats import detect, read_graph
from kgc.errors import KGCError
from kgc.registry import GRAPH_FORMATS
from tests.plugin_demo.kgc_demo_plugin.formats import JSONL


@pytest.fixture
def jsonl(monkeypatch):
    list(GRAPH_FORMATS)  # the built-ins loaded first
    monkeypatch.setitem(GRAPH_FORMATS._members, "jsonl", JSONL)
    return JSONL


def write_jsonl(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


ROWS = [{"entity": "cat", "name": "cat", "description": "cat, a small feline"},
        {"entity": "dog", "name": "dog", "description": "a domestic canine"},
        {"head": "cat", "relation": "_chases", "tail": "mouse"},
        {"head": "dog", "relation": "_chases", "tail": "cat"},
        {"head": "dog", "relation": "eats", "tail": "bone", "split": "train"},
        {"head": "cat", "relation": "eats", "tail": "mouse", "split": "dev"},
        {"head": "dog", "relation": "_chases", "tail": "mouse", "split": "test"}]


def test_the_built_in_formats_are_registered_and_each_folder_goes_to_its_own(tmp_path):
    assert {"kgbert", "label_tsv"} <= set(GRAPH_FORMATS)
    kg = tmp_path / "kg"
    kg.mkdir()
    (kg / "entity2text.txt").write_text("a\tA\nb\tB\n")
    for split in ("train", "dev", "test"):
        (kg / f"{split}.tsv").write_text("a\tr\tb\n")
    tsv = tmp_path / "tsv"
    tsv.mkdir()
    for split in ("train", "valid", "test"):
        (tsv / f"{split}.txt").write_text("a_b\tr\tc\n")
    assert detect(kg).name == "kgbert" and read_graph(kg).layout == "KG-BERT"
    assert detect(tsv).name == "label_tsv" and read_graph(tsv).names == ["a b", "c"]
    assert detect(tmp_path / "empty").name == "label_tsv"  # the last resort, which names what it looked for
    (tmp_path / "empty").mkdir()
    with pytest.raises(KGCError, match=r"no train split \(looked for train\.tsv, train\.txt\)"):
        read_graph(tmp_path / "empty")
    assert set(graph_markers()) >= {"entity2text.txt", "train.tsv", "train.txt"}


def test_a_registered_format_reads_its_folders_and_the_finder_and_check_know_them(jsonl, tmp_path):
    folder = write_jsonl(tmp_path / "pets", ROWS)
    assert detect(folder) is jsonl and "graph.jsonl" in graph_markers()
    graph = read_graph(folder)
    assert graph.layout == "JSON lines" and graph.source == str(folder)
    assert graph.entities == ["cat", "dog", "mouse", "bone"]  # those with texts first, then as the triples name them
    assert graph.names == ["cat", "dog", "mouse", "bone"]
    assert graph.descriptions == ["a small feline", "a domestic canine", "", ""]  # the name's echo dropped (SimKGC)
    assert graph.relations == ["_chases", "eats"] and graph.relation_texts == ["chases", "eats"]
    want = {"train": [[0, 0, 2], [1, 0, 0], [1, 1, 3]], "dev": [[0, 1, 2]], "test": [[1, 0, 2]]}
    for split, rows in want.items():
        assert np.array_equal(graph.splits[split], np.array(rows)), split
    assert dataset_task(str(folder)) == "linkpred"  # a folder of a registered format is a link-prediction dataset
    report = check_graph(graph)
    assert report.layout == "JSON lines" and report.files == ["graph.jsonl"]
    assert report.triples == {"train": 3, "dev": 1, "test": 1}


def test_a_registered_formats_bad_line_is_one_message_naming_it(jsonl, tmp_path):
    folder = write_jsonl(tmp_path / "bad", ROWS[:3])
    with open(folder / "graph.jsonl", "a", encoding="utf-8") as fh:
        fh.write("{not json\n")
    with pytest.raises(KGCError, match=r"graph\.jsonl:4: not a JSON object"):
        read_graph(folder)
