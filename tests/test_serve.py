"""``kgc serve``: the routes against ``kgc predict`` / the Python API on the same run (FastAPI's TestClient),
dynamic batching (concurrent answers equal sequential ones, and they were batched), errors as JSON with the right
status while the server keeps serving, adding entities, C-STS's /similarity, ``kgc predict --input``, and the
dynamic batcher itself. The real uvicorn process and the page in a browser: tests/test_serve_process.py."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kgc
from kgc.batching import MicroBatcher
from kgc.errors import KGCError
from tests.conftest import cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)
from tests.test_csts_cli import write_recipe as write_csts_recipe

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

QUERIES = [  # (head, relation, options): ids, names, inverse, filters
    ("virus", "causes", {}),
    ("amino_acid_peptide_or_protein", "interacts_with", {"top_k": 3}),
    ("Virus", "causes", {"inverse": True, "top_k": 5}),
    ("lipid", "isa", {"filter_known": True}),
    ("body part organ or organ component", "location_of", {"include_head": True, "top_k": 4}),
]


@pytest.fixture(scope="module")
def lp_run(tiny_bert, tmp_path_factory, data_home):
    out = tmp_path_factory.mktemp("serve") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=3, echo=None)
    run = kgc.load(out, echo=None)
    run.evaluate()  # results.json, for /info
    return run


def ready(client: TestClient, timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = client.get("/health")
        if r.json()["status"] != "loading":
            assert r.status_code == 200, r.json()
            return r.json()
        time.sleep(0.1)
    raise AssertionError("the server never became ready")


@pytest.fixture(scope="module")
def client(lp_run):
    with TestClient(kgc.api.app(lp_run, max_wait_ms=30), raise_server_exceptions=False) as c:
        ready(c)
        yield c


def expected(run, head, relation, options) -> dict:
    return run.answer(head, relation, **options).to_json()


def same_answers(got: dict, want: dict) -> None:
    assert (got["head"], got["relation"], got["head_text"]) == (want["head"], want["relation"], want["head_text"])
    assert [p["entity"] for p in got["predictions"]] == [p["entity"] for p in want["predictions"]]
    assert [p["known"] for p in got["predictions"]] == [p["known"] for p in want["predictions"]]
    np.testing.assert_allclose([p["score"] for p in got["predictions"]], [p["score"] for p in want["predictions"]],
                               atol=1e-5)


def test_predict_equals_kgc_predict(client, lp_run):
    graph = lp_run.predictor.graph()
    for head, relation, options in QUERIES:
        got = client.post("/predict", json={"head": head, "relation": relation, **options})
        assert got.status_code == 200, got.json()
        want = expected(lp_run, head, relation, options)
        same_answers(got.json(), want)
        preds = got.json()["predictions"]
        assert len(preds) == options.get("top_k", 10)
        h = graph.lookup_entity(head)
        r = graph.relation_id(relation, inverse=options.get("inverse", False))
        known = set(graph.all_answers[graph.hr_keys(np.array([h]), np.array([r]))].indices.tolist())
        assert [p["known"] for p in preds] == [graph.entity_index[p["entity"]] in known for p in preds]
        if options.get("filter_known"):
            assert not any(p["known"] for p in preds)
        if not options.get("include_head"):
            assert graph.entities[h] not in [p["entity"] for p in preds]
        else:
            assert graph.entities[h] in [p["entity"] for p in lp_run.answer(head, relation, top_k=135,
                                                                               include_head=True).to_json()
                                         ["predictions"]]
    # the CLI prints the same answers
    out = cli("predict", lp_run.path, "--head", "virus", "--relation", "causes", "--json", "--no-progress")
    same_answers(json.loads(out.stdout), client.post("/predict", json={"head": "virus", "relation": "causes"}).json())
    # a list is answered in order, each query as if alone
    many = client.post("/predict", json=[{"head": h, "relation": r, **o} for h, r, o in QUERIES])
    assert many.status_code == 200
    for got, (head, relation, options) in zip(many.json(), QUERIES):
        same_answers(got, expected(lp_run, head, relation, options))


def test_scores_are_cosines_against_the_index(client, lp_run):
    """The answer's scores are cos(query, entity) for the entities it names (brute force over the table)."""
    a = client.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 135}).json()
    q = lp_run.embed_queries(["virus"], "causes")[0]
    table = lp_run.embed_entities(lp_run.predictor.graph().entities)
    scores = table @ q
    order = [lp_run.predictor.graph().entities[i] for i in np.argsort(-scores) if lp_run.predictor.graph().entities[i] != "virus"]
    assert [p["entity"] for p in a["predictions"]] == order
    np.testing.assert_allclose([p["score"] for p in a["predictions"]],
                               [scores[lp_run.predictor.graph().entity_index[e]] for e in order], atol=1e-4)


