"""New entities without retraining, and the mission's usage line, through the CLI on a slice of WN18RR.

An inductive split (held-out entities never in train) is made with ``kgc data inductive-split``, a tiny run
is trained on its train split, and then: ``kgc evaluate RUN --entities-from`` ranks exactly as a brute-force
cosine ranking over the held-out entities; ``kgc index RUN --add`` makes new entities answers and heads;
``kgc predict`` without a run directory picks the newest run and builds (or rebuilds) its index.
The commands run in this process (:func:`tests.conftest.cli`, as ``kgc.cli.main`` runs them).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import cli as kgc, linkpred_model

pytestmark = pytest.mark.slow


def write_slice(src: Path, out: Path, n_train: int = 1500, n_eval: int = 80) -> Path:
    """The first triples of WN18RR's splits with the texts of the entities they use (a quick KG-BERT folder)."""
    out.mkdir(parents=True)
    rows = {s: (src / f"{s}.tsv").read_text().splitlines() for s in ("train", "dev", "test")}
    pick = {"train": rows["train"][:n_train], "dev": rows["dev"][:n_eval], "test": rows["test"][:n_eval]}
    used = {x for lines in pick.values() for line in lines for x in line.split("\t")[::2]}
    for s, lines in pick.items():
        (out / f"{s}.tsv").write_text("".join(line + "\n" for line in lines))
    texts = [line for line in (src / "entity2text.txt").read_text().splitlines() if line.split("\t")[0] in used]
    (out / "entity2text.txt").write_text("".join(line + "\n" for line in texts))
    shutil.copyfile(src / "relation2text.txt", out / "relation2text.txt")
    return out


