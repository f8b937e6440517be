"""GraIL's inductive splits (kgc.data.grail) and their two protocols: the full ranking over the inference graph
(kgc's filtered evaluation over an --entities-from folder) and GraIL's 50 sampled negatives
(kgc.linkpred.evaluation.sampled), each against a brute-force reference."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kgc.data.formats import read_graph
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from tests.conftest import cli


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _entities(rows) -> set[str]:
    return {e for h, _, t in rows for e in (h, t)}


def _read(path: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ["grail-wn18rr-v1", "grail-fb237-v1", "grail-wn18rr-v3"])
def test_a_split_is_its_training_graph_and_an_inference_graph_with_texts(name, cache, data_home):
    """The derived folder's training graph is GraIL's vN, byte for byte, with the texts of its own entities only
    (no inference entity can be embedded in training); inference/ is vN_ind with its entities' texts. WN18RR v3 as
    published shares 8 entities between the two graphs: said in grail.json, not hidden."""
    from kgc.data import grail
    from kgc.data.catalog import find_dataset

    folder, where = find_dataset(name)
    assert where == "derived" and folder == cache / "datasets" / name
    train_src, ind_src = grail.source(name, [data_home])
    for sub, src in ((folder, train_src), (folder / "inference", ind_src)):
        for file, tsv in grail.KG_SPLITS.items():
            assert (sub / tsv).read_bytes() == (src / file).read_bytes()
    train_entities = _entities(r for f in grail.FILES for r in _read(train_src / f))
    ind_entities = _entities(r for f in grail.FILES for r in _read(ind_src / f))
    texts = {line.split("\t")[0] for line in (folder / "entity2text.txt").read_text().splitlines()}
    assert texts == train_entities  # the training graph's text bank: its own entities, every one with a text
    ind_texts = {line.split("\t")[0] for line in (folder / "inference" / "entity2text.txt").read_text().splitlines()}
    assert ind_texts == ind_entities
    meta = json.loads((folder / "grail.json").read_text())
    assert meta["shared_entities"] == sorted(train_entities & ind_entities)
    assert (len(meta["shared_entities"]) == 8) == (name == "grail-wn18rr-v3")
    graph = read_graph(folder)  # what kgc train reads: the graph's entities are the training graph's
    assert set(graph.entities) == train_entities
    assert find_dataset(name)[0] == folder  # the second time: read, not written again (its stamp matches)


def test_a_lookup_trusts_the_stamp_until_a_text_file_changes(cache, data_home, tmp_path, monkeypatch):
    """A second lookup of a built split hashes no text file (their size and time are the stamp's); a text file
    touched since (another time, the same contents) is hashed once and its new time recorded, so the lookups after
    trust the stamp again; a changed text rebuilds the split with it."""
    from kgc.data import grail
    from kgc.data.catalog import find_dataset

    home = tmp_path / "home"
    (home / "GraIL").mkdir(parents=True)
    for f in grail.folders("grail-wn18rr-v1"):
        (home / "GraIL" / f).symlink_to(data_home / "GraIL" / f)
    shutil.copytree(data_home / "WN18RR", home / "WN18RR")
    monkeypatch.setenv("KGC_DATA_HOME", str(home))
    folder, _ = find_dataset("grail-wn18rr-v1")
    hashed = []
    real = grail.sha256_cached
    monkeypatch.setattr(grail, "sha256_cached", lambda p, *a: hashed.append(Path(p).parent.name) or real(p, *a))
    stamp = (folder / "grail.json").stat().st_mtime_ns
    assert find_dataset("grail-wn18rr-v1")[0] == folder
    assert "WN18RR" not in hashed and (folder / "grail.json").stat().st_mtime_ns == stamp
    texts = home / "WN18RR" / "entity2text.txt"
    os.utime(texts, ns=(texts.stat().st_atime_ns, texts.stat().st_mtime_ns + 10**9))  # touched: the same contents
    find_dataset("grail-wn18rr-v1")  # hashed once, the split kept, the new time recorded in its stamp
    assert hashed.count("WN18RR") == 1 and (folder / "grail.json").stat().st_mtime_ns != stamp
    assert (folder / "entity2text.txt").stat().st_mtime_ns < stamp + 1  # not rebuilt
    assert json.loads((folder / "grail.json").read_text())["stats"][str(texts)][1] == texts.stat().st_mtime_ns
    hashed.clear()
    find_dataset("grail-wn18rr-v1")  # and trusted again from then on
    assert "WN18RR" not in hashed
    lines = texts.read_text().splitlines(keepends=True)
    own = {line.split("\t")[0] for line in (folder / "entity2text.txt").read_text().splitlines()}
    first = next(i for i, line in enumerate(lines) if line.split("\t")[0] in own)
    key = lines[first].split("\t")[0]
    lines[first] = f"{key}\tan edited text\n"
    texts.write_text("".join(lines))
    find_dataset("grail-wn18rr-v1")
    assert "WN18RR" in hashed
    assert f"{key}\tan edited text\n" in (folder / "entity2text.txt").read_text()


def test_a_changed_source_file_is_refused(cache, data_home, tmp_path, monkeypatch):
    """A GraIL file that is not the published one (here: a line cut) is one message naming it."""
    from kgc.data.catalog import find_dataset

    home = tmp_path / "home"
    shutil.copytree(data_home / "GraIL" / "WN18RR_v1", home / "GraIL" / "WN18RR_v1")
    shutil.copytree(data_home / "GraIL" / "WN18RR_v1_ind", home / "GraIL" / "WN18RR_v1_ind")
    (home / "WN18RR").symlink_to(data_home / "WN18RR")
    f = home / "GraIL" / "WN18RR_v1" / "test.txt"
    f.write_text("".join(f.read_text().splitlines(keepends=True)[:-1]))
    monkeypatch.setenv("KGC_DATA_HOME", str(home))
    with pytest.raises(KGCError, match=r"test\.txt: sha256 .* is not the published file's"):
        find_dataset("grail-wn18rr-v1")


def _toy_inference_graph() -> KnowledgeGraph:
    rng = np.random.default_rng(3)
    n, r = 40, 3
    known = np.unique(np.stack([rng.integers(0, n, 120), rng.integers(0, r, 120), rng.integers(0, n, 120)], 1), axis=0)
    known = known[known[:, 0] != known[:, 2]]
    test = np.array([[1, 0, 2], [3, 1, 4], [5, 2, 6], [7, 0, 8], [9, 1, 10]])
    test = test[[not ((known == t).all(1)).any() for t in test]]
    return KnowledgeGraph(entities=[f"e{i}" for i in range(n)], names=[f"e{i}" for i in range(n)],
                          descriptions=[""] * n, relations=[f"r{i}" for i in range(r)],
                          relation_texts=[f"r{i}" for i in range(r)],
                          splits={"train": known, "dev": np.zeros((0, 3), np.int64), "test": test})


def test_negatives_are_drawn_as_grail_draws_them():
    """Every draw is from the pool, never the query's own entity, never a known-graph triple (read in both
    directions: a replaced head's triple (h', r, t) is checked as (t, inverse r, h'))."""
    from kgc.linkpred.evaluation.ranking import query_directions
    from kgc.linkpred.evaluation.sampled import sample_negatives

    g = _toy_inference_graph()
    known = {tuple(t) for t in g.splits["train"].tolist()}
    pool = np.arange(0, 30)
    for target, queries in query_directions(g, g.splits["test"]).items():
        drawn = sample_negatives(g, queries, pool, 49, np.random.default_rng(0))
        assert drawn.shape == (len(queries), 49) and np.isin(drawn, pool).all()
        for (e, rel, _), row in zip(queries, drawn):
            assert (row != e).all()
            for d in row:
                triple = (e, rel, d) if rel < g.num_relations else (d, rel - g.num_relations, e)
                assert triple not in known


class _Fixed:
    """A stand-in model: fixed random unit vectors for entities and for each (head, relation) query."""

    device = torch.device("cpu")
    precision = "fp32"

    def __init__(self, g: KnowledgeGraph, dim: int = 8) -> None:
        gen = torch.Generator().manual_seed(0)
        self.table = torch.nn.functional.normalize(torch.randn(g.num_entities, dim, generator=gen), dim=-1)
        self.rel = torch.randn(2 * g.num_relations, dim, generator=gen)

    def query(self, h, r):
        return torch.nn.functional.normalize(self.table[torch.as_tensor(h)] + self.rel[torch.as_tensor(r)], dim=-1)


def test_the_sampled_protocol_equals_a_brute_force_count(monkeypatch):
    """Each query's rank among itself and its 49 negatives (written in its row) equals a count of the candidates
    scored above it (+ half the ties), and Hits@10 / MRR are those ranks' means over both sides."""
    from kgc.linkpred.evaluation import sampled

    g = _toy_inference_graph()
    model = _Fixed(g)

    class Engine:
        passes: dict = {}

        def __call__(self, h, r):
            return model.query(h, r)

    monkeypatch.setattr("kgc.linkpred.evaluation.scoring.entity_states",
                        lambda *a, **k: (Engine(), model.table, "stand-in", 0.0, 0.0))
    model.eval = lambda: None
    ev = sampled.sampled_evaluate(model, g, "test", negatives=50, seed=1, batch_size=2)
    index = {e: i for i, e in enumerate(g.entities)}
    ranks = []
    for row in ev.ranks:
        h, a = index[row["head"]], index[row["answer"]]
        rel = g.relations.index(row["relation"].removeprefix("inverse ")) + (
            g.num_relations if row["relation"].startswith("inverse ") else 0)
        q = model.query([h], [rel])[0]
        negs = [index[e] for e in row["negatives"].split(",")]
        assert len(negs) == 49
        true, others = float(q @ model.table[a]), [float(q @ model.table[e]) for e in negs]
        rank = 1 + sum(o > true for o in others) + 0.5 * sum(o == true for o in others)
        assert row["rank"] == rank
        ranks.append(rank)
    both = ev.results["both"]["realistic"]
    assert both["hits_at_10"] == pytest.approx(np.mean(np.array(ranks) <= 10))
    assert both["inverse_harmonic_mean_rank"] == pytest.approx(np.mean(1 / np.array(ranks)))
    assert ev.results["kgc"]["protocol"]["candidates"] == 50
    again = sampled.sampled_evaluate(model, g, "test", negatives=50, seed=1, batch_size=3)
    assert [r["negatives"] for r in again.ranks] == [r["negatives"] for r in ev.ranks]  # the seed fixes the draws


def test_the_full_ranking_equals_pykeens_evaluator_on_the_same_scores():
    """filtered_ranks (the PageRank, rules and text + rules rows' full ranking) gives PyKEEN's own filtered
    evaluation of a PyKEEN model on the same inference graph: every metric, both sides, every rank type — with ties
    (scores rounded to 1 decimal, so realistic, optimistic and pessimistic ranks differ)."""
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.models import DistMult
    from pykeen.triples import TriplesFactory

    from kgc.linkpred.evaluation.sampled import filtered_ranks

    g = _toy_inference_graph()
    r = g.num_relations
    factory = TriplesFactory(mapped_triples=torch.as_tensor(g.splits["train"]),
                             entity_to_id={e: i for i, e in enumerate(g.entities)},
                             relation_to_id={x: i for i, x in enumerate(g.relations)})
    model = DistMult(triples_factory=factory, embedding_dim=4, random_seed=0)

    def rounded(fn):  # ties on purpose: pykeen's score_t / score_h through one rounding, for both evaluators
        return lambda *a, **k: torch.round(fn(*a, **k) * 10) / 10

    model.score_t, model.score_h = rounded(model.score_t), rounded(model.score_h)

    def scores(queries: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            out = torch.empty(len(queries), g.num_entities)
            tail = queries[:, 1] < r
            if tail.any():
                out[torch.as_tensor(tail)] = model.score_t(torch.as_tensor(queries[tail][:, :2]))
            if (~tail).any():
                q = queries[~tail]
                out[torch.as_tensor(~tail)] = model.score_h(torch.as_tensor(np.stack([q[:, 1] - r, q[:, 0]], 1)))
            return out

    ours = filtered_ranks(g, "test", scores, batch_size=2)
    theirs = RankBasedEvaluator(filtered=True).evaluate(
        model, torch.as_tensor(g.splits["test"]), batch_size=2, use_tqdm=False,
        additional_filter_triples=[torch.as_tensor(g.splits["train"])]).to_dict()
    compared = 0
    for side in ("head", "tail", "both"):
        for rank_type in ("realistic", "optimistic", "pessimistic"):
            for key, value in theirs[side][rank_type].items():
                assert ours.results[side][rank_type][key] == pytest.approx(value, nan_ok=True), (side, rank_type, key)
                compared += 1
    assert compared > 100
    real = theirs["both"]
    assert real["optimistic"]["arithmetic_mean_rank"] < real["pessimistic"]["arithmetic_mean_rank"]  # ties hit


def test_evaluate_inductive_asks_for_an_inference_graph(trained_quick):
    """--inductive on a run whose dataset brings no inference graph is one message naming the ways on; --negatives
    alone too."""
    out = cli("evaluate", trained_quick, "--inductive", "--no-progress", check=False)
    assert out.exit_code == 2 and "has no inference graph" in out.stderr and "--entities-from" in out.stderr
    out = cli("evaluate", trained_quick, "--negatives", "50", "--no-progress", check=False)
    assert out.exit_code == 2 and "give it with --inductive or --entities-from" in out.stderr


@pytest.fixture(scope="module")
def trained_quick(tiny_bert, tmp_path_factory, data_home):
    import kgc
    from tests.test_api import tiny_linkpred

    out = tmp_path_factory.mktemp("grail") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=1, echo=None)
    return out


def test_a_grail_run_trains_on_its_graph_and_ranks_the_inference_graph_both_ways(tiny_bert, cache, data_home,
                                                                                  tmp_path):
    """A tiny model trained 2 steps on grail-wn18rr-v1: its text bank never held an inference entity; --inductive
    ranks the inference graph's test triples over its 922 entities (filtered by all its triples), --negatives 50 over
    50 candidates each, into their own files, the draws beside the ranks."""
    import kgc
    from tests.test_api import tiny_linkpred

    recipe = tiny_linkpred(tiny_bert)
    recipe["data"] = {"dataset": "grail-wn18rr-v1", "neighbor_text": False, "max_tokens": 16}
    run = tmp_path / "run"
    kgc.train(recipe, run, progress=False, train__max_steps=2, echo=None)
    from kgc.data import grail

    _, ind = grail.source("grail-wn18rr-v1", [data_home])
    ind_only = _entities(r for f in grail.FILES for r in _read(ind / f))
    loaded = kgc.load(run, echo=None)
    assert not ind_only & set(loaded.predictor.graph().entities)
    out = cli("evaluate", run, "--inductive", "--no-progress")
    results = json.loads((run / "results.inductive.json").read_text())
    assert results["kgc"]["inductive"]["entities"] == 922 and results["kgc"]["inductive"]["candidates"] == "all"
    assert results["kgc"]["queries"] == 2 * 188
    out = cli("evaluate", run, "--inductive", "--negatives", "50", "--no-progress")
    assert "each against 49 sampled negatives (GraIL's protocol, seed 0)" in out.stdout, out.stdout
    sampled = json.loads((run / "results.inductive-50.json").read_text())
    assert sampled["kgc"]["protocol"]["negatives"] == 49
    rows = (run / "ranks.inductive-50.tsv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 188 and "negatives" in rows[0]
    assert all(len(r.split("\t")[-1].split(",")) == 49 for r in rows[1:])
    _the_structural_rows_score_each_block_once(run, sampled)


def _the_structural_rows_score_each_block_once(run: Path, sampled: dict) -> None:
    """kgc bench grail's structural rows on the same run: the text + rules grid at α = 1 is the text model's own
    dev MRR over every inference entity, the same draws give the text row's sampled figure at α = 1, and the text
    and rule scores of each block of queries are computed (z-scored) once for all α and both protocols."""
    import kgc
    from kgc.linkpred.answer.results import inference_folder
    from kgc.linkpred.bench import grail as bench
    from kgc.linkpred.evaluation.inductive import inductive_graph
    from kgc.training.task import open_run

    opened = open_run(run, echo=None)
    graph, _ = inductive_graph(inference_folder(opened.predictor), opened.predictor.graph(), split="test",
                               candidates="all", long_text=False)
    scored = []
    real_z = bench._z
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "_z", lambda x: scored.append(len(x)) or real_z(x))
        mp.setattr(bench, "ALPHAS", (0.0, 0.5, 1.0))
        rows = bench.structural_rows(opened, graph, negatives=50, seed=0, batch_size=128)
    blocks = sum(-(-len(graph.splits[s]) // 128) * 2 for s in ("dev", "test"))  # both directions
    assert len(scored) == 2 * blocks  # text and rules, once per block (was 2 × (3 α × dev + 2 protocols × test))
    dev_text = kgc.load(run, echo=None).evaluation("dev", inductive=True).results["both"]["realistic"]
    grid = rows["text + rules"]["alpha"]["dev MRR"]
    assert grid["1.0"] == pytest.approx(dev_text["inverse_harmonic_mean_rank"], abs=1e-4)
    assert set(rows) == {"pagerank", "rules", "text + rules"} and rows["rules"]["mined"]["rules"] >= 0
    if rows["text + rules"]["alpha"]["chosen"] == 1.0:
        assert rows["text + rules"]["sampled"]["H@10"] == pytest.approx(
            sampled["both"]["realistic"]["hits_at_10"], abs=1e-4)


def test_data_check_reads_both_graphs_of_a_split(cache, data_home):
    """`kgc data check grail-wn18rr-v3`: the training graph's report, then the inference graph's counts, and the
    8 entities the published v3 shares between its graphs as a warning (not an error); v1 shares none."""
    out = cli("data", "check", "grail-wn18rr-v3")
    assert "inference graph" in out.stdout and "5,084 entities, every one with a text" in out.stdout
    assert "warning: 8 entities of the inference graph are in the training graph too" in out.stdout
    out = cli("data", "check", "grail-wn18rr-v1")
    assert "the training and inference graphs share no entity" in out.stdout


def test_the_bench_table_merges_the_two_recipes_rows(tmp_path):
    """`make bench-grail` runs the WN18RR and FB15k-237 recipes into one folder: the second keeps the first's rows
    (same draws), replaces a split it measured again, and orders the eight as the catalog does."""
    from kgc.linkpred.bench import grail as bench

    metrics = {"MRR": 0.5, "H@1": 0.4, "H@3": 0.6, "H@10": 0.7}
    def row(split, mrr):
        method = {"full": {**metrics, "MRR": mrr}, "sampled": metrics, "seconds": 1.0}
        return {"split": split, "recipe": "r.yaml", "train_seconds": 60.0,
                "text": {**method, "seconds": {"full": 1.0, "sampled": 2.0}, "query_ms": 0.5},
                "text + rules": method, "rules": method, "pagerank": method}
    path = tmp_path / "inductive.json"
    path.write_text(json.dumps({"negatives": 50, "seed": 0, "rows": [row("grail-fb237-v1", 0.1),
                                                                    row("grail-wn18rr-v2", 0.2)]}))
    kept = bench._earlier_rows(path, 50, 0)
    assert [r["split"] for r in kept] == ["grail-fb237-v1", "grail-wn18rr-v2"]
    assert bench._earlier_rows(path, 51, 0) == [] and bench._earlier_rows(tmp_path / "none.json", 50, 0) == []
    text = bench.table({"negatives": 50, "seed": 0, "rows": [row("grail-wn18rr-v1", 0.3)] + kept})
    lines = text.splitlines()
    assert lines[0].startswith("| split | text MRR | text H@10 | text H@10 (50) |")
    assert lines[2].startswith("| grail-wn18rr-v1 | 0.3000 |") and "| 60 | 3.0 | 0.50 |" in lines[2]
    assert "recipes: r.yaml; 50 candidates per side, seed 0" in text