def test_concurrent_requests_are_batched_and_equal_sequential_answers(client, lp_run):
    graph = lp_run.predictor.graph()
    heads = graph.entities[:24]
    bodies = [{"head": h, "relation": graph.relations[i % 5], "top_k": 5} for i, h in enumerate(heads)]
    before = client.get("/info").json()["batching"]
    barrier = threading.Barrier(len(bodies))

    def ask(body):
        barrier.wait()
        return client.post("/predict", json=body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(ask, bodies))
    after = client.get("/info").json()["batching"]
    batches, items = after["batches"] - before["batches"], after["items"] - before["items"]
    assert items == len(bodies) and batches < len(bodies), after  # some shared a forward pass
    for body, got in zip(bodies, answers):
        assert got.status_code == 200
        same_answers(got.json(), lp_run.answer(body["head"], body["relation"], top_k=5).to_json())


def test_errors_are_json_with_the_right_status(client, lp_run):
    r = client.post("/predict", json={"head": "virus"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "relation"
    r = client.post("/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 0})
    assert r.status_code == 422
    r = client.post("/predict", json={"head": "virus", "relation": "causez"})
    assert r.status_code == 404
    body = r.json()
    assert body["kind"] == "relation" and "causes" in body["suggestions"]
    assert set(body["valid"]) == set(lp_run.predictor.graph().relations) and "causez" in body["detail"]
    r = client.post("/predict", json={"head": "viruss", "relation": "causes"})
    assert r.status_code == 404 and r.json()["kind"] == "head" and "virus" in r.json()["suggestions"]
    r = client.post("/predict", json={"head": "viruss", "relation": "causes", "free_text": True})
    assert r.status_code == 200 and r.json()["head"] == "(free text)"
    r = client.post("/predict", json=[{"head": "virus", "relation": "causes"}, {"head": "virus", "relation": "x"}])
    assert r.status_code == 404 and r.json()["position"] == 1 and r.json()["detail"].startswith("query 1:")
    r = client.post("/predict", json=[{"head": "virus", "relation": "causes", "top_k": 1000}] * 21)
    assert r.status_code == 400 and "21,000 answers" in r.json()["detail"]  # one response stays small
    r = client.post("/predict", json=[{"head": "virus", "relation": "causes"}] * 1025)
    assert r.status_code == 422  # at most 1024 queries per request
    r = client.post("/predict", json={"head": "v" * 10_001, "relation": "causes"})
    assert r.status_code == 422
    assert client.post("/predict", json=[]).json() == []


def test_an_exception_inside_a_request_is_a_500_and_the_server_keeps_serving(client, lp_run, monkeypatch, caplog):
    calls = []

    def broken(queries):
        calls.append(len(queries))
        raise RuntimeError("boom")

    monkeypatch.setattr(lp_run, "answer_many", broken)
    with caplog.at_level("ERROR", logger="kgc.serve"):
        r = client.post("/predict", json={"head": "virus", "relation": "causes"})
    assert r.status_code == 500 and "RuntimeError: boom" in r.json()["detail"] and calls
    assert any("POST /predict failed" in rec.getMessage() for rec in caplog.records)
    monkeypatch.undo()
    r = client.post("/predict", json={"head": "virus", "relation": "causes"})
    assert r.status_code == 200 and client.get("/health").json()["status"] == "ready"


def test_entities_relations_info_and_pages(client, lp_run):
    hits = client.get("/entities", params={"q": "vir"}).json()
    assert hits and hits[0]["id"] == "virus" and all("vir" in h["name"].lower() for h in hits)
    assert client.get("/entities", params={"q": "zzzz"}).json() == []
    rels = client.get("/relations").json()
    assert [r["relation"] for r in rels] == lp_run.predictor.graph().relations
    info = client.get("/info").json()
    results = json.loads((lp_run.path / "results.json").read_text())
    assert info["test"]["mrr"] == results["both"]["realistic"]["inverse_harmonic_mean_rank"]
    assert info["conditioner"] == "biencoder" and info["entities"] == 135 and info["task"] == "linkpred"
    page = client.get("/")
    assert page.status_code == 200 and 'id="head"' in page.text and "/predict" in page.text
    script = client.get("/kgc.js")  # what the task pages share: call() and waitReady()
    assert '<script src="/kgc.js">' in page.text and script.status_code == 200
    assert "async function call(" in script.text and "async function waitReady(" in script.text
    assert client.get("/docs").status_code == 200
    assert "/predict" in client.get("/openapi.json").json()["paths"]
    r = client.post("/explain", json={"head": "virus", "relations": ["causes"]})
    assert r.status_code == 400 and "biencoder" in r.json()["detail"]  # nothing to explain in a bi-encoder


def test_a_large_graph_searches_names_by_prefix(lp_run, monkeypatch):
    import kgc.linkpred.answer.routes as serving

    monkeypatch.setattr(serving, "PREFIX_ENTITIES", 0)  # as above 200,000 entities: sorted names, bisection
    service = serving.LinkPredServing(lp_run)
    service._warm()
    hits = service.search_names("VIR", 5)
    graph = lp_run.predictor.graph()
    want = sorted((i for i, (n, e) in enumerate(zip(graph.names, graph.entities))
                   if n.lower().startswith("vir") or e.lower().startswith("vir")), key=lambda i: graph.names[i].lower())
    assert [h["id"] for h in hits] == [graph.entities[i] for i in want[:5]] and hits[0]["id"] == "virus"


def test_api_docs_work_offline(client):
    """/docs (Swagger UI) and /redoc (ReDoc) name no asset on another host, so they render without internet: every
    script, stylesheet and icon is a path of this server, which serves it; the OpenAPI document they read loads, with
    the task's own /explain body (link prediction's fields only)."""
    import re

    for page, names in (("/docs", ["swagger-ui-bundle.js", "swagger-ui.css"]), ("/redoc", ["redoc.standalone.js"])):
        r = client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
        assert "http://" not in r.text and "https://" not in r.text, page  # no CDN, no web fonts, no validator
        urls = re.findall(r'<(?:script|link)[^>]*?(?:src|href)="([^"]*)"', r.text)
        assert all(any(u.endswith(n) for u in urls) for n in names), urls
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), url  # a path here, not another host
            asset = client.get(url)
            kind = {".js": "javascript", ".css": "text/css", ".png": "image/png"}[Path(url).suffix]
            assert asset.status_code == 200 and kind in asset.headers["content-type"] and len(asset.content) > 500, url
    assert client.get("/docs/oauth2-redirect").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/predict" in spec["paths"] and "/explain" in spec["paths"]
    body = spec["paths"]["/explain"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert set(spec["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]) == {"head", "relations", "inverse"}


def test_post_entities_adds_and_persists(tiny_bert, tmp_path, data_home):
    out = tmp_path / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, echo=None)
    run = kgc.load(out, echo=None)
    with TestClient(kgc.api.app(run), raise_server_exceptions=False) as c:
        ready(c)
        r = c.post("/entities", json={"entities": [{"id": "n_flu", "name": "influenza virus",
                                                    "description": "a virus that causes flu"}]})
        assert r.status_code == 200, r.json()
        assert r.json()["added"] == 1 and r.json()["entities"] == 136
        assert c.get("/entities", params={"q": "influenza"}).json()[0]["id"] == "n_flu"
        a = c.post("/predict", json={"head": "n_flu", "relation": "causes"})
        assert a.status_code == 200 and a.json()["head"] == "n_flu"
        ex = c.post("/explain", json={"head": "n_flu", "relations": ["causes"]})
        assert ex.status_code == 400 and "biencoder" in ex.json()["detail"]  # found; a bi-encoder has nothing to show
        b = c.post("/predict", json={"head": "virus", "relation": "isa", "top_k": 136})
        assert "n_flu" in [p["entity"] for p in b.json()["predictions"]]
        dup = c.post("/entities", json={"entities": [{"id": "n_mumps", "name": "mumps virus"},
                                                     {"id": "n_flu", "name": "again"}]})
        assert dup.status_code == 400 and "n_flu" in dup.json()["detail"]
        assert "POST /entities, entities[1]" in dup.json()["detail"] and "POST-entities-" not in dup.json()["detail"]
        assert c.post("/predict", json={"head": "n_flu", "relation": "causes"}).status_code == 200  # still served
        assert c.get("/info").json()["entities"] == 136  # nothing of the refused request was added
        bad = c.post("/entities", json={"entities": [{"id": "x\ty", "name": "tab"}]})
        assert bad.status_code == 422
    fresh = kgc.load(out, echo=None)  # persisted in the run's index
    assert fresh.predict("n_flu", "causes", top_k=3).shape[0] == 3
    same_answers(fresh.answer("n_flu", "causes").to_json(), a.json())


def test_adding_entities_while_queries_run(tiny_bert, tmp_path, data_home):
    """POST /entities (one good, one refused) while other threads ask /predict, /entities and /info: no 500, and
    every answer is the run's own, before or after the add."""
    out = tmp_path / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, echo=None)
    run = kgc.load(out, echo=None)
    with TestClient(kgc.api.app(run), raise_server_exceptions=False) as c:
        ready(c)
        stop, statuses = threading.Event(), []

        def hammer():
            while not stop.is_set():
                statuses.append(c.post("/predict", json={"head": "virus", "relation": "causes"}).status_code)
                statuses.append(c.get("/entities", params={"q": "vi"}).status_code)
                statuses.append(c.get("/info").status_code)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            ok = c.post("/entities", json={"entities": [{"id": "n_1", "name": "new thing one"}]})
            bad = c.post("/entities", json={"entities": [{"id": "virus", "name": "clash"}]})
            time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert ok.status_code == 200 and bad.status_code == 400
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
        assert c.post("/predict", json={"head": "n_1", "relation": "causes"}).status_code == 200


def test_a_run_another_writer_holds_is_a_409(lp_run, monkeypatch):
    from kgc.errors import RunBusy

    with TestClient(kgc.api.app(lp_run), raise_server_exceptions=False) as c:
        ready(c)

        def busy(path, **kwargs):
            raise RunBusy(f"{lp_run.path} is in use by `kgc index` (adding entities; pid 1 on h, since now)")

        monkeypatch.setattr(lp_run, "add_entities", busy)
        r = c.post("/entities", json={"entities": [{"id": "n_x", "name": "x"}]})
        assert r.status_code == 409 and "in use by `kgc index`" in r.json()["detail"]


def test_health_is_loading_until_the_model_is_loaded(lp_run, monkeypatch):
    go = threading.Event()
    serving = lp_run.serving()
    real_load = serving.load

    def slow_load():
        go.wait(30)
        real_load()

    serving.load = slow_load
    monkeypatch.setattr(lp_run, "serving", lambda: serving)
    with TestClient(kgc.api.app(lp_run), raise_server_exceptions=False) as c:
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "loading"
        r = c.post("/predict", json={"head": "virus", "relation": "causes"})
        assert r.status_code == 503 and "loading" in r.json()["detail"]
        assert c.get("/info").json()["status"] == "loading"
        go.set()
        assert ready(c)["status"] == "ready"
        assert c.post("/predict", json={"head": "virus", "relation": "causes"}).status_code == 200


def test_a_run_that_cannot_load_reports_it(lp_run, monkeypatch):
    serving = lp_run.serving()

    def fail():
        raise KGCError("runs/x/best.pt: unreadable checkpoint. Delete it.")

    serving.load = fail
    monkeypatch.setattr(lp_run, "serving", lambda: serving)
    errors = []
    with TestClient(kgc.api.app(lp_run, on_load_error=errors.append), raise_server_exceptions=False) as c:
        for _ in range(100):
            h = c.get("/health")
            if h.json()["status"] != "loading":
                break
            time.sleep(0.05)
        assert h.status_code == 503 and h.json() == {"status": "error", "detail": errors[0]}
        assert "unreadable checkpoint" in errors[0]
        r = c.post("/predict", json={"head": "virus", "relation": "causes"})
        assert r.status_code == 503 and "could not be loaded" in r.json()["detail"]


def test_query_engine_runs_answer_as_the_encoder_would(tiny_bert, tmp_path, data_home):
    """A pooled conditioner with shared towers answers known heads through the query engine (no encoder pass):
    the same answers as encoding the head's text, and the server's equal kgc predict's."""
    out = tmp_path / "had"
    recipe = tiny_linkpred(tiny_bert)
    recipe["model"].update(conditioner="hadamard", shared_towers=True)
    kgc.train(recipe, out, progress=False, train__max_steps=2, echo=None)
    run = kgc.load(out, echo=None)
    assert run.entities.query_engine() is not None
    q = run.resolve("virus", "causes", top_k=20)
    via_engine = run.answer_many([q])[0]
    direct = run.predictor.model().encode_query_tokens([q.tokens], [q.r]).detach().float().numpy()
    np.testing.assert_allclose(run.predictor.query_vectors([q], run.entities), direct, atol=1e-5)
    with TestClient(kgc.api.app(run), raise_server_exceptions=False) as c:
        ready(c)
        assert c.get("/info").json()["query_engine"] is True
        same_answers(c.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 20}).json(),
                     via_engine.to_json())


def test_explain_route_is_kgc_explain(tiny_bert, tmp_path, data_home):
    out = tmp_path / "router"
    recipe = tiny_linkpred(tiny_bert)
    recipe["model"].update(conditioner="router", router_layers=1)
    recipe["encoder"] = {"trainable_layers": 1}
    kgc.train(recipe, out, progress=False, train__max_steps=2, echo=None)
    run = kgc.load(out, echo=None)
    with TestClient(kgc.api.app(run), raise_server_exceptions=False) as c:
        ready(c)
        assert c.get("/info").json()["explainable"] is True
        got = c.post("/explain", json={"head": "virus", "relations": ["causes", "isa"]}).json()
    ex, _ = kgc.api.explain(run, head="virus", relations=["causes", "isa"], out=tmp_path / "x.png")
    want = ex.to_json()
    assert got["tokens"] == want["tokens"] and got["conditions"] == ["causes", "isa"]
    for c_ in want["conditions"]:
        np.testing.assert_allclose(got["weights"][c_], want["weights"][c_], atol=1e-6)
        assert sum(got["weights"][c_]) == pytest.approx(1.0, abs=1e-3)


def test_csts_similarity_route(tiny_bert, tmp_path):
    recipe = write_csts_recipe(tmp_path / "r.yaml", tiny_bert, {"conditioner": "hadamard"}, max_steps=2)
    run = kgc.load(kgc.train(recipe, tmp_path / "run", progress=False, echo=None).path, echo=None)
    with TestClient(kgc.api.app(run), raise_server_exceptions=False) as c:
        ready(c)
        pair = {"sentence1": "A red car.", "sentence2": "A blue car.", "condition": "The colour of the car."}
        r = c.post("/similarity", json=pair)
        assert r.status_code == 200
        want = run.score([pair])[0]
        assert r.json()["similarity"] == pytest.approx(want["similarity"], abs=1e-5)
        assert r.json()["predicted_label"] == pytest.approx(want["predicted_label"], abs=1e-4)
        many = c.post("/similarity", json=[pair, {**pair, "sentence2": "A red car."}]).json()
        assert many[0]["similarity"] == pytest.approx(want["similarity"], abs=1e-5)
        assert many[1]["similarity"] == pytest.approx(1.0, abs=1e-5)
        assert c.post("/similarity", json={**pair, "condition": "  "}).status_code == 422
        assert c.post("/predict", json={"head": "a", "relation": "b"}).status_code == 404  # not a C-STS route
        assert 'id="s1"' in c.get("/").text and c.get("/info").json()["task"] == "csts"
        assert c.post("/explain", json={"head": "virus"}).status_code == 422  # the C-STS body: sentence, conditions


# ---------------------------------------------------------------- kgc predict --input


def test_predict_input_file_equals_one_by_one(lp_run, tmp_path):
    q = tmp_path / "q.tsv"
    q.write_text("virus\tcauses\n# a comment\n\nlipid\tisa\nVirus\tlocation of\n")
    out = tmp_path / "a.jsonl"
    res = cli("predict", lp_run.path, "--input", q, "--output", out, "--top-k", "3", "--batch-size", "2",
              "--no-progress")
    assert "3 questions answered" in res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 4, 5]
    for row, (head, rel) in zip(rows, [("virus", "causes"), ("lipid", "isa"), ("Virus", "location of")]):
        same_answers(row, lp_run.answer(head, rel, top_k=3).to_json())
    tsv = tmp_path / "a.tsv"
    cli("predict", lp_run.path, "--input", q, "--output", tsv, "--top-k", "2", "--no-progress")
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == ["line", "head", "relation", "rank", "entity", "name", "score", "known"]
    assert len(lines) == 1 + 3 * 2 and lines[1].split("\t")[:4] == ["1", "virus", "causes", "1"]
    jq = tmp_path / "q.jsonl"
    jq.write_text('{"head": "virus", "relation": "causes", "top_k": 2, "inverse": true}\n')
    res = cli("predict", lp_run.path, "--input", jq, "--no-progress")
    row = json.loads(res.stdout.splitlines()[0])
    same_answers(row, lp_run.answer("virus", "causes", top_k=2, inverse=True).to_json())


