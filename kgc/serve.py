"""``kgc serve RUN``: a trained run as a long-lived HTTP service (FastAPI + uvicorn).

The server is task-blind: the run's task hands it a :class:`kgc.training.serving.Serving` with its routes
(link prediction: ``POST /predict``, ``GET|POST /entities``, ``GET /relations``; C-STS: ``POST /similarity``) and
its page. The server adds

* ``GET /health`` — 200 ``{"status": "ready"}`` once the model and index are loaded (503 ``loading`` before;
  503 ``error`` with the message when loading failed);
* ``GET /info`` — run, task, dataset, conditioner, device, the test metrics of ``results.json``, batching counts;
* ``POST /explain`` — what ``kgc explain`` computes (a router's weight per token of a sentence under each condition,
  Hyper-CL's spectra); its body is the task's (:meth:`kgc.training.task.Task.explain_request`);
* ``GET /`` — the task's page; ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) — the OpenAPI pages, their scripts and
  styles served from the package (``kgc/static/apidocs``, with their licences), so they work offline.

Errors are JSON: a malformed body 422 (FastAPI's validation), an unknown name 404 with ``suggestions`` (and
``valid`` names for a relation), a run another writer holds 409, other bad input 400, the model still loading
503, and anything unexpected 500 — logged with its traceback, and the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kgc.batching import MicroBatcher
from kgc.errors import KGCError, RunBusy

log = logging.getLogger("kgc.serve")

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_WAIT_MS = 5.0


class Limits:
    """What one server takes (``kgc serve --max-body-mb …``): a body larger than ``max_body`` bytes is refused with
    413 before it is read (by its Content-Length) or as soon as it passes the limit (a chunked body); a body not
    received within ``body_timeout`` seconds is 408; at most ``max_connections`` connections and requests at once
    (more: 503, uvicorn's ``limit_concurrency``); an idle keep-alive connection is closed after ``keep_alive``
    seconds; a request head (line + headers) larger than ``max_header`` bytes is refused by the HTTP parser. A
    client that does not read its replies is not buffered for: uvicorn stops writing (and reading) that
    connection until it reads. SIGTERM: requests in flight get ``grace`` seconds."""

    def __init__(self, *, max_body: int = 8 << 20, body_timeout: float = 30.0, max_connections: int = 256,
                 keep_alive: float = 5.0, max_header: int = 16 << 10, grace: float = 10.0) -> None:
        self.max_body, self.body_timeout, self.max_connections = max_body, body_timeout, max_connections
        self.keep_alive, self.max_header, self.grace = keep_alive, max_header, grace

    def as_json(self) -> dict:
        return dict(vars(self))


def _json_response():
    """JSONResponse whose body is always valid UTF-8 JSON: a lone surrogate a client sent (``"\\ud800"``) and a
    message repeats is written back as the same escape, never a 500 from the encoder."""
    import json

    from fastapi.responses import JSONResponse

    class SafeJSON(JSONResponse):
        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":")).encode("utf-8", "backslashreplace")

    return SafeJSON


def _short(value: Any, most: int = 80) -> Any:
    """A value of an error location, shortened (a key of a megabyte is not echoed back)."""
    return value if not isinstance(value, str) or len(value) <= most else value[: most - 1] + "…"


class _TrustedHosts:
    """ASGI middleware: answers only requests whose Host header names this server (no DNS rebinding: a web page
    elsewhere cannot point a name at it and write into the run); any other gets a JSON 400, as every error here."""

    def __init__(self, app, *, allowed: list[str]) -> None:
        self.app, self.allowed = app, {h.lower() for h in allowed}

    @staticmethod
    def host_of(value: str) -> str:
        """``example.com:8000`` → ``example.com``, ``[::1]:8000`` → ``[::1]``."""
        value = value.strip().lower()
        if value.startswith("["):
            return value[: value.find("]") + 1] if "]" in value else value
        return value.rsplit(":", 1)[0] if value.count(":") == 1 else value

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        raw = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
        host = self.host_of(raw)
        if host in self.allowed:
            return await self.app(scope, receive, send)
        body = json.dumps({"detail": f"Invalid host header {_short(raw, 60)!r}: this server answers "
                                     f"{', '.join(sorted(self.allowed))}"}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def trusted_hosts_for(host: str) -> list[str] | None:
    """The Host headers a server bound to ``host`` answers: this machine's loopback names for a loopback address
    (127.0.0.0/8, ::1, localhost) plus the address itself; the bound name or address alone otherwise; None (every
    Host) for the wildcard addresses, whose names cannot be known (the server warns)."""
    import ipaddress

    if host in ("0.0.0.0", "::", ""):
        return None
    try:
        loop = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loop = host.lower() == "localhost"
    named = [host, f"[{host}]"] if ":" in host and not host.startswith("[") else [host]
    return list(dict.fromkeys((LOOPBACK_NAMES if loop else []) + named))


class _LimitBodies:
    """ASGI middleware: bounds request bodies (size, time) and answers 503 once the server is stopping."""

    def __init__(self, app, *, limits: Limits, stopping: threading.Event) -> None:
        self.app, self.limits, self.stopping = app, limits, stopping

    async def _reply(self, send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        import json

        body = json.dumps({"detail": detail}).encode()
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *extra]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        import asyncio

        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.stopping.is_set() and scope.get("path") != "/health":
            return await self._reply(send, 503, "the server is stopping; send the request again once it is back",
                                     {"retry-after": "5", "connection": "close"})
        most = self.limits.max_body
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await self._reply(send, 400, "Content-Length is not a number")
            if declared > most:
                return await self._reply(send, 413, f"the request body has {declared:,} bytes; this server takes at "
                                                    f"most {most:,} (kgc serve --max-body-mb). Split it into "
                                                    "smaller requests.", {"connection": "close"})
        received, complete, refused = 0, False, None  # refused: (status, detail) once the body broke a limit

        async def limited_receive():
            nonlocal received, complete, refused
            if complete or refused:  # the body is in: what follows is a disconnect, waited for without a limit
                return await receive() if not refused else {"type": "http.disconnect"}
            try:
                message = await asyncio.wait_for(receive(), self.limits.body_timeout)
            except asyncio.TimeoutError:
                refused = (408, f"the request body did not arrive within {self.limits.body_timeout:g}s")
                return {"type": "http.disconnect"}  # the app stops reading; the reply is ours
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > most:
                    refused = (413, f"the request body passed {most:,} bytes, the most this server takes (kgc "
                                    "serve --max-body-mb). Split it into smaller requests.")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if refused is None:
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if refused is None:
                raise
        if refused is not None:
            await self._reply(send, *refused, {"connection": "close"})


class _State:
    """Loading state and the batchers of one app."""

    def __init__(self) -> None:
        self.status, self.error, self.loaded_seconds = "loading", None, None
        self.batchers: list[MicroBatcher] = []
        self.started = time.time()


LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]

# Swagger UI and ReDoc, vendored from npm (swagger-ui-dist, redoc; versions and licences in its README.md): FastAPI's
# own /docs and /redoc load them from a CDN, and are blank offline
APIDOCS = Path(__file__).parent / "static" / "apidocs"
APIDOCS_URL = "/static/apidocs"
SWAGGER_JS, SWAGGER_CSS = "swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css"
REDOC_JS, FAVICON = "redoc/redoc.standalone.js", "swagger-ui/favicon-32x32.png"


def _add_api_docs(app) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with every script, style and icon from :data:`APIDOCS` (no
    request leaves the server: no CDN, no web fonts, no online validator)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles

    app.mount(APIDOCS_URL, StaticFiles(directory=APIDOCS), name="apidocs")
    openapi, assets = app.openapi_url, APIDOCS_URL + "/"  # paths from the server's root, as the task's pages use

    @app.get("/docs", include_in_schema=False)
    def swagger_ui():
        return get_swagger_ui_html(openapi_url=openapi, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=assets + SWAGGER_JS, swagger_css_url=assets + SWAGGER_CSS,
                                   swagger_favicon_url=assets + FAVICON,
                                   oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
                                   swagger_ui_parameters={"validatorUrl": None})  # no badge from swagger.io

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    def swagger_ui_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc():
        return get_redoc_html(openapi_url=openapi, title=f"{app.title} - ReDoc", redoc_js_url=assets + REDOC_JS,
                              redoc_favicon_url=assets + FAVICON, with_google_fonts=False)


def create_app(run: Any, *, max_batch: int = DEFAULT_MAX_BATCH, max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
               load_in_background: bool = True, on_load_error=None, trusted_hosts: list[str] | None = None,
               limits: Limits | None = None):
    """The FastAPI app serving ``run`` (a loaded :class:`kgc.training.run.Run`, e.g. ``kgc.load(RUN)``).

    ``trusted_hosts``: the Host headers answered (others get 400), e.g. :data:`LOOPBACK_NAMES` for a server on
    127.0.0.1 — a web page elsewhere cannot then reach it by a DNS name that resolves to this machine (DNS
    rebinding) and write into the run through ``POST /entities``. None: every host.

    The model and index load in a background thread when the app starts (``load_in_background``; otherwise
    before it answers anything); ``on_load_error(message)`` is called if that fails (``kgc serve`` stops)."""
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
        except Exception as exc:  # noqa: BLE001 — reported on /health and in the log
            log.exception("loading %s failed", run.path)
            state.status, state.error = "error", f"{type(exc).__name__}: {exc}"
        else:
            state.status, state.loaded_seconds = "ready", round(time.perf_counter() - start, 2)
            log.info("ready: %s loaded in %.1fs", run.path, state.loaded_seconds)
        if state.error is not None:
            log.error("error: %s", state.error)
            if on_load_error is not None:
                on_load_error(state.error)

    @asynccontextmanager
    async def lifespan(app):
        if load_in_background:
            threading.Thread(target=load, name="kgc-load", daemon=True).start()
        else:
            load()
        yield
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


def serve(run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          max_batch: int = DEFAULT_MAX_BATCH, max_wait_ms: float = DEFAULT_MAX_WAIT_MS, log_level: str = "info",
          threads: int | None = None, limits: Limits | dict | None = None, echo=print) -> int:
    """Run the server until SIGINT/SIGTERM (``kgc serve``); 0 after a clean stop, 2 when the run could not be
    loaded (the message is printed). ``threads``: torch's intra-op threads (default: torch's own choice)."""
    import uvicorn

    from kgc.training.task import open_run

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    # the event loop and the batcher's thread share the GIL: a shorter switch interval than Python's 5 ms keeps
    # the loop answering while the batcher runs Python (resolving names, building answers)
    sys.setswitchinterval(float(os.environ.get("KGC_SERVE_SWITCH_INTERVAL", "0.001")))

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s: %(message)s")
    run = open_run(run_dir, device=device, echo=lambda m: log.info(m))  # not a run: one KGCError, before listening
    failed: list[str] = []
    server: uvicorn.Server | None = None

    def stop(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    trusted = trusted_hosts_for(host)
    loopback = trusted is not None and "localhost" in trusted
    limits = Limits(**limits) if isinstance(limits, dict) else limits or Limits()
    app = create_app(run, max_batch=max_batch, max_wait_ms=max_wait_ms, on_load_error=stop,
                     trusted_hosts=trusted, limits=limits)
    stopping = app.state.serving.stopping
    if not loopback:
        echo(f"warning: listening on {host}: any machine that reaches it may query the run and add entities to it "
             "(kgc serve has no authentication; put it behind a proxy that has)")
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=limits.grace, limit_concurrency=limits.max_connections,
                            timeout_keep_alive=limits.keep_alive, h11_max_incomplete_event_size=limits.max_header,
                            http="h11")  # h11 pauses reading a pipelining client until it has read its replies

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
