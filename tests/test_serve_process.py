"""``kgc serve`` as users run it: a real uvicorn process on 127.0.0.1 (ready on /health, concurrent answers equal
sequential ones, SIGTERM ends it cleanly), its page in a real headless browser (Debian's chromium through
selenium), and ``kgc bench serve`` (bounded, stops by itself)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import kgc
from tests.test_api import tiny_linkpred
from tests.test_serve import same_answers

httpx = pytest.importorskip("httpx")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# .ci/run sets KGC_REQUIRE_BROWSER=1 (it installs Debian's chromium and chromium-driver): a missing browser fails there
NO_BROWSER = "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lp_run(tiny_bert, tmp_path_factory, data_home):
    out = tmp_path_factory.mktemp("served") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=3, echo=None)
    run = kgc.load(out, echo=None)
    run.entities.ensure(progress=False)
    return run


@pytest.fixture(scope="module")
def server(lp_run, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kgc", "serve", str(lp_run.path), "--port", str(port),
                                 "--max-wait-ms", "20", "--log-level", "info"], stdout=fh, stderr=subprocess.STDOUT,
                                env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"kgc serve exited {proc.returncode}:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ready":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.time() < deadline, f"not ready in 120 s:\n{log.read_text()}"
            time.sleep(0.2)
        yield {"url": url, "proc": proc, "log": log}
    finally:  # never leave a server behind, whatever failed
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_real_server_answers_concurrent_queries_as_sequential_ones(server, lp_run):
    graph = lp_run.predictor.graph()
    bodies = [{"head": graph.entities[i], "relation": graph.relations[i % 7], "top_k": 5, "inverse": i % 2 == 1}
              for i in range(32)]
    with httpx.Client(base_url=server["url"], timeout=60) as client:
        before = client.get("/info").json()["batching"]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda b: client.post("/predict", json=b), bodies))
        after = client.get("/info").json()["batching"]
    assert all(a.status_code == 200 for a in answers)
    for body, got in zip(bodies, answers):
        want = lp_run.answer(body["head"], body["relation"], top_k=5, inverse=body["inverse"]).to_json()
        same_answers(got.json(), want)
    assert after["items"] - before["items"] == 32 and after["batches"] - before["batches"] < 32


# the answers table's cells, read in one call
ROWS_JS = "return [...document.querySelectorAll('#answers tr')].map(tr => [...tr.children].map(td => td.textContent))"


def known_splits(graph) -> dict[tuple[str, str, str], str]:
    """(head, relation, tail) → the split that holds it (dev or test first, as the reply's known_split)."""
    out: dict = {}
    for split in ("dev", "test", "train"):
        for h, r, t in graph.splits[split].tolist():
            out.setdefault((graph.entities[h], graph.relations[r], graph.entities[t]), split)
    return out


def test_page_in_a_real_browser(server, lp_run):
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("KGC_REQUIRE_BROWSER"):
            pytest.fail(NO_BROWSER)
        pytest.skip(NO_BROWSER)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    graph = lp_run.predictor.graph()
    splits = known_splits(graph)
    text = lambda i: driver.find_element(By.ID, i).text  # noqa: E731
    try:
        driver.get(server["url"] + "/")
        wait = WebDriverWait(driver, 30, poll_frequency=0.05)
        # the relations sorted by their readable text, none chosen: asking sends nothing until one is
        relation = Select(driver.find_element(By.ID, "relation"))
        wait.until(lambda d: len(relation.options) == len(graph.relations) + 1)
        shown = [o.text for o in relation.options]
        assert shown[0] == "choose a relation" and relation.first_selected_option.get_attribute("value") == ""
        assert shown[1:] == sorted(shown[1:], key=str.casefold)
        head = driver.find_element(By.ID, "head")
        head.send_keys("vir")  # autocomplete offers the entity
        wait.until(lambda d: "virus" in [o.get_attribute("value")
                                         for o in d.find_elements(By.CSS_SELECTOR, "#head-options option")])
        head.clear()
        head.send_keys("virus")
        driver.find_element(By.ID, "ask").click()
        assert text("status") == "" and not driver.find_elements(By.CSS_SELECTOR, "#answers tr")
        relation.select_by_value("causes")
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: text("status").startswith("(virus, causes, ?)"))
        rows = driver.execute_script(ROWS_JS)
        want = lp_run.answer("virus", "causes").predictions
        assert [r[1] for r in rows] == [p.entity for p in want]
        # a known answer says which split has it
        assert [r[4] for r in rows] == [f"✓ {splits[('virus', 'causes', p.entity)]}" if p.known else ""
                                        for p in want]
        assert [float(r[3]) for r in rows] == pytest.approx([round(p.score, 4) for p in want], abs=1e-4)
        # an answer clicked becomes the head, asked under the same relation
        nxt = want[1].entity
        driver.find_elements(By.CSS_SELECTOR, "#answers a.entity")[1].click()
        wait.until(lambda d: text("status").startswith(f"({graph.full_texts[graph.entity_index[nxt]]}, causes, ?)"))
        assert head.get_attribute("value") == nxt and relation.first_selected_option.get_attribute("value") == "causes"
        assert [r[1] for r in driver.execute_script(ROWS_JS)] == [p.entity for p in
                                                                  lp_run.answer(nxt, "causes").predictions]
        # an inverse question reads (?, relation, head)
        head.clear()
        head.send_keys("virus")
        driver.find_element(By.ID, "inverse").click()
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: text("status").startswith("(?, causes, virus)"))
        driver.find_element(By.ID, "inverse").click()
        # every answer of a question the graph answers in train, dev and test: each ✓ names its split
        h, r = next((h, r) for h, r, _ in splits
                    if {splits.get((h, r, t)) for t in graph.entities} >= {"train", "dev", "test"})
        head.clear()
        head.send_keys(h)
        relation.select_by_value(r)
        top = driver.find_element(By.ID, "top-k")
        top.clear()
        top.send_keys(str(graph.num_entities))
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: text("status").startswith(f"({graph.full_texts[graph.entity_index[h]]}, ")
                   and len(driver.execute_script(ROWS_JS)) == graph.num_entities - 1)
        rows = driver.execute_script(ROWS_JS)
        assert [r_[4] for r_ in rows] == [f"✓ {splits[(h, r, r_[1])]}" if (h, r, r_[1]) in splits else ""
                                          for r_ in rows]
        assert {r_[4] for r_ in rows} == {"", "✓ train", "✓ dev", "✓ test"}
        # at 400 px the score column stays in the window (long ids wrap)
        driver.set_window_size(400, 900)
        wait.until(lambda d: d.execute_script("return window.innerWidth") <= 400)
        boxes = driver.execute_script(
            "const w = document.documentElement.clientWidth; return [w, document.querySelector('.table-wrap')"
            ".scrollWidth, ...[...document.querySelectorAll('#answers-table tr > :nth-child(4)')]"
            ".map(c => c.getBoundingClientRect().right)]")
        assert boxes[1] <= boxes[0] and max(boxes[2:]) <= boxes[0], boxes
        top.clear()
        top.send_keys("10")
        # a free-text head: the note names its nearest entities, as kgc predict does
        free = "a tiny infectious agent"
        head.clear()
        head.send_keys(free)
        relation.select_by_value("causes")
        driver.find_element(By.ID, "free-text").click()
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: text("status").startswith(f"({free}, causes, ?)"))
        assert "embedded as free text" in text("note")
        assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#note a")] == \
            lp_run.predictor.nearest_entities(free, lp_run.entities)[0]
        driver.find_element(By.ID, "free-text").click()
        # a near miss: a clean message (no server path, no CLI flags), its suggestions links that ask again
        head.clear()
        head.send_keys("viruss")
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: "Did you mean" in text("error"))
        error = text("error")
        assert error.count("Did you mean") == 1 and str(lp_run.path) not in error and "--" not in error, error
        assert not driver.find_element(By.ID, "note").is_displayed()
        links = driver.find_elements(By.CSS_SELECTOR, "#error a")
        assert "virus" in [a.text for a in links]
        next(a for a in links if a.text == "virus").click()
        wait.until(lambda d: text("status").startswith("(virus, causes, ?)"))
        assert head.get_attribute("value") == "virus" and text("error") == ""
    finally:
        driver.quit()


