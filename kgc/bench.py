"""``kgc bench``: the benchmarks behind the performance claims, each run as ratios inside one process.

A benchmark is a :class:`BenchCommand`: its name, the function that measures and returns the figures (named as
``"module:function"``, imported when it runs), its parameters (:class:`Param`, typer-free) and how its result is
shown. The benchmarks of one task live in its package and are found through its hooks
(:meth:`kgc.training.task.Task.bench_commands`, :meth:`~kgc.training.task.Task.bench_tables`): ``kgc bench
inference / train / loss / inputs / rules / index / structure / scale`` are link prediction's. ``kgc bench serve`` is
every task's: it drives ``kgc serve RUN`` with the requests the run's own ``Serving`` makes from its test data. The
command line (:mod:`kgc.cli.bench`) and the API (:func:`kgc.api.bench`) are generated from these descriptions, so a
task (or a plugin's task) adds a benchmark in one place.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from kgc.errors import KGCError
from kgc.registry import TASKS, lazy
from kgc.harness import SIGNATURE, BenchCommand, Param

__all__ = ["BenchCommand", "Param", "bench_serve", "commands", "run_bench", "tables"]

SERVE = BenchCommand(
    "serve", lazy("kgc.bench:bench_serve"),
    "Start `kgc serve RUN` on 127.0.0.1, drive it with N concurrent clients, report answers/s and latency.",
    (Param("run_dir", "path", help="a trained run (its index is built first if missing)", required=True),
     Param("clients", "ints", SIGNATURE, ("--clients",), "concurrent clients, one row each"),
     Param("seconds", "float", SIGNATURE, ("--seconds",), "per row", min=0.1),
     Param("max_requests", "int", SIGNATURE, ("--max-requests",), "per row, at most", min=1),
     Param("max_batch", "int", None, ("--max-batch",), "the server's", min=1),
     Param("max_wait_ms", "float", None, ("--max-wait-ms",), "the server's", min=0),
     Param("threads", "int", None, ("--threads",), "the server's torch threads", min=1),
     Param("add", "int", SIGNATURE, ("--add",), "then one more row: the most clients while one more adds this many entities "
                                        "(on a linked copy of RUN)", min=0)),
    adapt=lazy("kgc.bench:serve_arguments"), show=lazy("kgc.bench:show_serve"))


def serve_arguments(values: dict[str, Any]) -> tuple[list, dict]:
    """``kgc bench serve``'s server options (``--max-batch`` …) as the ``kgc serve`` arguments it starts with."""
    values = dict(values)
    server = {"--max-batch": values.pop("max_batch"), "--max-wait-ms": values.pop("max_wait_ms"),
              "--threads": values.pop("threads")}
    values["server_args"] = [f"{flag}={v}" for flag, v in server.items() if v is not None]
    return [values.pop("run_dir")], values


def show_serve(result: dict, values: dict, echo: Callable[[str], None]) -> None:
    echo(f"server stopped (exit {result['server_exit']}); batches: {result['batching']}")


def commands(*, lenient: bool = False) -> dict[str, BenchCommand]:
    """Every task's benchmarks by name (``kgc bench NAME``), ``serve`` included. ``lenient``: the tasks that loaded
    (a task plugin that fails to import does not take ``kgc --help`` down with it)."""
    found: dict[str, BenchCommand] = {"serve": SERVE}
    tasks = TASKS.lenient() if lenient else {name: TASKS[name] for name in TASKS}
    for name, task in tasks.items():
        for command, spec in task.bench_commands().items():
            found.setdefault(command, spec)
    return found


def run_bench(command: str, *args: Any, **options: Any) -> dict:
    """Run the benchmark ``command`` (``kgc bench COMMAND``) with its arguments; its figures."""
    known = commands()
    if command not in known:
        raise KGCError(f"kgc bench {command}: no such benchmark. Available: {', '.join(sorted(known))}")
    return known[command].run(*args, **options)


def tables() -> dict[str, Callable[..., str]]:
    """Markdown renderings of the benchmarks' results, by kind (every task's)."""
    found: dict[str, Callable[..., str]] = {}
    for name in TASKS:
        for kind, fn in TASKS[name].bench_tables().items():
            found.setdefault(kind, fn)
    return found


