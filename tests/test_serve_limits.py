"""``kgc serve`` bounds what it takes and never answers 500: body size (413, never an echo), field lengths (422),
a full disk during ``POST /entities`` (507, the run and the service as before, the retry applied once), an add
that does not stall queries (``/health`` says adding; answers come from the index as it was, then the new one at
once), and arbitrary JSON values and strings on every route (hypothesis). SIGTERM during an add, in a real
process: tests/test_serve_process.py."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

import kgc
from kgc import fileio
from tests.conftest import cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)
from tests.test_serve import ready

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from kgc.serve import Limits  # noqa: E402


@pytest.fixture()
def served(indexed_tiny_run, tmp_path):
    """A copy of the run, served (its own, since tests add entities to it)."""
    run_dir = tmp_path / "run"
    shutil.copytree(indexed_tiny_run, run_dir)
    run = kgc.load(run_dir, echo=None)
    with TestClient(kgc.api.app(run, max_wait_ms=5, limits=Limits(max_body=64 << 10)),
                    raise_server_exceptions=False) as c:
        ready(c)
        yield c, run_dir


def test_bodies_over_the_limit_are_413_and_never_echoed(served):
    client, _ = served
    big = json.dumps({"head": "x" * (100 << 10), "relation": "isa"})
    r = client.post("/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most 65,536" in r.json()["detail"] and len(r.content) < 500

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(100):
            yield b" " * 4096
    r = client.post("/predict", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and len(r.content) < 500
    r = client.post("/predict", json={"head": "x" * 20_000, "relation": "isa"})  # under the body limit: 422
    assert r.status_code == 422 and len(r.content) < 1000 and "xxxx" not in r.text
    r = client.post("/predict", json={"head": "virus", "relation": "isa", "y" * 5000: 1})
    assert r.status_code == 422 and len(r.content) < 1000  # an unknown key is named, shortened
    assert client.get("/health").json()["status"] == "ready"


def test_entity_fields_are_bounded_as_in_kgc_index_add(served, tmp_path):
    client, run_dir = served
    r = client.post("/entities", json={"entities": [{"id": "n1", "name": "a", "description": "d" * 10_001}]})
    assert r.status_code == 422 and "10000" in r.text.replace(",", "")
    f = tmp_path / "long.tsv"
    f.write_text("n1\ta\t" + "d" * 10_001 + "\n")
    out = cli("index", run_dir, "--add", f, check=False)
    assert out.exit_code == 2 and "long.tsv:1: the description has 10,001 characters" in out.stderr


def test_a_full_disk_during_post_entities_is_507_and_changes_nothing(served):
    client, run_dir = served
    before = {f.name: f.read_bytes() for f in (run_dir / "index").iterdir() if f.is_file() and f.name[0] != "."}
    entities = {"entities": [{"id": f"n{i}", "name": f"new thing {i}"} for i in range(3)]}
    fileio._FAULTS["write"] = 3  # the third file of the add hits a full disk
    try:
        r = client.post("/entities", json=entities)
    finally:
        fileio._FAULTS.clear()
    assert r.status_code == 507, r.text
    assert "cannot be written" in r.json()["detail"] and "Nothing was changed" in r.json()["detail"]
    after = {f.name: f.read_bytes() for f in (run_dir / "index").iterdir() if f.is_file() and f.name[0] != "."}
    assert after == before
    assert client.get("/health").json()["status"] == "ready"
    assert client.post("/predict", json={"head": "virus", "relation": "causes"}).status_code == 200
    r = client.post("/entities", json=entities)  # the retry is applied (the failed one was not)
    assert r.status_code == 200 and r.json()["added"] == 3
    r = client.post("/predict", json={"head": "n1", "relation": "isa"})
    assert r.status_code == 200 and r.json()["head"] == "n1"


def test_an_add_does_not_stall_queries_and_swaps_in_at_once(served, monkeypatch):
    client, _ = served
    monkeypatch.setitem(fileio._FAULTS, "slow", 40)  # each embedding step of the add takes 40 ms longer
    info = client.get("/info").json()
    n = 200  # 13 steps of 16: ~0.5 s of add
    result = {}

    def add() -> None:
        result["r"] = client.post("/entities", json={"entities": [{"id": f"s{i}", "name": f"slow thing {i}"}
                                                                  for i in range(n)]})

    t = threading.Thread(target=add)
    t.start()
    seen_adding, latencies = False, []
    while t.is_alive():
        start = time.perf_counter()
        r = client.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 3})
        latencies.append(time.perf_counter() - start)
        assert r.status_code == 200
        seen_adding |= client.get("/health").json()["status"] == "adding"
        if client.get("/info").json()["entities"] not in (info["entities"], info["entities"] + n):
            raise AssertionError("a partial add was visible")
    t.join()
    assert result["r"].status_code == 200, result["r"].text
    assert seen_adding and len(latencies) >= 3  # queries were answered while the add ran
    assert client.get("/info").json()["entities"] == info["entities"] + n
    assert client.get("/health").json()["status"] == "ready"
    second = client.post("/entities", json={"entities": [{"id": "s0", "name": "again"}]})
    assert second.status_code == 400 and "already added" in second.json()["detail"]


# ---------------------------------------------------------------- nothing, whatever its bytes, is a 500

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=3),
                    max_leaves=8)
FIELDS = st.fixed_dictionaries({}, optional={
    "head": JSON | st.text() | st.sampled_from(["virus", "Virus", "\ud800", "\x00", "a" * 300]),
    "relation": JSON | st.sampled_from(["causes", "isa", "inverse causes", "\udfff"]),
    "top_k": JSON | st.integers(-10, 10**30), "inverse": JSON, "filter_known": JSON, "include_head": JSON,
    "free_text": JSON, "entities": JSON, "sentence": JSON, "conditions": JSON, "relations": JSON})


@pytest.fixture(scope="module")
def shared_client(indexed_tiny_run, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    shutil.copytree(indexed_tiny_run, run_dir)
    with TestClient(kgc.api.app(kgc.load(run_dir, echo=None), max_wait_ms=1), raise_server_exceptions=False) as c:
        ready(c)
        yield c


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from([("POST", "/predict"), ("POST", "/entities"), ("POST", "/explain"),
                              ("GET", "/entities"), ("GET", "/relations"), ("GET", "/info"), ("GET", "/health")]),
       body=JSON | FIELDS | st.lists(FIELDS, max_size=3), text=st.text(max_size=40))
def test_no_request_is_a_500(shared_client, route, body, text):
    method, path = route
    if method == "GET":
        r = shared_client.get(path, params={"q": text, "limit": text})
    else:
        r = shared_client.request(method, path, content=json.dumps(body).encode("utf-8", "surrogatepass"),
                                  headers={"content-type": "application/json"})
    assert r.status_code < 500, (method, path, body, r.text[:500])
    assert r.headers["content-type"].startswith(("application/json", "text/html")), r.headers


TOUGH = [("/predict", '{"head": "\\ud800", "relation": "isa"}'), ("/predict", '{"head": "virus", "relation": "isa", '
                                                                             '"top_k": 1e400}'),
         ("/predict", '{"head": "virus", "relation": "isa", "top_k": NaN}'), ("/explain", '{"head": "\\ud800"}'),
         ("/explain", '{"head": "virus", "relations": ["\\ud800"]}'),
         ("/entities", '{"entities": [{"id": "a", "name": "\\u0000"}]}'),
         ("/predict", '{"head": "\\u0000", "relation": "isa", "free_text": true}'),
         ("/predict", b'{"head": "\xff\xfe", "relation": "isa"}'), ("/predict", b"\x00" * 10)]


@pytest.mark.parametrize("path,body", TOUGH)
def test_values_that_cannot_be_encoded_or_compared_are_4xx(shared_client, path, body):
    r = shared_client.post(path, content=body if isinstance(body, bytes) else body.encode(),
                           headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500 or (r.status_code == 200 and path == "/predict"), r.text
    r.json()  # valid JSON, whatever the input held


def test_a_real_server_bounds_non_reading_clients_and_stops_an_add_on_sigterm(indexed_tiny_run, tmp_path):
    """A real server: clients that pipeline requests and never read the replies do not grow its memory; then
    SIGTERM while an add embeds: the add is abandoned between two steps (503, the run as it was), the server
    exits 0 well within its grace period."""
    import contextlib
    import os
    import signal
    import socket
    import subprocess
    import sys

    import httpx

    from tests.test_serve_process import free_port

    run_dir = tmp_path / "run"
    shutil.copytree(indexed_tiny_run, run_dir)
    before = sorted(f.name for f in (run_dir / "index").iterdir())
    port, log = free_port(), tmp_path / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kgc", "serve", str(run_dir), "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "KGC_FAULT": "slow:150"})
    url, reply = f"http://127.0.0.1:{port}", {}
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ready":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)

        # a client that pipelines requests and never reads the replies: the server stops reading it (h11 pauses
        # until the replies are read), so its memory stays put (httptools queued 60 MB of them: +780 MiB)
        rss = lambda: int(next(line for line in open(f"/proc/{proc.pid}/status")  # noqa: E731
                               if line.startswith("VmRSS")).split()[1]) // 1024
        before_rss, socks, sent = rss(), [], 0
        req = (b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"content-length: 54\r\n\r\n" + b'{"head": "virus", "relation": "causes", "top_k": 1000}')
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setblocking(False)
            socks.append(sock)
        flood_end = time.time() + 3
        while time.time() < flood_end:
            for sock in socks:
                with contextlib.suppress(BlockingIOError):
                    sent += sock.send(req * 50)
            time.sleep(0.01)
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ready"
        grown = rss() - before_rss
        for sock in socks:
            sock.close()
        assert sent > 5e6 and grown < 150, (sent, grown)

        def add() -> None:
            reply["r"] = httpx.post(f"{url}/entities", timeout=60, json={
                "entities": [{"id": f"t{i}", "name": f"term thing {i}"} for i in range(160)]})

        t = threading.Thread(target=add)
        t.start()
        while httpx.get(f"{url}/health", timeout=2).json()["status"] != "adding":
            time.sleep(0.05)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=30)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert time.time() - start < 5, "the server took its whole grace period"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = reply["r"]
    assert r.status_code == 503 and "not added" in r.json()["detail"], r.text
    assert sorted(f.name for f in (run_dir / "index").iterdir()) == before
    assert not (run_dir / "index" / "added_entities.tsv").exists()
    assert "Traceback" not in log.read_text()


def test_the_host_check_follows_the_bound_address_and_answers_json():
    """`kgc serve --host 127.0.0.2` used to answer any Host (the check was on for 127.0.0.1 only), and its 400 was
    plain text: the check now covers every loopback or named address it binds (not the wildcard ones, whose names
    cannot be known), and refuses with JSON."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from kgc.serve import _TrustedHosts, trusted_hosts_for

    assert trusted_hosts_for("127.0.0.2") == ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"]
    assert trusted_hosts_for("::1") == ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert trusted_hosts_for("10.1.2.3") == ["10.1.2.3"] and trusted_hosts_for("kgc.lan") == ["kgc.lan"]
    assert trusted_hosts_for("0.0.0.0") is None and trusted_hosts_for("::") is None
    app = Starlette(routes=[Route("/health", lambda request: PlainTextResponse("ok"))])
    client = TestClient(_TrustedHosts(app, allowed=trusted_hosts_for("127.0.0.2")))
    for good in ("127.0.0.2:8000", "localhost", "[::1]:8000", "LOCALHOST:1"):
        assert client.get("/health", headers={"host": good}).text == "ok", good
    bad = client.get("/health", headers={"host": "evil.com"})
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/json"
    assert bad.json()["detail"].startswith("Invalid host header 'evil.com'")


