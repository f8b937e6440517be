"""The FastAPI app of one run (:func:`create_app`): the task's routes and page, ``/health``, ``/info``,
``/explain``, the error handlers, the model loaded in the background and other processes' commits watched."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kgc.batching import MicroBatcher
from kgc.errors import KGCError, RunBusy
from kgc.serve.apidocs import _add_api_docs
from kgc.serve.limits import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_MS, Limits
from kgc.serve.middleware import _json_response, _LimitBodies, _short, _TrustedHosts

log = logging.getLogger("kgc.serve")


class _State:
    """Loading state and the batchers of one app."""

    def __init__(self) -> None:
        self.status, self.error, self.loaded_seconds = "loading", None, None
        self.batchers: list[MicroBatcher] = []
        self.started = time.time()


def create_app(run: Any, *, max_batch: int = DEFAULT_MAX_BATCH, max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
               load_in_background: bool = True, on_load_error=None, trusted_hosts: list[str] | None = None,
               limits: Limits | None = None, watch_seconds: float = 1.0):
    """The FastAPI app serving ``run`` (a loaded :class:`kgc.training.run.Run`, e.g. ``kgc.load(RUN)``).

    ``trusted_hosts``: the Host headers answered (others get 400), e.g. :data:`LOOPBACK_NAMES` for a server on
    127.0.0.1 — a web page elsewhere cannot then reach it by a DNS name that resolves to this machine (DNS
    rebinding) and write into the run through ``POST /entities``. None: every host.

    The model and index load in a background thread when the app starts (``load_in_background``; otherwise
    before it answers anything); ``on_load_error(message)`` is called if that fails (``kgc serve`` stops). Then
    every ``watch_seconds`` (0: never) the server looks for a commit another process made to the run (a second
    server's add, ``kgc index --add``) and loads it off the query path (:meth:`Serving.watch`)."""
    from fastapi import Body, Depends, FastAPI, HTTPException, Request
    from fastapi.responses import HTMLResponse

    JSONResponse = _json_response()

    from fastapi.exceptions import RequestValidationError

    from kgc.errors import DiskFull, ServiceStopping
    from kgc.training.task import task_class

    task = task_class(run.task)  # what differs between tasks: asked of it, never branched on here
    serving = run.serving()
    state = _State()
    limits = limits or Limits()

    def batcher(fn) -> MicroBatcher:
        b = MicroBatcher(fn, max_batch=max_batch, max_wait_ms=max_wait_ms)
        state.batchers.append(b)
        return b

    def load() -> None:
        start = time.perf_counter()
        try:
            serving.load()
        except KGCError as exc:
            state.status, state.error = "error", str(exc)
        except Exception as exc:
            log.exception("loading %s failed", run.path)
            state.status, state.error = "error", f"{type(exc).__name__}: {exc}"
        else:
            state.status, state.loaded_seconds = "ready", round(time.perf_counter() - start, 2)
            log.info("ready: %s loaded in %.1fs", run.path, state.loaded_seconds)
        if state.error is not None:
            log.error("error: %s", state.error)
            if on_load_error is not None:
                on_load_error(state.error)

    watch_stop = threading.Event()

    def load_and_watch() -> None:
        load()
        if state.status == "ready" and watch_seconds:
            serving.watch(watch_stop, every=watch_seconds)  # another process's commits, off the query path

    @asynccontextmanager
    async def lifespan(app):
        if load_in_background:
            threading.Thread(target=load_and_watch, name="kgc-load", daemon=True).start()
        else:
            load()
            if state.status == "ready" and watch_seconds:
                threading.Thread(target=serving.watch, args=(watch_stop, watch_seconds), name="kgc-watch",
                                 daemon=True).start()
        yield
        watch_stop.set()
        for b in state.batchers:
            b.close()

    app = FastAPI(title="kgc serve", lifespan=lifespan, default_response_class=JSONResponse, docs_url=None,
                  redoc_url=None,  # both served from the package below (_add_api_docs): they work offline
                  description=f"{run.task} run `{run.path}` ({run.recipe.model.conditioner}). "
                              "Answers are batched across concurrent requests.")
    app.state.kgc = state
    _add_api_docs(app)
    app.state.serving = serving
    app.state.limits = limits
    if trusted_hosts is not None:
        app.add_middleware(_TrustedHosts, allowed=list(trusted_hosts))
    app.add_middleware(_LimitBodies, limits=limits, stopping=serving.stopping)

    async def require_ready() -> None:  # async: FastAPI would run a plain function on its threadpool
        if state.status != "ready":
            detail = "the model is still loading; retry when GET /health says ready" if state.status == "loading" \
                else f"the run could not be loaded: {state.error}"
            raise HTTPException(503, detail, headers={"Retry-After": "2"} if state.status == "loading" else None)

    @app.exception_handler(KGCError)
    async def bad_input(request: Request, exc: KGCError):
        body: dict[str, Any] = {"detail": str(exc)}
        for attr in ("kind", "name", "suggestions", "valid", "position"):
            if getattr(exc, attr, None) is not None:
                body[attr] = getattr(exc, attr)
        unknown = getattr(exc, "suggestions", None) is not None or getattr(exc, "valid", None) is not None
        status = (409 if isinstance(exc, RunBusy) else 507 if isinstance(exc, DiskFull)  # 409: another writer
                  else 503 if isinstance(exc, ServiceStopping) else 404 if unknown else 400)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        """422 with where and why — never the input itself (a 100 MB body is not sent back)."""
        errors = [{"loc": [_short(x) for x in e.get("loc", ())], "msg": _short(str(e.get("msg", "")), 300),
                   "type": e.get("type")} for e in exc.errors()[:20]]
        return JSONResponse({"detail": errors, **({"more": len(exc.errors()) - 20} if len(exc.errors()) > 20
                                                   else {})}, status_code=422)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    @app.get("/health", tags=["service"], summary="what the service can do: ready, adding, degraded (200: it "
                                                 "answers); loading, error, stopping (503)")
    def health():
        status, detail = state.status, state.error
        if serving.stopping.is_set():
            status, detail = "stopping", "the server is stopping"
        elif status == "ready":
            status, detail = serving.status()
        body = {"status": status}
        if detail:
            body["detail"] = detail
        if state.loaded_seconds is not None:
            body["loaded_seconds"] = state.loaded_seconds
        return JSONResponse(body, status_code=200 if status in ("ready", "adding", "degraded") else 503)

    @app.get("/info", tags=["service"], summary="the run: dataset, conditioner, test metrics, batching counts")
    def info():
        rec = run.recipe
        out: dict[str, Any] = {"run": str(run.path), "task": run.task, "status": state.status,
                               "limits": limits.as_json(),
                               "dataset": rec.data.path or rec.data.dataset, "conditioner": rec.model.conditioner,
                               "backbone": rec.model.backbone, "device": str(run.device),
                               "threads": _torch_threads(),
                               "batching": {"max_batch": max_batch, "max_wait_ms": max_wait_ms,
                                            **_batch_stats(state.batchers)}}
        results = Path(run.path) / "results.json"
        if results.is_file():
            try:
                import json

                out["test"] = task.headline(json.loads(results.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                out["test"] = None
        if state.status == "ready":
            out.update(serving.info())
        return out

    request = task.explain_request()  # the body's fields: the keywords of the run's explain_inputs
    if request is not None:
        def explain(body=Body(...)):
            from kgc.explain import explain as explain_inputs

            with serving.lock:
                inputs = run.explain_inputs(**body.model_dump())
                ex, title = explain_inputs(inputs)
            return {**ex.to_json(), "title": title}

        explain.__annotations__["body"] = request  # the task's model, for validation and the OpenAPI schema
        app.post("/explain", tags=["service"], dependencies=[Depends(require_ready)],
                 summary="what a condition selects (kgc explain): router weights, spectra")(explain)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page():
        return serving.page()

    @app.get("/kgc.js", include_in_schema=False)
    def page_script():  # what every task's page shares (kgc/page.js)
        from importlib import resources

        from fastapi.responses import Response

        return Response(resources.files("kgc").joinpath("page.js").read_text(encoding="utf-8"),
                        media_type="text/javascript")

    app.include_router(serving.routes(batcher), dependencies=[Depends(require_ready)])
    return app


def _torch_threads() -> int | None:
    import sys

    torch = sys.modules.get("torch")  # loaded with the model; not imported here for it
    return None if torch is None else torch.get_num_threads()


def _batch_stats(batchers: list[MicroBatcher]) -> dict:
    batches = sum(b.stats["batches"] for b in batchers)
    items = sum(b.stats["items"] for b in batchers)
    return {"batches": batches, "items": items, "mean_batch": round(items / batches, 2) if batches else None,
            "largest": max((b.stats["largest"] for b in batchers), default=0)}
