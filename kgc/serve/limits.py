"""What one ``kgc serve`` takes and how long it waits: :class:`Limits` (its flags, ``GET /info``'s ``limits``) and
the batching defaults."""

from __future__ import annotations

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
