"""The service's ASGI middleware: answers only its own Host names (:class:`_TrustedHosts`), bounds request bodies
and the requests in flight (:class:`_LimitBodies`), and the JSON every error goes out as."""

from __future__ import annotations

import json
import threading
from typing import Any

from kgc.serve.limits import Limits

LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]


def _json_response():
    """JSONResponse whose body is always valid UTF-8 JSON: a lone surrogate a client sent (``"\\ud800"``) and a
    message repeats is written back as the same escape, never a 500 from the encoder."""
    from fastapi.responses import JSONResponse

    class SafeJSON(JSONResponse):
        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":")).encode("utf-8", "backslashreplace")

    return SafeJSON


async def _reply(send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """An ASGI reply of ``{"detail": detail}`` as JSON, before (or instead of) the app: every refusal here."""
    body = json.dumps({"detail": detail}).encode()
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})


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
        await _reply(send, 400, f"Invalid host header {_short(raw, 60)!r}: this server answers "
                                f"{', '.join(sorted(self.allowed))}")


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

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        stopping = (503, "the server is stopping; send the request again once it is back",
                    {"retry-after": "5", "connection": "close"})
        if self.stopping.is_set() and scope.get("path") != "/health":
            return await _reply(send, *stopping)
        body = await self._read_body(scope, receive, send)  # before a slot is taken: a slow body holds none
        if body is None:
            return  # answered (400, 408, 413), or the client left
        if self.stopping.is_set() and scope.get("path") != "/health":
            return await _reply(send, *stopping)
        if self.in_flight >= self.limits.max_requests:
            return await _reply(send, 503, f"this server is answering {self.limits.max_requests} requests, the "
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
                await _reply(send, 400, "Content-Length is not a number", {"connection": "close"})
                return None
            if declared > most:
                await _reply(send, 413, f"the request body has {declared:,} bytes; this server takes at most "
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
                await _reply(send, 408, f"the request body did not arrive within {self.limits.body_timeout:g}s",
                                  {"connection": "close"})
                return None
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > most:
                await _reply(send, 413, f"the request body passed {most:,} bytes, the most this server takes "
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