def test_only_loopback_host_names_are_answered(server):
    """A server on 127.0.0.1 answers Host headers that name this machine, not a DNS name a web page elsewhere could
    have pointed here (DNS rebinding) to write into the run."""
    ok = httpx.get(server["url"] + "/health", headers={"host": "localhost:8000"}, timeout=5)
    assert ok.status_code == 200
    bad = httpx.post(server["url"] + "/entities", headers={"host": "evil.example"}, timeout=5,
                     json={"entities": [{"id": "x", "name": "x"}]})
    assert bad.status_code == 400 and "Invalid host header" in bad.json()["detail"]  # JSON, as every error


def test_kgc_predict_asks_a_running_server(server, lp_run):
    import json

    from tests.conftest import cli

    out = cli("predict", "--server", server["url"], "--head", "virus", "--relation", "causes", "--top-k", "4",
              "--json")
    same_answers(json.loads(out.stdout), lp_run.answer("virus", "causes", top_k=4).to_json())
    bad = cli("predict", "--server", server["url"], "--head", "virus", "--relation", "causez", check=False)
    assert bad.exit_code == 2 and "unknown relation 'causez'" in bad.stderr
    down = cli("predict", "--server", f"http://127.0.0.1:{free_port()}", "--head", "virus", "--relation", "causes",
               check=False)
    assert down.exit_code == 2 and "no kgc server answers" in down.stderr


def test_the_cli_entry_point_answers_and_exits_quickly(server, lp_run):
    """The real `kgc predict` process (its quick exit skips the interpreter's teardown) prints the answers whole."""
    res = subprocess.run([sys.executable, "-m", "kgc", "predict", str(lp_run.path), "--head", "virus", "--relation",
                          "causes", "--top-k", "3", "--no-progress"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("(virus, causes, ?)") and len(lines) == 4
    assert [line.split()[1] for line in lines[1:]] == [p.entity for p in lp_run.answer("virus", "causes",
                                                                                          top_k=3).predictions]


def test_sigterm_ends_the_server_cleanly(server):  # last of the tests that use the module's server: it stops it
    proc = server["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log = server["log"].read_text()
    assert "Application shutdown complete" in log and "stopped (SIGTERM)" in log
    assert "Traceback" not in log


def test_bench_serve_drives_a_real_server_and_stops(lp_run):
    result = kgc.api.bench("serve", lp_run.path, clients=[1, 4], seconds=1.5, warmup=4, echo=lambda m: None)
    assert [r["clients"] for r in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["answers"] > 0 and row["errors"] == 0 and row["seconds"] < 30
        assert row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
        assert row["answers_per_s"] == pytest.approx(row["answers"] / row["seconds"], rel=0.05)
    assert result["server_exit"] == 0 and result["batching"]["items"] >= sum(r["answers"] for r in result["rows"])
    assert result["precision"]["name"] == "fp32" and "KGC_AMP=off" in result["precision"]["reason"]  # the suite's
