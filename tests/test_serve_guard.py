"""A service nobody can starve: ``kgc serve``'s guard (:func:`kgc.serve.guarded_protocol`) under bounded load
tests, each in a real server process, each stopping by itself.

* 300 idle, half-header and trickling connections (from six loopback addresses, under the per-client cap): a
  probe from another address is answered in under 1 s, never 503; the server then closes every one of them by
  its deadline (idle: closed; half a head: 408; a trickled body: 408 at the whole-body deadline);
* one address past ``--per-client``: a 503 at once, the others still served;
* 60 clients that never read 3 MiB replies: the server holds at most the reply budget for them, and drops them;
* SIGTERM under load: every request already sent is answered (200 or 503), none is reset.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from tests.test_serve_process import free_port  # noqa: E402


def wait_ready(proc: subprocess.Popen, url: str, log: Path, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ready":
                return
        except (httpx.HTTPError, ValueError):
            pass
        assert time.time() < deadline, log.read_text()
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("VmRSS")).split()[1]) / 1024


def connect(port: int, source: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before it closed ``sock`` (None: still open after ``within`` seconds)."""
    sock.settimeout(within)
    got = b""
    end = time.time() + within
    try:
        while time.time() < end:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except (socket.timeout, TimeoutError):
        return None
    except ConnectionResetError:
        return got
    return None