# ---------------------------------------------------------------- kgc bench serve


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident memory (VmHWM, Linux), MiB."""
    from kgc.training.estimate import resident_bytes

    peak = resident_bytes(pid)[1]
    return None if peak is None else round(peak / (1 << 20), 1)


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(round(q / 100 * (len(sorted_values) - 1))))]


async def _drive(url: str, requests: list, clients: int, seconds: float, max_requests: int,
                 until=None) -> dict:
    """``clients`` concurrent loops, each sending the next request and waiting for its answer, until ``seconds``
    have passed or ``max_requests`` were sent (or ``until()`` is true, when given). Latencies of answered
    requests; errors by kind."""
    import asyncio

    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal sent
        # each client its own connection (kept alive), as independent callers have: one pool shared by 32
        # coroutines measured the pool's own contention (468 against 1,529 answers/s from a no-op endpoint)
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            while time.perf_counter() < deadline and sent < max_requests and not (until and until()):
                path, body = requests[sent % len(requests)]
                sent += 1
                start = time.perf_counter()
                try:
                    r = await client.post(path, json=body)
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {"clients": clients, "seconds": round(wall, 2), "answers": len(latencies),
            "answers_per_s": round(len(latencies) / wall, 1),
            "p50_ms": None if not latencies else round(1000 * _percentile(latencies, 50), 1),
            "p95_ms": None if not latencies else round(1000 * _percentile(latencies, 95), 1),
            "p99_ms": None if not latencies else round(1000 * _percentile(latencies, 99), 1),
            "errors": sum(errors.values()), "error_kinds": errors}


def _linked_copy(run_dir: Path, into: Path) -> Path:
    """A copy of a run folder whose files are hard links where the disk allows (kgc replaces files by renaming new
    ones in, never edits them in place, so the original is never touched), else copies."""
    import os
    import shutil

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    out = into / Path(run_dir).name
    shutil.copytree(run_dir, out, copy_function=link, ignore=shutil.ignore_patterns(".lock", ".lock.json"))
    return out


def bench_serve(run_dir: Path, *, clients: list[int] = (1, 8, 32), seconds: float = 20.0, warmup: int = 20,
                max_requests: int = 100_000, startup_timeout: float = 600.0, server_args: list[str] = (),
                add: int = 0, echo=print) -> dict:
    """``kgc bench serve``: start ``kgc serve RUN`` on a free port of 127.0.0.1 as its own process, wait until it is
    ready, then for each count in ``clients`` drive it with that many concurrent clients for ``seconds``
    (``warmup`` requests first, not counted) with requests made from the run's test data, and stop it with
    SIGTERM. Rows: answers/s, p50/p95/p99 latency, errors; with the server's peak RSS and the batching counts of
    ``/info``. Bounded: each row stops after ``seconds`` or ``max_requests``; the server is stopped whatever
    happens.

    ``add``: then one more row with the most clients while one more client writes ``add`` items into the run — the
    request the run's task makes (:meth:`kgc.training.task.Task.bench_write_request`; link prediction: ``POST
    /entities`` with texts like the graph's) — until the write is done: ``add_seconds``, and ``p99_ratio`` (p99
    during the write over p99 of the row without it). The server then serves a linked copy of the run (hard links in
    a temporary folder), so the run itself never holds what was added."""
    import asyncio
    import signal
    import subprocess
    import sys

    import httpx

    from kgc.training.task import open_run, task_class

    if not clients or min(clients) < 1:
        raise KGCError("--clients: give one or more counts ≥ 1, e.g. --clients 1,8,32")
    if seconds <= 0:
        raise KGCError("--seconds must be positive")
    import tempfile

    run = open_run(run_dir, echo=None)
    write = task_class(run.task).bench_write_request(run, add) if add else None
    if add and write is None:
        raise KGCError(f"--add: kgc serve takes no writes into a {run.task} run; drop --add")
    requests = run.serving().sample_requests(min(max_requests, 20_000))
    scratch = Path(tempfile.mkdtemp(prefix="kgc-bench-serve-run-")) if add else None
    served_dir = _linked_copy(Path(run_dir), scratch) if add else Path(run_dir)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "kgc", "serve", str(served_dir), "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *server_args]

    log = Path(tempfile.mkdtemp(prefix="kgc-bench-serve-")) / "server.log"  # the server's output, for a failure
    rows, info = [], {}
    with open(log, "w", encoding="utf-8") as log_fh:
        server = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT)
        try:
            from kgc.training.routes import wait_ready

            ready_seconds = round(wait_ready(url, server, startup_timeout, what=f"kgc serve {run_dir}",
                                             see=f"its output: {log}", poll=0.5), 1)
            echo(f"server ready in {ready_seconds}s (pid {server.pid}, {url})")
            asyncio.run(_drive(url, requests, min(4, max(clients)), 60.0, warmup))  # warm-up, not counted
            for n in clients:
                row = asyncio.run(_drive(url, requests, n, seconds, max_requests))
                row["server_peak_rss_mb"] = _peak_rss_mb(server.pid)
                rows.append(row)
                echo(f"{n:>4} clients: {row['answers_per_s']:>8.1f} answers/s   p50 {row['p50_ms']} ms   "
                     f"p95 {row['p95_ms']} ms   p99 {row['p99_ms']} ms   errors {row['errors']}   "
                     f"server RSS {row['server_peak_rss_mb']} MiB")
            if add:
                rows.append(_row_during_add(url, requests, max(clients), max_requests, write, add,
                                            next(r for r in rows if r["clients"] == max(clients)), server.pid, echo))
            info = httpx.get(f"{url}/info", timeout=10).json()
            chosen = info.get("precision") or {}
            if chosen:  # what the figures were measured in (train.amp's choice on this machine, or $KGC_AMP)
                echo(f"the server encoded its queries in {chosen.get('name')} ({chosen.get('reason')})")
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    import shutil

    shutil.rmtree(log.parent, ignore_errors=True)  # kept only when something failed (the messages name it)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    rec = run.recipe
    return {"run": str(run_dir), "task": run.task, "dataset": rec.data.path or rec.data.dataset,
            "conditioner": rec.model.conditioner, "server_threads": info.get("threads"), "cpus": _cpus(),
            "server_args": list(server_args),
            "ready_seconds": ready_seconds, "seconds_per_row": seconds, "rows": rows,
            "batching": info.get("batching"), "query_engine": info.get("query_engine"),
            "entities": info.get("entities"), "precision": info.get("precision"), "server_exit": server.returncode}


def _row_during_add(url: str, requests: list, clients: int, max_requests: int, write: tuple[str, Any, str],
                    n: int, without: dict, pid: int, echo) -> dict:
    """The flood of ``clients`` while one more client sends ``write`` ((path, body, what it does), ``n`` items);
    the row, with the write's figures."""
    import asyncio
    import threading

    import httpx

    path, body, what = write
    done: dict = {}

    def add() -> None:
        start = time.perf_counter()
        try:
            r = httpx.post(f"{url}{path}", json=body, timeout=3600)
            done["status"], done["body"] = r.status_code, r.json()
        except (httpx.HTTPError, ValueError) as exc:
            done["status"], done["body"] = None, str(exc)
        done["seconds"] = round(time.perf_counter() - start, 2)

    adder = threading.Thread(target=add, daemon=True)
    adder.start()
    row = asyncio.run(_drive(url, requests, clients, 3600.0, max_requests, until=lambda: "seconds" in done))
    adder.join()
    if done.get("status") != 200:
        raise KGCError(f"POST {path} ({what}) failed during the bench: {done.get('status')} "
                       f"{str(done.get('body'))[:300]}")
    row.update(during_add=n, add_seconds=done["seconds"], server_peak_rss_mb=_peak_rss_mb(pid),
               p99_ratio=round(row["p99_ms"] / without["p99_ms"], 2) if row["p99_ms"] and without["p99_ms"]
               else None)
    echo(f"{clients:>4} clients while {what} ({row['add_seconds']}s): "
         f"{row['answers_per_s']:>8.1f} answers/s   p50 {row['p50_ms']} ms   p95 {row['p95_ms']} ms   "
         f"p99 {row['p99_ms']} ms ({row['p99_ratio']}x without the add)   errors {row['errors']}")
    return row


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
