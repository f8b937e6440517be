"""What ``kgc serve`` asks of a task: a :class:`Serving` (``Run.serving()``) loads the run's model once, answers
batched requests on its own routes and brings its own page — so the server (:mod:`kgc.serve`) holds nothing
task-specific: it adds ``/health``, ``/info``, ``/explain``, the error handling and the OpenAPI page at ``/docs``.

A task's routes take the work of many requests through :class:`kgc.batching.MicroBatcher` (made by the server's
``batcher`` factory, so every batcher is closed when the server stops): one forward pass per batch.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from fastapi import APIRouter

    from kgc.batching import MicroBatcher
    from kgc.training.run import Run

BatcherFactory = Callable[..., "MicroBatcher"]


class Serving(ABC):
    """One task's part of ``kgc serve``. ``lock`` serialises the model's work (batches) with writes into the run
    (e.g. adding entities), which the server may run on other threads; what a run loads once it loads under its
    own lock, so reads from other threads (name resolution, search) see either the old state or the new."""

    def __init__(self, run: "Run") -> None:
        self.run = run
        self.lock = threading.RLock()
        self.stopping = threading.Event()  # set when the server is asked to stop (SIGTERM): writes not begun abort
        self.adding: str | None = None  # what a write in progress does ("adding 3000 entities"), for /health
        self.degraded: str | None = None  # why answers may not reflect the run on disk (e.g. a reload failed)

    def status(self) -> tuple[str, str | None]:
        """What the service can do once loaded: ``("ready", None)``, ``("adding", what)`` (answers go on, from
        the index as it was) or ``("degraded", why)`` (answers go on; the message says what is wrong)."""
        if self.degraded:
            return "degraded", self.degraded
        if self.adding:
            return "adding", self.adding
        return "ready", None

    @abstractmethod
    def load(self) -> None:
        """Load everything an answer needs (model, index …); called once, off the event loop, before the server
        reports ready."""

    @abstractmethod
    def routes(self, batcher: BatcherFactory) -> "APIRouter":
        """The task's endpoints (e.g. ``POST /predict``); ``batcher(fn)`` makes a dynamic batcher over ``fn``."""

    @abstractmethod
    def page(self) -> str:
        """The HTML page served at ``/`` (plain HTML and JavaScript, calling the routes)."""

    def info(self) -> dict[str, Any]:
        """Task facts for ``GET /info`` (counts, …)."""
        return {}

    # ------------------------------------------------------------ one truth between processes

    def disk_version(self) -> Any:
        """What the answers read on disk that another process may commit to (link prediction: the index's
        meta.json, replaced by every commit of an index); None: nothing (the default)."""
        return None

    def reload(self) -> bool:
        """Load what :meth:`disk_version` names as it is now, off the query path, and swap it in; False when a
        write of this server is in progress (the watch tries again)."""
        return True

    seen_version: Any = None  # the disk_version the answers come from

    def watch(self, stop: threading.Event, every: float = 1.0) -> None:
        """Until ``stop``: every ``every`` seconds, reload when another process committed to the run (a second
        server's add, ``kgc index --add``, a rebuild), so two servers on one run answer alike; a reload that fails
        leaves answers from the state as it was and says so on ``/health`` (degraded)."""
        import logging

        log = logging.getLogger("kgc.serve")
        self.seen_version = self.disk_version()
        while not stop.wait(every):
            now = self.disk_version()
            if now == self.seen_version or self.stopping.is_set():
                continue
            try:
                if self.reload():
                    log.info("reloaded: another process committed to %s", self.run.path)
                    self.degraded = None
            except Exception as exc:  # noqa: BLE001 — answers go on from what was loaded; /health says why
                log.exception("reloading %s after another process's commit failed", self.run.path)
                self.degraded = (f"another process changed {self.run.path} and loading it failed ({type(exc).__name__}:"
                                 f" {exc}); answers come from the run as it was. Restart the server.")
                self.seen_version = now  # not retried every second; a later commit is

    @abstractmethod
    def sample_requests(self, n: int, seed: int = 0) -> list[tuple[str, Any]]:
        """``n`` realistic requests ``(path, JSON body)`` from the run's own test data, for ``kgc bench serve``
        (needs the data only, not the model)."""


def wait_ready(url: str, proc, timeout: float, *, what: str = "kgc serve", see: str = "", poll: float = 0.2) -> float:
    """Seconds until ``url``'s ``/health`` says ready; a KGCError when ``proc`` (the server's process) exits first
    or ``timeout`` seconds pass (``see``: where its output is)."""
    import time

    import httpx

    from kgc.errors import KGCError

    start = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise KGCError(f"{what} stopped before it was ready (exit {proc.returncode}){'; ' + see if see else ''}")
        try:
            status = httpx.get(f"{url}/health", timeout=5).json().get("status")
        except (httpx.HTTPError, ValueError):
            status = None
        if status == "ready":
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise KGCError(f"{what} was not ready within {timeout:.0f}s{'; ' + see if see else ''}")
        time.sleep(poll)