def test_predict_input_file_errors_name_the_line(lp_run, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("virus\tcauses\nvirus\tcausez\n")
    res = cli("predict", lp_run.path, "--input", bad, check=False)
    assert res.exit_code == 2 and f"{bad}:2: unknown relation 'causez'" in res.stderr
    bad.write_text("virus causes\n")
    res = cli("predict", lp_run.path, "--input", bad, check=False)
    assert res.exit_code == 2 and f"{bad}:1: expected head<TAB>relation" in res.stderr
    res = cli("predict", lp_run.path, "--input", bad, "--head", "virus", check=False)
    assert res.exit_code == 2 and "drop --head/--relation" in res.stderr
    jq = tmp_path / "q.jsonl"
    jq.write_text('{"head": "virus", "relation": "causes", "top_k": "2"}\n')
    res = cli("predict", lp_run.path, "--input", jq, check=False)
    assert res.exit_code == 2 and f"{jq}:1: top_k must be int" in res.stderr


# ---------------------------------------------------------------- the batcher


def test_micro_batcher_batches_and_isolates_failures():
    seen = []

    def square(items):
        seen.append(list(items))
        return [ValueError(f"bad {x}") if x < 0 else x * x for x in items]

    b = MicroBatcher(square, max_batch=8, max_wait_ms=2000)  # all six are queued long before the wait ends
    futures = b.submit_many(list(range(5)) + [-1])
    assert [f.result(5) for f in futures[:5]] == [0, 1, 4, 9, 16]
    with pytest.raises(ValueError, match="bad -1"):
        futures[5].result(5)
    assert seen[0] == [0, 1, 2, 3, 4, -1]  # one batch
    big = b.submit_many(list(range(20)))
    assert [f.result(5) for f in big] == [x * x for x in range(20)]
    assert max(len(s) for s in seen) <= 8
    b.close()

    def broken(items):
        raise RuntimeError("whole batch")

    b = MicroBatcher(broken, max_wait_ms=1)
    with pytest.raises(RuntimeError, match="whole batch"):
        b.submit(1).result(5)
    with pytest.raises(RuntimeError):  # the worker survived and answers the next one
        b.submit(2).result(5)
    b.close()


def test_recipe_validation_does_not_import_the_models(tmp_path):
    """`kgc predict` starts faster when reading a recipe imports no task's model, loss or evaluation code, and no
    transformers (the registry loads the task classes only)."""
    import subprocess
    import sys

    code = ("import sys; from kgc.recipe import load_recipe; load_recipe('recipes/umls_biencoder.yaml'); "
            "load_recipe('recipes/csts_synth_csr.yaml'); "
            "print(sorted(m for m in ('transformers', 'kgc.linkpred.model', 'kgc.linkpred.loss', 'kgc.csts.model', "
            "'kgc.csts.evaluate', 'scipy.stats', 'pykeen', 'faiss') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"
