"""``kgc serve RUN``: a trained run as a long-lived HTTP service (FastAPI + uvicorn).

The server is task-blind: the run's task hands it a :class:`kgc.training.routes.Serving` with its routes
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

import contextlib
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
    """What one server takes and how long it waits (``kgc serve --max-body-mb …``; ``GET /info`` lists them), after
    nginx's defaults: no client, slow or idle or not reading, costs more than bounded time and memory, and none can
    shut others out.

    * ``max_body``: a larger request body is 413, before it is read (by its Content-Length) or as soon as it
      passes the limit (a chunked body);
    * ``body_timeout``: the whole body must arrive within it, counted from its request head (not per read:
      a byte every few seconds does not keep it open), else 408;
    * ``head_timeout``: the request line and headers must arrive within it, from the connection's accept or the
      end of its previous reply (nginx's ``client_header_timeout``), else 408 and closed;
    * ``keep_alive``: a connection that sends nothing for this long, from its accept or its previous reply, is
      closed;
    * ``max_connections``: connections open at once, ``per_client``: from one address at once (more: 503 and
      closed at once; the per-client cap is below the global one, so one client cannot take them all); an idle
      or half-sent connection does not count against ``max_requests``, the requests in flight at once (more: 503);
    * ``max_header``: a request head larger than this many bytes is refused by the HTTP parser;
    * ``send_timeout``: a reply the client takes nothing of for this long is dropped (the connection closed);
      ``reply_budget``: the bytes of replies waiting on clients that do not read, all together; past it, the
      connection stalled the longest is dropped first;
    * ``grace``: on SIGTERM, requests in flight get this long; requests that arrive meanwhile on open
      connections are answered 503, never reset.
    """

    def __init__(self, *, max_body: int = 8 << 20, body_timeout: float = 30.0, max_connections: int = 1024,
                 keep_alive: float = 5.0, max_header: int = 16 << 10, grace: float = 10.0, head_timeout: float = 10.0,
                 per_client: int = 64, send_timeout: float = 30.0, reply_budget: int = 32 << 20,
                 max_requests: int = 256) -> None:
        self.max_body, self.body_timeout, self.max_connections = max_body, body_timeout, max_connections
        self.max_requests = max_requests
        self.keep_alive, self.max_header, self.grace = keep_alive, max_header, grace
        self.head_timeout, self.per_client = head_timeout, min(per_client, max_connections)
        self.send_timeout, self.reply_budget = send_timeout, reply_budget

    def as_json(self) -> dict:
        return dict(vars(self))


PIECE = 64 << 10  # a reply body goes to the transport in pieces of this many bytes
LINGER = 1.0  # seconds an idle connection stays open after SIGTERM, so a request already on its way gets a 503


def guarded_protocol(limits: Limits):
    """uvicorn's h11 protocol with the deadlines and caps of :class:`Limits` that an ASGI middleware cannot see
    (they act before a request exists, or after its reply was handed over): the head and idle deadlines from
    accept, the per-client cap, the body deadline as a backstop for bodies no route reads, the send deadline and the
    budget of unread replies, and SIGTERM's 503 for requests that arrive on open connections. Pass it as uvicorn's
    ``http``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    def _json(status: int, reason: bytes, detail: str, extra: bytes = b"") -> bytes:
        body = json.dumps({"detail": detail}).encode()
        return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%sconnection: close"
                b"\r\n\r\n" % (status, reason, len(body), extra) + body)

    class GuardedH11(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline: Any = None
            self._send_timer: Any = None
            self._stalled_at: float | None = None
            self._seen_cycle = None
            self._pending = 0  # bytes of the reply body being sent
            self._quiet_since = self.loop.time()  # since when it has had no request being answered
            host = self.client[0] if self.client else None
            full = None
            if self._over(None, limits.max_connections) and not self._evict(None):
                full = f"this server has {limits.max_connections} connections open, the most it takes (kgc serve " \
                       "--max-connections), each answering a request; try again shortly"
            elif host is not None and self._over(host, limits.per_client) and not self._evict(host):
                full = f"{host} has {limits.per_client} connections open to this server, each answering a request, " \
                       "the most one client may (kgc serve --per-client); reuse them (keep-alive) or close some"
            if full is not None:
                transport.write(_json(503, b"Service Unavailable", full, b"retry-after: 1\r\n"))
                transport.close()
                return
            # idle from accept: uvicorn arms its keep-alive timer only after a first reply
            self.timeout_keep_alive_task = self.loop.call_later(limits.keep_alive, self.timeout_keep_alive_handler)
            self._arm(limits.head_timeout)

        def send_400_response(self, msg: str) -> None:  # h11 refused the bytes (a bad or too long head): JSON too
            body = json.dumps({"detail": f"{msg.rstrip('.')}: not a valid HTTP/1.1 request (its request line or "
                                         f"headers; at most {limits.max_header:,} bytes of them)"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                       (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # h11 cannot answer in the state it is in: written as bytes
                self.transport.write(_json(400, b"Bad Request", json.loads(body)["detail"]))
            self.transport.close()

        # -- the caps: past one, the connection waiting the longest (idle, or its head or body still arriving)
        #    makes room; only connections that are all answering requests refuse a new one
        def _over(self, host: str | None, most: int) -> bool:
            others = [c for c in self.connections if c is not self and not c.transport.is_closing()
                      and (host is None or (getattr(c, "client", None) and c.client[0] == host))]
            return len(others) + 1 > most

        def _waiting(self) -> bool:
            if self.transport.is_closing() or not hasattr(self, "_quiet_since"):
                return False
            if self.cycle is None or self.cycle.response_complete:
                return True  # idle, or half a head
            return self.conn.their_state is h11.SEND_BODY  # its body is still arriving: no slot taken yet

        def _evict(self, host: str | None) -> bool:
            waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedH11) and c._waiting()
                       and (host is None or (c.client and c.client[0] == host))]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c._quiet_since)
            log.debug("closed %s, waiting since %.1fs, to make room for %s", oldest.client,
                      self.loop.time() - oldest._quiet_since, self.client)
            oldest.transport.close()
            return True

        # -- the request deadline: its head from accept (or the previous reply), its body from its head
        def _arm(self, seconds: float) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._deadline_passed)

        def _deadline_passed(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            busy = self.cycle is not None and not self.cycle.response_complete
            if busy and self.conn.their_state is not h11.SEND_BODY:
                return  # the request is in: the route answers it
            if not busy and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(_json(408, b"Request Timeout", "the request line and headers did not arrive "
                                                                     f"within {limits.head_timeout:g}s"))
            self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._seen_cycle:  # a new request's head arrived
                self._seen_cycle = self.cycle
                self._arm(limits.body_timeout + 2)  # the middleware answers 408 at body_timeout; this closes
                self.cycle.send = self._counted(self.cycle, self.cycle.send)  # its task starts after this returns

        def _counted(self, cycle, send):
            """The cycle's send, handing a body to the transport in pieces (a piece is written once the previous
            ones are taken, so the transport never copies a whole reply) and noting the bytes of the reply held
            for the client meanwhile (the app's body stays alive until its last piece is taken)."""
            async def counted(message) -> None:
                body = message.get("body", b"") if message["type"] == "http.response.body" else b""
                if len(body) <= PIECE:
                    return await send(message)
                self._pending, view, more = len(body), memoryview(body), message.get("more_body", False)
                try:
                    for at in range(0, len(body), PIECE):
                        last = at + PIECE >= len(body)
                        await send({"type": "http.response.body", "body": bytes(view[at:at + PIECE]),
                                    "more_body": more or not last})
                        if cycle.disconnected:
                            return
                finally:
                    self._pending = 0
                    view.release()
            return counted

        def _held(self) -> int:
            return self.transport.get_write_buffer_size() + self._pending

        def on_response_complete(self) -> None:
            answered = self.cycle
            super().on_response_complete()  # may start a pipelined request (handle_events arms its deadline)
            if self.cycle is answered and not self.transport.is_closing():
                self._quiet_since = self.loop.time()
                self._arm(limits.head_timeout)  # the next head, or the rest of a body no route read

        def connection_lost(self, exc) -> None:
            for timer in (self._deadline, self._send_timer):
                if timer is not None:
                    timer.cancel()
            self._stalled_at = None
            super().connection_lost(exc)

        # -- replies the client does not read
        def pause_writing(self) -> None:
            super().pause_writing()
            self._stalled_at = self.loop.time()
            self._send_timer = self.loop.call_later(limits.send_timeout, self._drop)
            stalled = sorted((c for c in self.connections if getattr(c, "_stalled_at", None) is not None),
                             key=lambda c: c._stalled_at)
            held = sum(c._held() for c in stalled)
            for c in stalled:  # the longest stalled first, until what is held fits the budget
                if held <= limits.reply_budget:
                    break
                held -= c._held()
                c._drop()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stalled_at = None
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _drop(self) -> None:
            self._stalled_at = None
            if not self.transport.is_closing():
                log.debug("dropped %s: it did not read its reply", self.client)
            self.transport.abort()  # its unsent bytes are freed now

        # -- SIGTERM: an idle connection lingers a moment, so a request already on its way is answered 503
        def shutdown(self) -> None:
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self._unset_keepalive_if_required()
                if self._deadline is not None:
                    self._deadline.cancel()
                self._deadline = self.loop.call_later(LINGER, self._linger_end)
            else:
                super().shutdown()

        def _linger_end(self) -> None:
            self._deadline = None
            if self.cycle is None or self.cycle.response_complete:
                super().shutdown()

    return GuardedH11


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
    """ASGI middleware: bounds request bodies (size, time) and the requests in flight, and answers 503 once the
    server is stopping."""

    def __init__(self, app, *, limits: Limits, stopping: threading.Event) -> None:
        self.app, self.limits, self.stopping = app, limits, stopping
        self.in_flight = 0  # requests being answered (the event loop's thread alone counts them)

    async def _reply(self, send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        import json

        body = json.dumps({"detail": detail}).encode()
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *extra]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        stopping = (503, "the server is stopping; send the request again once it is back",
                    {"retry-after": "5", "connection": "close"})
        if self.stopping.is_set() and scope.get("path") != "/health":
            return await self._reply(send, *stopping)
        body = await self._read_body(scope, receive, send)  # before a slot is taken: a slow body holds none
        if body is None:
            return  # answered (400, 408, 413), or the client left
        if self.stopping.is_set() and scope.get("path") != "/health":
            return await self._reply(send, *stopping)
        if self.in_flight >= self.limits.max_requests:
            return await self._reply(send, 503, f"this server is answering {self.limits.max_requests} requests, the "
                                                "most it takes at once (kgc serve --max-requests); try again shortly",
                                     {"retry-after": "1"})
        self.in_flight += 1
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1

    async def _read_body(self, scope, receive, send) -> bytes | None:
        """The whole request body, read within the body deadline and size (the app gets it at once, so a request
        holds a slot only from its last byte); None when it was refused (answered here) or the client left."""
        import asyncio

        most = self.limits.max_body
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await self._reply(send, 400, "Content-Length is not a number", {"connection": "close"})
                return None
            if declared > most:
                await self._reply(send, 413, f"the request body has {declared:,} bytes; this server takes at most "
                                             f"{most:,} (kgc serve --max-body-mb). Split it into smaller requests.",
                                  {"connection": "close"})
                return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout  # the whole body, from its head: not per read
        chunks, received = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await self._reply(send, 408, f"the request body did not arrive within {self.limits.body_timeout:g}s",
                                  {"connection": "close"})
                return None
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > most:
                await self._reply(send, 413, f"the request body passed {most:,} bytes, the most this server takes "
                                             "(kgc serve --max-body-mb). Split it into smaller requests.",
                                  {"connection": "close"})
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive):
    """An ASGI ``receive`` that hands the body read already as one message, then waits on the connection (for
    its disconnect) as the original does."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


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
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=limits.grace, limit_concurrency=None,
                          timeout_keep_alive=limits.keep_alive, h11_max_incomplete_event_size=limits.max_header,
                          http=guarded_protocol(limits))


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