# ---------------------------------------------------------------- one truth between processes

def test_two_servers_on_one_run_see_each_others_adds(indexed_tiny_run, tmp_path):
    """A second server on the run used to answer the first one's new entity as free text while /health said
    ready: each now notices a commit another process made (index/meta.json replaced) and loads it off the query
    path — an add through server A, then `kgc index --add` from the CLI, both reach server B."""
    run_dir = tmp_path / "run"
    shutil.copytree(indexed_tiny_run, run_dir)

    def serving(run):
        return TestClient(kgc.api.app(run, max_wait_ms=5, watch_seconds=0.1), raise_server_exceptions=False)

    with serving(kgc.load(run_dir, echo=None)) as a, serving(kgc.load(run_dir, echo=None)) as b:
        ready(a), ready(b)
        query = {"head": "new1", "relation": "isa", "top_k": 3}
        assert "nearest" in b.post("/predict", json=query).json()  # not an entity yet: free text
        r = a.post("/entities", json={"entities": [{"id": "new1", "name": "brand new thing"}]})
        assert r.status_code == 200, r.text

        def entity_in_b(head: str) -> dict:
            deadline = time.time() + 20
            while True:
                reply = b.post("/predict", json={**query, "head": head}).json()
                if "nearest" not in reply:
                    return reply
                assert time.time() < deadline, "server B never saw the add"
                time.sleep(0.1)

        reply = entity_in_b("new1")
        assert reply["head"] == "new1" and reply["head_text"].startswith("brand new thing")
        assert b.get("/info").json()["entities"] == a.get("/info").json()["entities"]
        assert b.get("/health").json()["status"] == "ready"
        f = tmp_path / "more.tsv"
        f.write_text("new2\tanother new thing\t\n")
        assert cli("index", run_dir, "--add", f, "--no-progress").exit_code == 0
        assert entity_in_b("new2")["head"] == "new2"
        for _ in range(50):  # and server A, whose own add it was, sees the CLI's too
            if "nearest" not in a.post("/predict", json={**query, "head": "new2"}).json():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("server A never saw the CLI's add")


