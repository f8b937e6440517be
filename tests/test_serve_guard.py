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

        # one address past its cap: refused at once with a JSON 503; another address is still served
        crowd = [connect(port, "127.0.0.9") for _ in range(70)]
        refused = [s for s in crowd if (got := closed_by_server(s, 0.3)) is not None and b" 503 " in got]
        assert 6 <= len(refused) <= 7, len(refused)
        for sock in crowd:
            sock.close()
        with httpx.Client() as other:
            assert other.get(f"{url}/health", timeout=5).status_code == 200

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


def test_sigterm_under_load_answers_every_request_and_resets_none(indexed_tiny_run, tmp_path):
    proc, url, log = start_kgc_serve(indexed_tiny_run, tmp_path)
    outcomes: list[str] = []
    go = threading.Event()

    def client() -> None:
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

    threads = [threading.Thread(target=client) for _ in range(8)]
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
    assert not bad and outcomes.count("200") > 20, (bad[:5], len(outcomes))
    assert "Traceback" not in log.read_text()
