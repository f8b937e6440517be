"""Wikidata5M: the fetch converts the authors' archives (tiny fakes in their exact formats) to a KG-BERT folder."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from kgc.data import catalog, wikidata5m
from kgc.data.catalog import fetch_dataset, find_dataset, list_datasets
from kgc.data.formats import load_graph, read_graph
from kgc.errors import KGCError

LONG = " ".join(f"w{i}" for i in range(100))
ALIASES = {  # Q-id → aliases, as wikidata5m_entity.txt (Q5 has none; Q999 is in no triple)
    "Q1": ["Douglas Adams", "douglas noel adams"], "Q2": ["Cambridge"], "Q3": ["writer", "author"],
    "Q4": ["  Hitchhiker's   Guide  "], "Q6": ["Trillian"], "Q7": ["", "Ford Prefect"], "Q8": ["Betelgeuse"],
    "Q999": ["Nobody"],
}
TEXTS = {  # wikidata5m_text.txt (Q4 has none; Q1 starts with its name; a stray \r in Q6; Q999 is in no triple)
    "Q1": "Douglas Adams was an English author.\tHe wrote the Guide.", "Q2": "Cambridge is a city in England.",
    "Q3": LONG, "Q5": "An unnamed thing.", "Q6": "Trillian is a\r character.", "Q7": "Ford is a researcher.",
    "Q8": "Betelgeuse is a star.", "Q999": "Should be dropped.",
}
RELATIONS = {"P1": ["educated at", "alma mater"], "P2": ["occupation"], "P7": ["notable work"], "P9": ["ignored"]}
SPLITS = {  # P3484 has no alias: it keeps its id as text
    "transductive": {"train": [("Q1", "P1", "Q2"), ("Q1", "P2", "Q3"), ("Q1", "P7", "Q4"), ("Q5", "P3484", "Q1")],
                     "valid": [("Q2", "P1", "Q3")], "test": [("Q4", "P2", "Q3"), ("Q5", "P1", "Q2")]},
    "inductive": {"train": [("Q1", "P1", "Q2"), ("Q1", "P2", "Q3")], "valid": [("Q6", "P2", "Q7")],
                  "test": [("Q8", "P7", "Q4"), ("Q8", "P1", "Q5")]},
}


def _tar_gz(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _rows(table: dict[str, list[str]]) -> str:
    return "".join("\t".join([k, *v]) + "\n" for k, v in table.items())


def write_archives(folder: Path) -> Path:
    """The four archives, laid out as the authors distribute them."""
    folder.mkdir(parents=True, exist_ok=True)
    for variant, splits in SPLITS.items():
        _tar_gz(folder / f"wikidata5m_{variant}.tar.gz",
                {f"wikidata5m_{variant}_{s}.txt": "".join("\t".join(t) + "\n" for t in rows)
                 for s, rows in splits.items()})
    _tar_gz(folder / "wikidata5m_alias.tar.gz",
            {"wikidata5m_relation.txt": _rows(RELATIONS), "wikidata5m_entity.txt": _rows(ALIASES)})
    with gzip.open(folder / "wikidata5m_text.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(f"{k}\t{v}\n" for k, v in TEXTS.items()))
    return folder


@pytest.fixture()
def archives(tmp_path) -> Path:
    return write_archives(tmp_path / "downloads")


def _extract(archives: Path, out: Path) -> Path:
    """SimKGC's download script leaves the extracted files (and no archives)."""
    out.mkdir()
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
    for name in [f"wikidata5m_{v}.tar.gz" for v in SPLITS] + ["wikidata5m_alias.tar.gz"]:
        with tarfile.open(archives / name) as tar:
            tar.extractall(out, **safe)
    (out / "wikidata5m_text.txt").write_bytes(gzip.decompress((archives / "wikidata5m_text.txt.gz").read_bytes()))
    return out


@pytest.mark.parametrize("layout", ["archives", "extracted"])
def test_transductive_from_folder_loads_with_names_descriptions_and_splits(tmp_path, archives, capsys, monkeypatch,
                                                                          layout):
    source = archives if layout == "archives" else _extract(archives, tmp_path / "extracted")
    home = tmp_path / "home"
    target = fetch_dataset("wikidata5m", home, source=str(source))
    assert target == home / "Wikidata5M" and sorted(p.name for p in home.iterdir()) == ["Wikidata5M"]
    out = capsys.readouterr().out
    assert "4,594,485 entities, 822 relations" in out and "This downloads" not in out

    monkeypatch.setenv("KGC_DATA_HOME", str(home))
    g = load_graph("wikidata5m", long_text=True)
    assert g.entities == ["Q1", "Q2", "Q3", "Q4", "Q5"]  # alias-file order, then the unnamed one; Q999 dropped
    assert "Q999" not in (target / "entity2textlong.txt").read_text()
    assert g.names == ["Douglas Adams", "Cambridge", "writer", "Hitchhiker's Guide", "Q5"]
    assert g.descriptions[0] == "was an English author. He wrote the Guide."  # name prefix dropped, tab → space
    assert g.descriptions[2].split() == LONG.split()[: wikidata5m.DESCRIPTION_WORDS]
    assert g.descriptions[3] == "" and g.descriptions[4] == "An unnamed thing."
    assert g.relations == ["P1", "P2", "P7", "P3484"]
    assert g.relation_texts == ["educated at", "occupation", "notable work", "P3484"]
    assert [len(g.splits[s]) for s in ("train", "dev", "test")] == [4, 1, 2]
    assert g.splits["test"].tolist() == [[3, 1, 2], [4, 0, 1]]
    assert load_graph("wikidata5m").descriptions == [""] * 5  # names only unless data.long_text
    counts = json.loads((target / "wikidata5m.json").read_text())["counts"]
    assert (counts["entities_without_alias"], counts["entities_without_description"]) == (1, 1)
    assert counts["relations_without_alias"] == ["P3484"]


