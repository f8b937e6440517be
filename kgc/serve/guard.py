"""The connection guard: uvicorn's h11 protocol (``H11Protocol``) with the deadlines and caps of
:class:`~kgc.serve.limits.Limits` that an ASGI middleware cannot see. It subclasses a class of uvicorn's that is not
its documented surface, so pyproject.toml pins uvicorn (and h11, whose events and states it drives) to the
releases the tests prove it with, :data:`TESTED` names them, and a server started beside another release warns,
naming it (:func:`untested_versions`; tests/test_serve_guard.py fails on one)."""

from __future__ import annotations

import json
import logging
from typing import Any

from kgc.serve.limits import LINGER, PIECE, Limits

log = logging.getLogger("kgc.serve")

TESTED = {"uvicorn": "0.54", "h11": "0.16"}  # the minor releases the guard's tests ran on (pyproject.toml's pins)


def untested_versions() -> list[str]:
    """The installed uvicorn / h11 releases outside :data:`TESTED`, each as 'uvicorn 0.55.0 (tested: 0.54)'."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name, minor in TESTED.items():
        try:
            got = version(name)
        except PackageNotFoundError:
            continue
        if got != minor and not got.startswith(minor + "."):
            out.append(f"{name} {got} (tested: {minor})")
    return out


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
            detail = (f"{msg.rstrip('.')}: not a valid HTTP/1.1 request (its request line or headers; at most "
                      f"{limits.max_header:,} bytes of them)")
            body = json.dumps({"detail": detail}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                       (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # h11 cannot answer in the state it is in: written as bytes
                self.transport.write(_json(400, b"Bad Request", detail))
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
