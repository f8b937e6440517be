"""The Python API (kgc.train / kgc.load / kgc.Run) with a tiny random BERT.

The README's Python example, and every other example in the README and docs/, is run by tests/test_docs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kgc
from kgc.errors import KGCError
from tests.conftest import linkpred_model
from tests.test_csts_cli import write_recipe as write_csts_recipe

ROOT = Path(__file__).resolve().parents[1]


def tiny_linkpred(backbone: Path, **train) -> dict:
    return {"name": "tiny_api", "data": {"dataset": "umls", "neighbor_text": False, "max_tokens": 24},
            "model": {"backbone": str(backbone), "conditioner": "biencoder"},
            "loss": {"pre_batch": 0},
            "train": {"epochs": 1, "batch_size": 32, "lr": 1e-3, "warmup_steps": 1, "log_every": 1,
                      "num_threads": 1, "max_steps": 2, **train},
            "eval": {"batch_size": 128, "dev_queries": 20}}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def lp_run(tiny_bert, tmp_path_factory, data_home):
    out = tmp_path_factory.mktemp("api") / "run"
    return kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=3)


def test_overrides_and_bad_keys(tiny_bert):
    r = kgc.resolve_recipe(tiny_linkpred(tiny_bert), {"train.lr": 2e-4}, eval__rerank__enabled=True)
    assert r.train.lr == 2e-4 and r.eval.rerank.enabled and r.train.max_steps == 2
    r = kgc.resolve_recipe(ROOT / "recipes" / "umls_biencoder.yaml", ["train.max_steps=7"])
    assert r.name == "umls_biencoder" and r.train.max_steps == 7 and r.data.max_tokens == 32
    with pytest.raises(KGCError, match=r"--set train\.max_step: unknown recipe key"):
        kgc.train(tiny_linkpred(tiny_bert), train__max_step=3)
    with pytest.raises(KGCError, match=r"'train.lr'"):
        kgc.resolve_recipe(tiny_linkpred(tiny_bert), train__lr=-1)


def test_train_load_evaluate_predict(lp_run, tiny_bert):
    assert isinstance(lp_run, kgc.Run) and lp_run.task == "linkpred" and lp_run.recipe.train.max_steps == 3
    run = kgc.load(lp_run.path)
    res = run.evaluate()
    for side in ("head", "tail", "both"):
        assert 0 < res[side]["realistic"]["inverse_harmonic_mean_rank"] <= 1
        assert {"hits_at_1", "hits_at_10", "arithmetic_mean_rank"} <= set(res[side]["optimistic"])
    assert json.loads((run.path / "results.json").read_text())["both"] == json.loads(json.dumps(res["both"]))
    assert run.evaluate("dev")["kgc"]["split"] == "dev"
    df = run.predict("virus", "causes", top_k=4)
    assert list(df.columns) == ["rank", "entity", "name", "text", "score", "known"] and list(df["rank"]) == [1, 2, 3, 4]
    assert df["score"].is_monotonic_decreasing and (run.path / "index" / "meta.json").is_file()
    inv = run.predict("virus", "causes", top_k=4, inverse=True, filter_known=True)
    assert len(inv) == 4
    model = run.predictor.model()
    run.predict("bacterium", "causes")
    assert run.predictor.model() is model and isinstance(run, kgc.LinkPredRun)  # loaded once
    assert model.bank.graph is run.predictor.graph()  # the model's own TextBank: added entities never swap it
    free = run.answer("no such thing at all", "causes")  # free text: embedded on the fly, not refused
    assert free.head == "(free text)" and free.head_text == "no such thing at all" and len(free.predictions) == 10
    with pytest.raises(KGCError, match="split 'validation': choose test or dev"):
        run.evaluate("validation")
    with pytest.raises(KGCError, match="has no structural model.*drop text_only"):
        run.evaluation("test", text_only=True)


def test_embeddings(lp_run):
    import torch

    run = kgc.load(lp_run.path)
    model, graph = run.predictor.model(), run.predictor.graph()
    table = model.entity_table().numpy()
    ids = ["virus", "idea_or_concept", "alga"]
    emb = run.embed_entities(ids)
    assert emb.shape == (3, table.shape[1]) and emb.dtype == np.float32
    np.testing.assert_allclose(emb, table[[graph.entity_index[i] for i in ids]], atol=1e-5)
    both = run.embed_entities(["idea_or_concept", "idea or concept"])  # the id, and its entity's exact text
    assert graph.full_texts[graph.entity_index["idea_or_concept"]] == "idea or concept"
    np.testing.assert_allclose(both[0], both[1], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(run.embed_entities("some new text"), axis=1), 1, atol=1e-5)
    q = run.embed_queries(["virus", "Idea or Concept"], "causes")
    h, r = [graph.entity_index["virus"], graph.entity_index["idea_or_concept"]], graph.find_relation("causes")
    with torch.no_grad():
        np.testing.assert_allclose(q, model.encode_queries(h, [r, r]).numpy(), atol=1e-5)
    qi = run.embed_queries("virus", ["causes"], inverse=True)
    assert qi.shape == (1, q.shape[1]) and not np.allclose(qi[0], q[0])
    # the query's ranking agrees with predict's scores
    top = run.predict("virus", "causes", top_k=1)
    assert float(q[0] @ table[graph.entity_index[top["entity"][0]]]) == pytest.approx(top["score"][0], abs=1e-4)
    with pytest.raises(KGCError, match="2 heads but 3 relations"):
        run.embed_queries(["virus", "alga"], ["causes"] * 3)
    with pytest.raises(KGCError, match=r"is a linkpred run, not csts; .*similarity\(\) belongs to csts runs"):
        run.similarity("a", "b", "c")


def test_dev_sample_is_fixed_by_the_seed(lp_run):
    """eval.dev_queries validates on a sample of the dev triples drawn with train.seed: the same triples on every
    evaluation (the dev curve compares like with like), other triples under another seed; and it is the sample
    the training validated on (the logged dev MRR is that of the saved model on it)."""
    from kgc.linkpred.evaluation.scoring import evaluate

    model, graph = linkpred_model(lp_run.path)
    n = lp_run.recipe.eval.dev_queries
    assert n == 20 and len(graph.splits["dev"]) > 10 * n

    def sample(seed):
        ev = evaluate(model, graph, "dev", batch_size=128, max_triples=n, seed=seed)
        return ev, [(r["head"], r["relation"], r["answer"]) for r in ev.ranks]

    (a, rows_a), (b, rows_b), (c, rows_c) = sample(lp_run.recipe.train.seed), sample(lp_run.recipe.train.seed), \
        sample(lp_run.recipe.train.seed + 1)
    assert len(rows_a) == 2 * n and rows_a == rows_b  # both directions of the same n triples, in the same order
    assert [r["rank"] for r in a.ranks] == [r["rank"] for r in b.ranks]
    assert a.results["kgc"]["sampled"] and a.results["kgc"]["triples"] == n
    dev = {(graph.entities[h], graph.relations[r], graph.entities[t]) for h, r, t in graph.splits["dev"]}
    tails = {row for row in rows_a if not row[1].startswith("inverse ")}
    assert len(tails) == n and tails <= dev  # n distinct dev triples
    heads = {(t, r.removeprefix("inverse "), h) for h, r, t in rows_a if r.startswith("inverse ")}
    assert heads == tails  # each asked in both directions
    other = {row for row in rows_c if not row[1].startswith("inverse ")}
    assert len(other) == n and other <= dev and other != tails
    logged = [json.loads(line) for line in (lp_run.path / "metrics.jsonl").read_text().splitlines()]
    dev_mrr = [r["dev_mrr"] for r in logged if "dev_mrr" in r]
    assert dev_mrr and dev_mrr[-1] == pytest.approx(a.metric(), abs=1e-5)


def test_index_add_and_answer_match_the_cli(lp_run, tmp_path):
    """Run.index / add_entities / answer are what `kgc index` and `kgc predict` call: same actions, same rows."""
    from typer.testing import CliRunner

    from kgc.cli import app

    run = kgc.load(lp_run.path, echo=None)
    run.index()  # built (or already fresh from an earlier test)
    assert run.index() == {"action": "none", "why": "up to date (flat)", "meta": run.index()["meta"]}
    done = run.index(type="hnsw", hnsw_m=8, ef_search=16)
    assert done["action"] == "build" and done["meta"]["index"]["type"] == "hnsw"
    done = run.index(ef_search=64)
    assert done["action"] == "search" and done["meta"]["index"]["ef_search"] == 64
    assert json.loads((run.path / "index" / "meta.json").read_text())["index"]["ef_search"] == 64
    with pytest.raises(KGCError, match="nprobe"):
        run.index(nprobe=4)  # hnsw does not read it
    assert run.index(type="flat")["action"] == "build"
    # answers: the exact top k of the query against every entity, and the CLI prints the same rows
    a = run.answer("Virus", "causes", top_k=5)
    assert (a.head, a.relation, a.head_text) == ("virus", "causes", "virus")
    model, graph = run.predictor.model(), run.predictor.graph()
    cos = run.embed_queries("virus", "causes")[0] @ run.embed_entities(graph.entities).T
    assert [p.entity for p in a.predictions] == [graph.entities[i] for i in np.argsort(-cos, kind="stable")[:5]]
    np.testing.assert_allclose([p.score for p in a.predictions], np.sort(cos)[::-1][:5], atol=1e-5)
    assert a.frame().equals(run.predict("virus", "causes", top_k=5))
    cli = CliRunner().invoke(app, ["predict", str(run.path), "--head", "virus", "--relation", "causes", "--top-k", "5",
                                   "--json"])
    assert cli.exit_code == 0, cli.output
    printed = json.loads(cli.stdout)["predictions"]  # and the split of a known answer (None for the others)
    assert [{k: v for k, v in p.items() if k != "known_split"} for p in printed] == [p.__dict__ for p in a.predictions]
    assert all((p["known_split"] is None) == (not p["known"]) for p in printed)
    # a new entity with the text of an existing one: appended, answerable, scored as its twin
    new = tmp_path / "new.tsv"
    name, _, desc = graph.full_texts[graph.entity_index["virus"]].partition(", ")
    new.write_text(f"virus_copy\t{name}\t{desc}\n", encoding="utf-8")
    meta = run.add_entities(new)
    assert meta["added_entities"]["count"] == 1 and meta["entities"] == graph.num_entities + 1
    rows = run.predict("bacterium", "causes", top_k=graph.num_entities + 1)
    score = dict(zip(rows["entity"], rows["score"]))
    assert score["virus_copy"] == pytest.approx(score["virus"], abs=1e-5)
    assert run.predict("virus_copy", "causes", top_k=3)["entity"].tolist() == \
        run.predict("virus", "causes", top_k=3)["entity"].tolist()


def test_triples_factory_as_data(tiny_bert, tmp_path):
    from pykeen.triples import TriplesFactory

    from tests.conftest import TOY_TEST, TOY_TRAIN

    tf = TriplesFactory.from_labeled_triples(np.array(TOY_TRAIN + TOY_TEST, dtype=str))
    train_tf = TriplesFactory.from_labeled_triples(np.array(TOY_TRAIN, dtype=str), entity_to_id=tf.entity_to_id,
                                                   relation_to_id=tf.relation_to_id)
    test_tf = TriplesFactory.from_labeled_triples(np.array(TOY_TEST, dtype=str), entity_to_id=tf.entity_to_id,
                                                  relation_to_id=tf.relation_to_id)
    recipe = tiny_linkpred(tiny_bert, batch_size=4)
    run = kgc.train(recipe, tmp_path / "run", data=train_tf, testing=test_tf, progress=False,
                    texts={"e_dog": "dog, a domesticated carnivorous mammal"}, relation_texts={"_has_part": "has part"})
    folder = run.path / "data"
    assert run.recipe.data.path == str(folder.resolve())
    assert "e_dog\tdog, a domesticated carnivorous mammal\n" in (folder / "entity2text.txt").read_text()
    assert "e_cat\te cat\n" in (folder / "entity2text.txt").read_text()
    assert "_hypernym\thypernym\n" in (folder / "relation2text.txt").read_text()
    assert (folder / "dev.tsv").read_text() == "" and not (run.path / "metrics.jsonl").read_text().count("dev_mrr")
    again = kgc.load(run.path)  # reloadable from the run directory alone
    res = again.evaluate()
    assert res["kgc"]["triples"] == len(TOY_TEST)
    with pytest.raises(KGCError, match="the dev split has no triples"):
        again.evaluate("dev")
    assert again.predict("dog", "has part", top_k=3)["entity"].tolist()[0].startswith("e_")
    with pytest.raises(KGCError, match="not an entity label"):
        kgc.train(recipe, tmp_path / "run2", data=train_tf, texts={"e_wolf": "wolf"})
    assert not (tmp_path / "run2").exists()
    with pytest.raises(KGCError, match="already holds a run"):
        kgc.train(recipe, run.path, data=train_tf)


def test_pykeen_dataset_as_data(tiny_bert, tmp_path):
    from pykeen.datasets import Nations

    run = kgc.train(tiny_linkpred(tiny_bert, batch_size=16), tmp_path / "run", data=Nations(), progress=False,
                    eval__dev_queries=10)
    counts = {s: len((run.path / "data" / f"{s}.tsv").read_text().splitlines()) for s in ("train", "dev", "test")}
    assert counts == {"train": 1592, "dev": 199, "test": 201}
    assert "dev_mrr" in (run.path / "metrics.jsonl").read_text()
    res = kgc.load(run.path).evaluate()
    assert res["kgc"]["entities"] == 14 and 0 < res["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1


def test_csts_similarity(tiny_bert, tmp_path):
    recipe = write_csts_recipe(tmp_path / "r.yaml", tiny_bert, {"conditioner": "hadamard"}, max_steps=2)
    run = kgc.train(recipe, tmp_path / "run", progress=False)
    assert run.task == "csts"
    run = kgc.load(run.path)
    s = run.similarity("A red car.", "A blue car.", "The colour of the car.")
    assert isinstance(s, float) and -1 <= s <= 1
    many = run.similarity(["A red car.", "A red car."], ["A blue car.", "A red car."], "The colour of the car.")
    assert isinstance(many, np.ndarray) and many.shape == (2,) and many[0] == pytest.approx(s, abs=1e-5)
    assert many[1] == pytest.approx(1.0, abs=1e-5)
    import torch

    model, tokenizer = run.model()  # reference: each sentence embedded alone under the condition, then the cosine
    ids = tokenizer(["A red car.", "A blue car.", "The colour of the car."], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        e1, e2 = (model.conditioner([ids[i]], [ids[2]]).float()[0] for i in (0, 1))
    assert s == pytest.approx(float(e1 @ e2), abs=1e-5)
    rows = run.score([{"sentence1": "A red car.", "sentence2": "A blue car.", "condition": "The colour of the car.",
                       "label": 2.0}])
    assert rows[0]["similarity"] == pytest.approx(s, abs=1e-6) and rows[0]["label"] == 2.0
    assert rows[0]["predicted_label"] == pytest.approx(1 + 4 * max(s, 0), abs=1e-4)
    with pytest.raises(KGCError, match="row 0 has no condition"):
        run.score([{"sentence1": "a", "sentence2": "b"}])
    res = run.evaluate("validation")
    assert "spearman" in res and (run.path / "results.validation.json").is_file()
    for call in (lambda: run.predict("a", "b"), lambda: run.embed_entities(["a"]),
                 lambda: run.embed_queries(["a"], "b")):
        with pytest.raises(KGCError, match="is a csts run, not linkpred; use `kgc similarity"):
            call()
    with pytest.raises(KGCError, match="rows; give lists of one length"):
        run.similarity(["a", "b"], ["c"] * 3, "d")
    with pytest.raises(KGCError, match="task csts"):
        kgc.train(recipe, tmp_path / "run3", data=object())