def read_triples(path: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def split(tmp_path_factory, data_home) -> Path:
    tmp = tmp_path_factory.mktemp("inductive")
    source = write_slice(data_home / "WN18RR", tmp / "slice")
    out = kgc("data", "inductive-split", source, tmp / "split", "--held-out", 80, "--seed", 0)
    assert "held out 80 entities" in out.stdout
    return tmp / "split"


@pytest.fixture(scope="module")
def trained(split, tiny_bert, tmp_path_factory) -> Path:
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    tmp = tmp_path_factory.mktemp("inductive_run")
    recipe = tmp / "tiny.yaml"
    recipe.write_text(
        "name: tiny\n"
        f"data: {{dataset: {split}, neighbor_text: true, max_tokens: 24}}\n"
        f"model: {{backbone: {tiny_bert}, conditioner: biencoder}}\n"
        "loss: {pre_batch: 2, self_negative: true}\n"
        "train: {epochs: 1, batch_size: 32, lr: 0.001, warmup_steps: 2, checkpoint_every: 4, log_every: 1, "
        "num_threads: 1, max_steps: 4}\n"
        "eval: {batch_size: 128, dev_queries: 20}\n")
    return train(load_recipe(recipe), out=tmp / "run", progress=False, echo=lambda m: None)


def test_inductive_split_holds_entities_out_of_training(split):
    train = read_triples(split / "train.tsv") + read_triples(split / "dev.tsv")
    test = read_triples(split / "test.tsv")
    held = set((split / "held_out_entities.txt").read_text().split())
    assert len(held) == 80 and test
    assert all(h in held and t in held for h, _, t in test)  # both ends unseen, as in Wikidata5M-inductive
    assert not held & {e for h, _, t in train for e in (h, t)}
    summary = json.loads((split / "split.json").read_text())
    assert summary["triples"]["test"] == len(test) and summary["held_out_entities"] == 80
    again = kgc("data", "inductive-split", split, split, "--held-out", 4, check=False)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_inductive_evaluation_matches_brute_force(trained, split):
    out = kgc("evaluate", trained, "--entities-from", split, "--no-progress")
    assert "inductive" in out.stdout and "MRR" in out.stdout and "warning" not in out.stderr
    results = json.loads((trained / "results.inductive.json").read_text())
    info = results["kgc"]["inductive"]
    test = read_triples(split / "test.tsv")
    cand = sorted({e for h, _, t in test for e in (h, t)})
    assert info["entities"] == len(cand) and info["candidates"] == "split" and info["seen_in_training"] == 0
    assert results["kgc"]["queries"] == 2 * len(test)
    with open(trained / "ranks.inductive.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 2 * len(test)
    mrr = results["both"]["realistic"]["inverse_harmonic_mean_rank"]
    assert mrr == pytest.approx(np.mean([1 / float(r["rank"]) for r in rows]))

    # brute force: the run over its own graph holds the held-out entities too, with the same texts (no
    # train neighbours); rank the gold among the candidates by cosine, other known answers filtered out
    model, graph = linkpred_model(trained)
    assert all(model.bank.entity_ids(graph.entity_index[e]) == model.bank.base[graph.entity_index[e]] for e in cand)
    ids = [graph.entity_index[e] for e in cand]
    with torch.no_grad():
        table = model.encode_entities(ids).numpy()  # (candidates, dim)
    known: dict[tuple[str, str], set[str]] = {}
    for h, r, t in test:  # train and dev hold no candidate, so the filter is the test triples (both ways)
        known.setdefault((h, r), set()).add(t)
        known.setdefault((t, "inverse " + r), set()).add(h)
    R = graph.num_relations
    for row in rows:
        rel = row["relation"]
        r = graph.relation_index[rel.removeprefix("inverse ")] + (R if rel.startswith("inverse ") else 0)
        with torch.no_grad():
            q = model.encode_queries([graph.entity_index[row["head"]]], [r]).numpy()[0]
        scores = table @ q
        gold = scores[cand.index(row["answer"])]
        others = [i for i, e in enumerate(cand) if e not in known[(row["head"], rel)]]
        assert float(row["rank"]) == pytest.approx(1 + np.sum(scores[others] > gold + 1e-6), abs=0.5), row


def test_inductive_evaluation_errors_and_warnings(trained, split, tmp_path):
    from kgc.data.inductive import read_inductive_folder
    from kgc.errors import KGCError

    folder = tmp_path / "seen"
    folder.mkdir()
    for f in ("entity2text.txt", "relation2text.txt"):
        shutil.copyfile(split / f, folder / f)
    (folder / "test.tsv").write_text("".join("\t".join(t) + "\n" for t in read_triples(split / "train.tsv")[:5]))
    out = kgc("evaluate", trained, "--entities-from", folder, "--candidates", "all", "--no-progress")
    assert "warning" in out.stderr and "occur in the run's training triples" in out.stderr
    info = json.loads((trained / "results.inductive.json").read_text())["kgc"]["inductive"]
    assert info["seen_in_training"] > 0 and info["candidates"] == "all" and info["entities"] == info["folder_entities"]
    known = linkpred_model(trained)[1]
    h, _, t = read_triples(split / "test.tsv")[0]
    (folder / "test.tsv").write_text(f"{h}\t_made_up_relation\t{t}\n")
    with pytest.raises(KGCError, match="'_made_up_relation'.*not relations of the run"):
        read_inductive_folder(folder, known)
    with pytest.raises(KGCError, match="no such folder"):
        read_inductive_folder(tmp_path / "nowhere", known)
    bad = kgc("evaluate", trained, "--entities-from", split, "--rerank", check=False)
    assert bad.returncode == 2 and "unseen entities have none" in bad.stderr


def test_inductive_evaluation_is_never_reranked(trained, split):
    """SimKGC turns graph re-ranking off for inductive evaluation: with a run whose recipe re-ranks, the inductive
    ranks are the plain cosine ranks (with an empty train graph the boost would only lift the head itself)."""
    from kgc.linkpred.answer.run import LinkPredRun

    run = LinkPredRun(trained, device="cpu", echo=None)
    plain = run.evaluation("test", entities_from=split).results
    rr = run.recipe.eval.rerank.model_copy(update={"enabled": True, "n_hop": 1, "weight": 10.0})
    run.recipe = run.recipe.model_copy(update={"eval": run.recipe.eval.model_copy(update={"rerank": rr})})
    again = run.evaluation("test", entities_from=split).results
    assert again["kgc"]["rerank"] is None
    assert again["both"]["realistic"]["inverse_harmonic_mean_rank"] == plain["both"]["realistic"][
        "inverse_harmonic_mean_rank"]


@pytest.fixture(scope="module")
def added(trained, split, tmp_path_factory):
    """Two new entities: a copy of a held-out entity's text (no neighbours, so the same text exactly) and one new."""
    tmp = tmp_path_factory.mktemp("added")
    held = (split / "held_out_entities.txt").read_text().split()[0]
    text = dict(line.split("\t", 1) for line in (split / "entity2text.txt").read_text().splitlines())[held]
    name, _, desc = text.partition(", ")
    new = tmp / "new.tsv"
    new.write_text(f"new_copy\t{name}\t{desc}\n\nnew_ship\tspaceship\ta vehicle for travel beyond the atmosphere\n")
    out = kgc("index", trained, "--add", new, "--no-progress")  # no index yet: built first, then the new rows
    assert "no index yet: building it" in out.stderr and "added 2 entities" in out.stdout
    return {"held": held, "file": new, "tmp": tmp}


def open_predictor(run: Path):
    """(run dir, model, graph with the added entities, FAISS index), as `kgc predict` / kgc.Run.predict see them."""
    import kgc as api

    r = api.load(run, echo=None)
    index, graph, bank = r.entities.searcher(progress=False)
    assert bank.graph is graph and r.predictor.model().bank.graph is r.predictor.graph()  # the extended bank is passed, not swapped in
    return r, r.predictor.model(), graph, index


def test_added_entities_are_answers(trained, added):
    from kgc.fileio import sha256_file

    folder = trained / "index"
    meta = json.loads((folder / "meta.json").read_text())
    run, model, graph, _ = open_predictor(trained)
    n = graph.num_entities - 2  # the graph now ends with the added entities
    assert graph.entities[n:] == ["new_copy", "new_ship"] and graph.names[n + 1] == "spaceship"
    assert meta["entities"] == n + 2 and meta["added_entities"]["count"] == 2
    assert meta["added_entities"]["sha256"] == sha256_file(folder / "added_entities.tsv")
    assert meta["added_entities"]["sources"][0]["sha256"] == sha256_file(added["file"])
    table = np.load(folder / "entities.npy")
    assert table.shape[0] == n + 2
    np.testing.assert_allclose(table[n], table[graph.entity_index[added["held"]]], atol=1e-6)  # the same text
    full = json.loads(kgc("predict", trained, "--head", added["held"], "--relation", "_hypernym", "--top-k", n + 2,
                          "--json", "--include-head").stdout)["predictions"]
    assert len(full) == n + 2
    score = {p["entity"]: p["score"] for p in full}
    assert score["new_copy"] == pytest.approx(score[added["held"]], abs=1e-5) and "new_ship" in score
    order = [p["entity"] for p in full]
    k = max(order.index("new_copy"), order.index(added["held"])) + 1  # tied: either may come first
    top = json.loads(kgc("predict", trained, "--head", added["held"], "--relation", "_hypernym", "--top-k", k,
                         "--json", "--include-head").stdout)["predictions"]
    assert {"new_copy", added["held"]} <= {p["entity"] for p in top}
    assert next(p for p in top if p["entity"] == "new_copy")["text"].startswith(graph.full_texts[n][:30])
    # the ordinary evaluation still ranks over the dataset's entities only, from the index's first rows
    ev = run.evaluation("test")
    assert ev.results["kgc"]["entity_embeddings"] == "index" and ev.results["kgc"]["entities"] == n


def test_added_entity_as_head(trained, added):
    by_new = json.loads(kgc("predict", trained, "--head", "new_copy", "--relation", "_hypernym", "--top-k", 5,
                            "--json").stdout)
    assert by_new["head"] == "new_copy"  # the query tower read its stored text, identical to the held-out one's
    run, model, graph, index = open_predictor(trained)
    by_old = run.answer(added["held"], "_hypernym", top_k=5).predictions
    np.testing.assert_allclose([p["score"] for p in by_new["predictions"]], [p.score for p in by_old], atol=1e-5)
    ship = run.answer("spaceship", "_hypernym", top_k=3)  # found by name
    assert ship.head == "new_ship" and len(ship.predictions) == 3


def test_bad_new_entities_are_refused(trained, added):
    from kgc.errors import KGCError
    from kgc.linkpred.index.store import add_entities
    from kgc.linkpred.answer.run import LinkPredRun

    tmp = added["tmp"]
    (tmp / "one_field.tsv").write_text("ok_id\tok name\tfine\nlonely_field\n")
    bad = kgc("index", trained, "--add", tmp / "one_field.tsv", check=False)
    assert bad.returncode == 2 and "one_field.tsv:2: expected id<TAB>name<TAB>description" in bad.stderr
    run = LinkPredRun(trained, device="cpu", echo=None)
    model, graph = run.predictor.model(), run.predictor.graph()
    cases = {
        "empty_name.tsv": ("x1\t\tdesc\n", "empty_name.tsv:1: empty name"),
        "repeat.tsv": ("r1\tone\n\nr1\tagain\n", "repeat.tsv:3: id 'r1' repeats line 1"),
        "existing.tsv": (f"{added['held']}\tsome name\n", "existing.tsv:1: .* already an entity of the run's graph"),
        "again.tsv": ("new_copy\tanother name\n", "again.tsv:1: id 'new_copy' was already added"),  # the same id
        "blank.tsv": ("\n\n", "blank.tsv: no entities"),
    }
    for name, (text, message) in cases.items():
        (tmp / name).write_text(text)
        with pytest.raises(KGCError, match=message):
            add_entities(run.dir, model, graph, tmp / name)
    assert json.loads((trained / "index" / "meta.json").read_text())["added_entities"]["count"] == 2  # unchanged
    # the same file again (an add retried after an error past its commit point): nothing to do, said
    out = kgc("index", trained, "--add", added["file"], "--no-progress")
    assert "its entities are in the index already, as they are" in out.stdout
    assert json.loads((trained / "index" / "meta.json").read_text())["added_entities"]["count"] == 2


def test_rebuild_keeps_added_entities(trained, added):
    out = kgc("index", trained, "--force", "--no-progress")  # a rebuild re-embeds the added entities too
    assert "2 of them added, kept" in out.stdout
    assert json.loads((trained / "index" / "meta.json").read_text())["added_entities"]["count"] == 2
    # the stored list cut to its first line: the index is stale, predict rebuilds it from the copy of record (a list
    # is never shortened by losing lines); only --drop-added removes added entities
    stored = trained / "index" / "added_entities.tsv"
    whole = stored.read_text()
    stored.write_text(whole.splitlines()[0] + "\n")
    out = kgc("predict", trained, "--head", "new_copy", "--relation", "_hypernym", "--top-k", 3, "--json",
              "--no-progress")
    assert "rebuilding the index" in out.stderr and "added_entities.tsv changed" in out.stderr
    assert "holds only the first 1 of the 2 entities recorded" in out.stderr and stored.read_text() == whole
    assert json.loads((trained / "index" / "meta.json").read_text())["added_entities"]["count"] == 2
    out = kgc("index", trained, "--drop-added", "--no-progress")
    assert "dropped 2 added entities" in out.stdout
    _, _, graph, index = open_predictor(trained)
    assert "new_ship" not in graph.entity_index and index.ntotal == graph.num_entities
    kgc("index", trained, "--add", added["file"], "--no-progress")  # as the fixture left it, for the next test


def test_predict_without_run_dir_uses_the_newest_run(trained, added, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    older, newer = runs / "older", runs / "nested" / "newer"
    for dst in (older, newer):
        shutil.copytree(trained, dst, ignore=shutil.ignore_patterns("index"))
    csts = runs / "csts"  # the newest of all, but not link prediction
    csts.mkdir(parents=True)
    (csts / "recipe.yaml").write_text("name: c\ntask: csts\n")
    (csts / "best.pt").write_bytes(b"")
    for i, run in enumerate((older, newer, csts)):  # "newest": the weights written last
        for weights in (run / "best.pt", run / "checkpoints" / "last.pt"):
            if weights.is_file():
                os.utime(weights, (1_000_000 + i, 1_000_000 + i))
    monkeypatch.chdir(tmp_path)
    out = kgc("predict", "--head", added["held"], "--relation", "_hypernym", "--top-k", 3, "--json")
    assert "using the newest run: runs/nested/newer" in out.stderr
    assert "no index yet: building it" in out.stderr and (newer / "index" / "meta.json").is_file()
    answer = json.loads(out.stdout)
    assert answer["run"] == "runs/nested/newer" and len(answer["predictions"]) == 3
    assert not (older / "index").exists()
    # new weights: the index is stale, and predict rebuilds it, saying why
    state = torch.load(newer / "best.pt", weights_only=False)
    next(iter(state["model"].values())).add_(1.0)
    torch.save(state, newer / "best.pt")
    from kgc.training.run import RunDir

    summary = json.loads((newer / "train_summary.json").read_text())  # as a retraining records them
    summary["files"] = RunDir(newer).file_records()
    (newer / "train_summary.json").write_text(json.dumps(summary))
    stale = kgc("predict", "--head", added["held"], "--relation", "_hypernym", "--top-k", 3)
    assert "rebuilding the index of runs/nested/newer: it was built from other model weights" in stale.stderr
    again = kgc("predict", "--head", added["held"], "--relation", "_hypernym", "--top-k", 3)
    assert "using the newest run: runs/nested/newer" in again.stderr and "building" not in again.stderr


def test_no_run_found_says_how_to_train_one(tmp_path, monkeypatch):
    from kgc.errors import KGCError
    from kgc.linkpred.answer.run import find_latest_run

    monkeypatch.chdir(tmp_path)
    with pytest.raises(KGCError, match=r"no trained link-prediction run.*`kgc train RECIPE`"):
        find_latest_run()
    (tmp_path / "runs" / "half").mkdir(parents=True)
    (tmp_path / "runs" / "half" / "recipe.yaml").write_text("name: x\n")  # a run that never saved weights
    with pytest.raises(KGCError, match="no trained link-prediction run"):
        find_latest_run()


def test_the_shipped_inductive_recipe_is_the_measured_command_and_finds_its_split_by_name(split, tmp_path,
                                                                                         monkeypatch):
    """recipes/wn18rr_inductive.yaml resolves to exactly what docs/scale.md measured (`kgc train
    recipes/wn18rr_cpu_biencoder.yaml --set data.path=data/wn18rr-ind`), and `data.dataset: NAME` finds a split
    written under ./data (or $KGC_DATA_HOME) by its name; a missing one says how derived sets are made."""
    from kgc.data.catalog import find_dataset
    from kgc.errors import KGCError
    from kgc.recipe import load_recipe
    from tests.conftest import ROOT

    monkeypatch.chdir(tmp_path)
    shipped = load_recipe(ROOT / "recipes" / "wn18rr_inductive.yaml")
    measured = load_recipe(ROOT / "recipes" / "wn18rr_cpu_biencoder.yaml", ["data.path=data/wn18rr-ind"])
    assert shipped.data.dataset == measured.data.dataset == "wn18rr-ind"
    assert shipped.model_dump(exclude={"name": True, "data": {"path"}}) == \
        measured.model_dump(exclude={"name": True, "data": {"path"}})
    with pytest.raises(KGCError, match=r"dataset 'wn18rr-ind': not a catalog name .* here or under .*data/wn18rr-ind"
                                       r".*\(a derived set is written first: `kgc data inductive-split`"):
        find_dataset("wn18rr-ind")
    shutil.copytree(split, tmp_path / "data" / "wn18rr-ind")
    monkeypatch.delenv("KGC_DATA_HOME", raising=False)
    assert find_dataset("wn18rr-ind") == (Path("data") / "wn18rr-ind", "./data")