def test_cli_json_and_post_predict_give_the_same_record(indexed_tiny_run, tmp_path):
    """`kgc predict --json`, `kgc predict --input … (jsonl)` and POST /predict give one record, field for field,
    for the same query (random entity, name and free-text heads, relations, directions and options)."""
    import random

    run = kgc.load(indexed_tiny_run, echo=None)
    graph = run.predictor.graph()
    rng = random.Random(5)
    heads = [*rng.sample(graph.entities, 4), *rng.sample(graph.names, 2), "a thing nobody named"]
    queries = [{"head": h, "relation": rng.choice(graph.relations), "top_k": rng.choice([1, 3, 10]),
                "inverse": rng.random() < 0.5, "filter_known": rng.random() < 0.5} for h in heads]
    lines = tmp_path / "questions.jsonl"
    lines.write_text("".join(json.dumps(q) + "\n" for q in queries))
    from_file = [json.loads(x) for x in cli("predict", indexed_tiny_run, "--input", lines, "--no-progress").stdout.splitlines()]

    def same(x: dict, y: dict) -> None:
        x, y = {k: v for k, v in x.items() if k != "seconds"}, {k: v for k, v in y.items() if k != "seconds"}
        assert x.keys() == y.keys()
        for px, py in zip(x.pop("predictions"), y.pop("predictions")):
            assert px.keys() == py.keys() and px["score"] == pytest.approx(py["score"], abs=1e-5)
            assert {**px, "score": 0} == {**py, "score": 0}
        assert x == y

    with TestClient(kgc.api.app(run, max_wait_ms=1)) as client:
        ready(client)
        for q, filed in zip(queries, from_file):
            args = ["predict", indexed_tiny_run, "--head", q["head"], "--relation", q["relation"], "--top-k", q["top_k"],
                    "--json", "--no-progress"]
            args += [f"--{k.replace('_', '-')}" for k in ("inverse", "filter_known") if q[k]]  # flags, off by default
            printed = json.loads(cli(*args).stdout)
            served = client.post("/predict", json=q).json()
            assert len(printed["predictions"]) == q["top_k"] and ("nearest" in printed) == (q["head"] == heads[-1])
            assert any(p["known_split"] for p in printed["predictions"]) or not printed["predictions"][0]["known"]
            same(printed, served)
            assert filed.pop("line") >= 1
            same(filed, served)


def test_a_killed_servers_folder_is_swept_by_the_next_server(tmp_path):
    """POST /entities writes its request into RUN/.serve-PID-XXXX/ (not /tmp): a server killed mid-add leaves it,
    and the next server that loads the run removes it — never a live server's."""
    import os

    from kgc.linkpred.answer.routes import sweep_service_folders

    dead, live = tmp_path / ".serve-999999999-ab12", tmp_path / f".serve-{os.getpid()}-cd34"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "POST-entities.tsv").write_text("x\ty\t\n")
    (tmp_path / ".serve-notapid").mkdir()
    assert sweep_service_folders(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and (tmp_path / ".serve-notapid").exists()