def closed_now(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` without sending it anything (read without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def start_kgc_serve(run_dir: Path, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str, Path]:
    port, log = free_port(), tmp_path / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kgc", "serve", str(run_dir), "--port", str(port), *args],
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log)
    return proc, url, log


def test_idle_half_sent_and_trickling_connections_starve_nobody(indexed_tiny_run, tmp_path):
    proc, url, log = start_kgc_serve(indexed_tiny_run, tmp_path, "--keep-alive", "2", "--head-timeout", "3",
                                     "--body-timeout", "4", "--per-client", "64")
    port = int(url.rsplit(":", 1)[1])
    idle, half, trickle = [], [], []
    stop_trickle = threading.Event()
    try:
        for i in range(300):  # 50 from each of six addresses: under the per-client cap of 64
            sock = connect(port, f"127.0.0.{2 + i % 6}")
            if i % 3 == 0:
                idle.append(sock)
            elif i % 3 == 1:
                sock.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-")
                half.append(sock)
            else:
                sock.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                             b"content-length: 100\r\n\r\n{")
                trickle.append(sock)

        def drip() -> None:  # a byte every 0.5 s on each: never a gap the old per-read timeout would notice
            while not stop_trickle.wait(0.5):
                for sock in trickle:
                    with contextlib.suppress(OSError):
                        sock.send(b" ")
        threading.Thread(target=drip, daemon=True).start()
        time.sleep(0.5)
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.1")) as probe:
            for _ in range(3):
                start = time.perf_counter()
                r = probe.post(f"{url}/predict", json={"head": "virus", "relation": "isa"}, timeout=5)
                took = time.perf_counter() - start
                assert r.status_code == 200 and took < 1.0, (r.status_code, r.text[:200], took)
                assert probe.get(f"{url}/health", timeout=5).status_code == 200

        # one address past its cap: its connections waiting longest (idle here) make room, none is refused, and a
        # new one from that address is answered at once
        crowd = [connect(port, "127.0.0.9") for _ in range(70)]
        time.sleep(0.5)
        closed = [i for i, sock in enumerate(crowd) if closed_now(sock)]
        # 6 closed without a byte (no 503), among those accepted before the cap (the newest 6 all kept)
        assert len(closed) == 6 and max(closed) < 64, closed
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9")) as same:
            start = time.perf_counter()
            assert same.get(f"{url}/health", timeout=5).status_code == 200
            assert time.perf_counter() - start < 1.0
        for sock in crowd:
            sock.close()

        # every one of the 300 is closed by its deadline (the longest: the body's 4 s from its head, plus 2)
        outcomes = {}
        for name, socks, within in (("idle", idle, 4.0), ("half", half, 4.0), ("trickle", trickle, 8.0)):
            replies = [closed_by_server(s, within) for s in socks]
            assert all(r is not None for r in replies), (name, sum(r is None for r in replies))
            outcomes[name] = replies
        assert all(r == b"" for r in outcomes["idle"])
        for r in outcomes["half"]:
            assert r.startswith(b"HTTP/1.1 408 ") and b'"detail"' in r and b"headers did not arrive" in r
        assert all(r.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 4s" in r for r in outcomes["trickle"])
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        stop_trickle.set()
        for sock in idle + half + trickle:
            sock.close()
        stop(proc)
    assert "Traceback" not in log.read_text()


STAND_IN = textwrap.dedent("""
    import sys

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from kgc.serve import Limits, uvicorn_config

    BIG = 3 << 20

    def big(request):  # a fresh 3 MiB reply per request, as a large POST /predict answer is
        return Response(b"x" * BIG, media_type="application/octet-stream")

    app = Starlette(routes=[Route("/big", big), Route("/health", lambda r: JSONResponse({"status": "ready"}))])
    limits = Limits(reply_budget=int(sys.argv[2]) << 20, send_timeout=float(sys.argv[3]))
    uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=int(sys.argv[1]), limits=limits,
                                  log_level="warning")).run()
""")


def test_clients_that_never_read_are_bounded_by_the_reply_budget(tmp_path):
    """60 clients ask for 3 MiB each and read nothing (small receive buffers, so the bytes wait in the server):
    without a bound the server holds 180 MiB for them; with a 16 MiB budget it grows by under 50 MiB, answers a
    probe at once, and drops the stalled clients (oldest first, then every one at the send deadline)."""
    script, log, port = tmp_path / "stand_in.py", tmp_path / "server.log", free_port()
    script.write_text(STAND_IN)
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, str(script), str(port), "16", "4"], stdout=fh,
                                stderr=subprocess.STDOUT)
    url, socks = f"http://127.0.0.1:{port}", []
    try:
        wait_ready(proc, url, log, 60)
        before = rss_mib(proc.pid)
        for i in range(60):
            sock = connect(port, f"127.0.0.{2 + i % 4}", rcvbuf=4096)
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            socks.append(sock)
            time.sleep(0.02)
        time.sleep(1.0)
        grown = rss_mib(proc.pid) - before
        start = time.perf_counter()
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert time.perf_counter() - start < 1.0
        assert grown < 50, grown
        time.sleep(5)  # the send deadline (4 s): every stalled client has been dropped by now
        dropped = 0
        for sock in socks:
            sock.settimeout(0.01)
            with contextlib.suppress(OSError):
                while sock.recv(1 << 20):
                    pass
            dropped += 1
        assert dropped == 60
    finally:
        for sock in socks:
            sock.close()
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.mark.parametrize("clients, pause", [(8, False), (32, True)], ids=["8-busy", "32-keep-alive"])
def test_sigterm_answers_every_request_and_resets_none(indexed_tiny_run, tmp_path, clients, pause):
    """Clients asking on keep-alive connections (8 back to back; 32 pausing between requests, so idle connections
    are at rest when the signal comes): SIGTERM answers every request already sent (200 or 503), closes idle
    connections cleanly and refuses new ones — no reset, no request dropped unanswered, exit 0."""
    proc, url, log = start_kgc_serve(indexed_tiny_run, tmp_path)
    outcomes: list[str] = []
    go = threading.Event()

    def client(k: int) -> None:
        with httpx.Client(timeout=10) as c:
            while not go.is_set():
                try:
                    r = c.post(f"{url}/predict", json={"head": "virus", "relation": "isa"})
                    outcomes.append(str(r.status_code))
                    if r.status_code == 503:
                        return
                except httpx.ConnectError:  # the listener is closed: a new connection is refused, never reset
                    outcomes.append("refused")
                    return
                except httpx.HTTPError as exc:  # a reset, or a request the server dropped unanswered
                    outcomes.append(f"{type(exc).__name__}: {exc}")
                    return
                if pause:
                    time.sleep(0.05 + 0.01 * (k % 7))  # idle between requests: keep-alive connections at rest

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        go.set()
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        go.set()
        stop(proc)
    bad = [o for o in outcomes if o not in ("200", "503", "refused")]
    assert not bad and outcomes.count("200") > (20 if clients == 8 else 32), (bad[:5], len(outcomes))
    assert "Traceback" not in log.read_text()


GUARDED = textwrap.dedent("""
    import json
    import sys

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from kgc.serve import Limits, uvicorn_config, _LimitBodies
    import threading

    async def echo(request):
        return JSONResponse({"bytes": len(await request.body())})

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]),
                            Route("/health", lambda r: JSONResponse({"status": "ready"}))])
    limits = Limits(**json.loads(sys.argv[2]))
    guarded = _LimitBodies(app, limits=limits, stopping=threading.Event())
    uvicorn.Server(uvicorn_config(guarded, host="127.0.0.1", port=int(sys.argv[1]), limits=limits,
                                  log_level="warning")).run()
""")


def start_guarded(tmp_path: Path, **limits) -> tuple[subprocess.Popen, str, int, Path]:
    """The guard and the body middleware over a two-route app (no model): seconds to start."""
    import json

    script, log, port = tmp_path / "guarded.py", tmp_path / "guarded.log", free_port()
    script.write_text(GUARDED)
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, str(script), str(port), json.dumps(limits)], stdout=fh,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log, 60)
    return proc, url, port, log


def test_slow_bodies_hold_no_request_slot(tmp_path):
    """256 connections from six addresses each sending a body a byte at a time used to take all 256 request slots
    for the body deadline (renewable): a body is read before its request takes a slot, so a probe from another
    address is answered at once, and each slow body still ends in a 408 at its deadline."""
    proc, url, port, log = start_guarded(tmp_path, max_requests=256, body_timeout=6.0, head_timeout=6.0,
                                         keep_alive=6.0)
    socks, stop_drip = [], threading.Event()
    try:
        for i in range(256):
            sock = connect(port, f"127.0.0.{2 + i % 6}")
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         b"content-length: 1000\r\n\r\n[")
            socks.append(sock)

        def drip() -> None:
            while not stop_drip.wait(0.5):
                for sock in socks:
                    with contextlib.suppress(OSError):
                        sock.send(b"1")
        threading.Thread(target=drip, daemon=True).start()
        time.sleep(1.0)
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.20")) as probe:
            for _ in range(3):
                start = time.perf_counter()
                r = probe.post(f"{url}/echo", content=b"[1, 2]", timeout=5)
                assert r.status_code == 200 and r.json() == {"bytes": 6}, r.text
                assert time.perf_counter() - start < 1.0
        replies = [closed_by_server(s, 8.0) for s in socks]
        assert all(r is not None and r.startswith(b"HTTP/1.1 408 ") for r in replies), replies[:3]
    finally:
        stop_drip.set()
        for sock in socks:
            sock.close()
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_one_loopback_client_renewing_its_connections_shuts_out_no_other(tmp_path):
    """On the default bind every local client is 127.0.0.1: one that keeps 64 idle connections open and opens a
    new one for each the server closes used to hold every other local client at 503. Past the per-client cap the
    connection waiting longest makes room, so a probe from 127.0.0.1 is answered in under 1 s, every time."""
    proc, url, port, log = start_guarded(tmp_path, per_client=64, keep_alive=30.0, head_timeout=30.0)
    socks, stop_renew = [connect(port, "127.0.0.1") for _ in range(64)], threading.Event()

    def renew() -> None:
        while not stop_renew.wait(0.05):
            for k, sock in enumerate(socks):
                if closed_now(sock):
                    sock.close()
                    with contextlib.suppress(OSError):
                        socks[k] = connect(port, "127.0.0.1")
    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        time.sleep(0.5)
        for _ in range(10):
            with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.1")) as probe:
                start = time.perf_counter()
                r = probe.get(f"{url}/health", timeout=5)
                assert r.status_code == 200, r.text
                assert time.perf_counter() - start < 1.0
            time.sleep(0.1)
    finally:
        stop_renew.set()
        renewer.join(timeout=5)
        for sock in socks:
            sock.close()
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_h11s_own_400s_are_json(tmp_path):
    """Bytes h11 refuses (not HTTP; a head past the header limit) were answered with uvicorn's plain-text 400:
    every error body the service sends is JSON."""
    import json

    proc, url, port, log = start_guarded(tmp_path, max_header=4096)
    try:
        for sent in (b"NOT HTTP AT ALL\r\n\r\n",  # and a head past the limit, still unfinished (h11's limit)
                     b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nx-big: " + b"a" * 8192):
            sock = connect(port, "127.0.0.1")
            sock.sendall(sent)
            got = closed_by_server(sock, 5.0)
            sock.close()
            assert got is not None and got.startswith(b"HTTP/1.1 400 "), got
            head, _, body = got.partition(b"\r\n\r\n")
            assert b"content-type: application/json" in head.lower(), head
            assert "not a valid HTTP/1.1 request" in json.loads(body)["detail"]
    finally:
        stop(proc)


def test_the_guard_runs_on_the_uvicorn_and_h11_it_was_tested_with(monkeypatch):
    """The guard subclasses uvicorn's H11Protocol: the installed uvicorn and h11 are the releases it was tested
    with (this fails naming the one that is not), pyproject.toml pins exactly those, and another is named."""
    import tomllib
    from importlib.metadata import version

    from kgc.serve import guard

    assert guard.untested_versions() == []
    pins = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, minor in guard.TESTED.items():
        low, high = minor.split(".")
        assert any(p.split(",")[0].split(">=")[0].split("[")[0] == name and f">={minor}," in p
                   and f"<{low}.{int(high) + 1}" in p for p in pins), (name, pins)
    monkeypatch.setitem(guard.TESTED, "uvicorn", "0.53")
    assert guard.untested_versions() == [f"uvicorn {version('uvicorn')} (tested: 0.53)"]
