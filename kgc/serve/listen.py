"""``kgc serve``'s process: uvicorn's configuration with the guard (:func:`uvicorn_config`), the open-file limit,
and :func:`serve`, which listens until SIGINT/SIGTERM and ends with 0 after a clean stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from kgc.errors import KGCError, validated
from kgc.serve.app import create_app
from kgc.serve.guard import guarded_protocol, untested_versions
from kgc.serve.limits import Limits, ServeOptions
from kgc.serve.middleware import trusted_hosts_for

log = logging.getLogger("kgc.serve")


def _open_files_for(connections: int) -> None:
    """Raise this process's open-file limit (its soft one, up to the hard one) so ``connections`` sockets and the
    run's files fit: past it, accept() fails and uvicorn logs an error per connection."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def uvicorn_config(app, *, host: str, port: int, limits: Limits, log_level: str = "info"):
    """The uvicorn configuration of ``kgc serve`` for ``app``: h11 (it pauses reading a pipelining client until
    it has read its replies) with the guard of :func:`guarded_protocol`, whose caps replace uvicorn's
    ``limit_concurrency``."""
    import uvicorn

    _open_files_for(limits.max_connections)
    for release in untested_versions():
        log.warning("the connection guard subclasses uvicorn's H11Protocol and was tested with other releases than "
                    "%s; pip install kgc's pins (pyproject.toml) if connections misbehave", release)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=limits.grace, limit_concurrency=None,
                          timeout_keep_alive=limits.keep_alive, h11_max_incomplete_event_size=limits.max_header,
                          http=guarded_protocol(limits))


def serve(run_dir: str | Path, *, limits: Limits | dict | None = None, echo=print, **options) -> int:
    """Run the server until SIGINT/SIGTERM (``kgc serve``); 0 after a clean stop. ``options``: the fields of
    :class:`ServeOptions` (``host``, ``port``, ``device``, ``max_batch``, ``max_wait_ms``, ``threads``: torch's
    intra-op threads, default torch's own choice; ``log_level``), ``limits``: :class:`Limits` or its fields; a bad
    or unknown one is one KGCError naming it."""
    import uvicorn

    from kgc.training.task import open_run

    o = validated(ServeOptions, options)
    limits = limits if isinstance(limits, Limits) else validated(Limits, limits or {})
    host, port, log_level = o.host, o.port, o.log_level
    if o.threads is not None:
        import torch

        torch.set_num_threads(o.threads)
    # the event loop and the batcher's thread share the GIL: a shorter switch interval than Python's 5 ms keeps
    # the loop answering while the batcher runs Python (resolving names, building answers)
    sys.setswitchinterval(float(os.environ.get("KGC_SERVE_SWITCH_INTERVAL", "0.001")))

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s: %(message)s")
    run = open_run(run_dir, device=o.device, echo=lambda m: log.info(m))  # not a run: one KGCError, before listening
    failed: list[str] = []
    server: uvicorn.Server | None = None

    def stop(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    trusted = trusted_hosts_for(host)
    loopback = trusted is not None and "localhost" in trusted
    app = create_app(run, max_batch=o.max_batch, max_wait_ms=o.max_wait_ms, on_load_error=stop,
                     trusted_hosts=trusted, limits=limits)
    stopping = app.state.serving.stopping
    if not loopback:
        echo(f"warning: listening on {host}: any machine that reaches it may query the run and add entities to it "
             "(kgc serve has no authentication; put it behind a proxy that has)")
    config = uvicorn_config(app, host=host, port=port, limits=limits, log_level=log_level)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # SIGTERM/SIGINT: writes not yet begun are abandoned (503)
            stopping.set()
            super().handle_exit(sig, frame)

    server = Server(config)
    echo(f"serving {run.path} ({run.task}, {run.recipe.model.conditioner}) on http://{host}:{port}/ "
         f"(API: http://{host}:{port}/docs); loading the model …")
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler found before it
    # started: this one notes it, so a stop asked for ends with exit 0 instead of death by signal
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _frame: received.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise KGCError(failed[0])
    echo(f"stopped{f' ({signal.Signals(received[0]).name})' if received else ''}")
    return 0