def test_inductive_variant(tmp_path, archives):
    target = fetch_dataset("Wikidata5M-inductive", tmp_path / "home", source=str(archives))
    assert target.name == "Wikidata5M-inductive"
    g = read_graph(target, long_text=True)
    ents = {s: {g.entities[i] for i in g.splits[s][:, [0, 2]].ravel()} for s in ("train", "dev", "test")}
    assert ents == {"train": {"Q1", "Q2", "Q3"}, "dev": {"Q6", "Q7"}, "test": {"Q8", "Q4", "Q5"}}
    assert g.num_entities == 8 and "Q999" not in g.entities
    assert g.names[g.entity_index["Q8"]] == "Betelgeuse" and g.names[g.entity_index["Q7"]] == "Ford Prefect"
    assert g.descriptions[g.entity_index["Q6"]] == "is a character."  # a stray \r does not end the line


def test_size_warning_and_no_download_without_consent(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wikidata5m, "_download", lambda *a: pytest.fail("must not download"))
    home = tmp_path / "home"
    with pytest.raises(KGCError, match=r"large download .*stdin is not a terminal.*--yes.*--from FOLDER"):
        fetch_dataset("wikidata5m", home)
    out = capsys.readouterr().out
    assert "4,594,485 entities" in out and "downloads about 1.3 GB" in out and "wikidata5m_text.txt.gz ~990 MB" in out
    with pytest.raises(KGCError, match="cancelled; nothing was downloaded"):
        fetch_dataset("wikidata5m", home, ask=lambda question: False)
    assert not home.exists()


def test_download_tries_mirrors_keeps_archives_and_reuses_them(tmp_path, archives, monkeypatch, capsys):
    real = wikidata5m.archive_urls
    dead = (tmp_path / "gone").as_uri()
    page = tmp_path / "moved.html"  # a mirror that answers with a web page is skipped too
    page.write_text("<html>this file has moved</html>")
    monkeypatch.setattr(wikidata5m, "archive_urls",
                        lambda v: {a: (f"{dead}/{a}", page.as_uri(), (archives / a).as_uri()) for a in real(v)})
    home = tmp_path / "home"
    fetch_dataset("wikidata5m", home, yes=True)
    kept = home / wikidata5m.ARCHIVE_DIR
    assert sorted(p.name for p in kept.iterdir()) == ["wikidata5m_alias.tar.gz", "wikidata5m_text.txt.gz",
                                                      "wikidata5m_transductive.tar.gz"]
    assert read_graph(home / "Wikidata5M").num_entities == 5
    assert "sha256" in capsys.readouterr().out
    assert not list(kept.glob("*.part"))
    monkeypatch.setattr(wikidata5m, "archive_urls",  # the second variant downloads its split only
                        lambda v: {a: ((archives / a).as_uri() if "inductive" in a else dead,) for a in real(v)})
    fetch_dataset("wikidata5m-inductive", home, yes=True)
    assert "downloads about 0.2 GB (wikidata5m_inductive.tar.gz" in capsys.readouterr().out
    assert read_graph(home / "Wikidata5M-inductive").num_entities == 8


def test_truncated_archive_or_missing_piece_is_one_clear_error(tmp_path, archives):
    home = tmp_path / "home"
    text = archives / "wikidata5m_text.txt.gz"
    text.write_bytes(text.read_bytes()[:-20])
    with pytest.raises(KGCError, match=r"wikidata5m_text.txt.gz: cannot be read to the end.*fetch again"):
        fetch_dataset("wikidata5m", home, source=str(archives))
    assert list(home.iterdir()) == []  # the half-converted folder was removed
    text.unlink()
    with pytest.raises(KGCError, match=r"missing wikidata5m_text.txt.gz \(or its files wikidata5m_text.txt\)"):
        fetch_dataset("wikidata5m", home, source=str(archives))


def test_catalog_lists_both_variants(tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_DATA_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rows = {r["name"]: r["where"] for r in list_datasets()}
    assert rows["wikidata5m"] == "missing" and rows["wikidata5m-inductive"] == "missing"
    with pytest.raises(KGCError, match=r"Wikidata5M-inductive .*kgc data fetch wikidata5m-inductive"):
        find_dataset("wikidata5m-inductive")
    assert catalog.catalog_entry("FB15k-237").name == "fb15k237"
