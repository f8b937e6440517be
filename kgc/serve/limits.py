"""What one ``kgc serve`` takes, declared once: :class:`ServeOptions` (where it listens, how it batches) and
:class:`Limits` (what it takes and how long it waits; ``GET /info``'s ``limits``). Their fields are ``kgc serve``'s
flags (:mod:`kgc.cli.common`'s ``ModelFlags``), their defaults and bounds the one statement of both."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_WAIT_MS = 5.0


class ServeOptions(BaseModel):
    """Where one ``kgc serve`` listens and how it batches (``kgc serve --host …``: these fields are its flags)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="interface to listen on (127.0.0.1: this machine only)")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0: any free one)")
    device: str = Field("auto", description="where the model runs: auto (the GPU when there is one), cpu, cuda")
    max_batch: int = Field(DEFAULT_MAX_BATCH, ge=1, description="queries answered in one forward pass")
    max_wait_ms: float = Field(DEFAULT_MAX_WAIT_MS, ge=0, description="how long a query waits for others to share "
                                                                       "its batch")
    threads: Optional[int] = Field(None, ge=1, description="torch threads for the model (default: torch's, every "
                                                           "core)")
    log_level: str = Field("info", description="uvicorn's and kgc's log level (debug, info, warning, error)")


MIB = 1 << 20  # the flags of the byte limits are in MiB (--max-body-mb)


class Limits(BaseModel):
    """What one server takes and how long it waits (``kgc serve --max-body-mb …``: these fields are its flags;
    ``GET /info`` lists them), after nginx's defaults: no client, slow or idle or not reading, costs more than
    bounded time and memory, and none can shut others out.

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

    model_config = ConfigDict(extra="forbid")

    max_body: int = Field(8 * MIB, ge=1024, json_schema_extra={"cli": {"flag": "--max-body-mb", "scale": MIB}},
                          description="largest request body taken (MiB; larger: 413)")
    body_timeout: float = Field(30.0, ge=0.1, description="seconds a whole request body may take to arrive (then "
                                                          "408)")
    head_timeout: float = Field(10.0, ge=0.1, description="seconds for a request's line and headers, from the "
                                                          "connection or the previous reply (then 408, closed)")
    max_connections: int = Field(1024, ge=1, description="connections open at once (more: 503, closed)")
    per_client: int = Field(64, ge=1, description="connections open at once from one address (more: 503, closed; "
                                                  "at most max_connections)")
    max_requests: int = Field(256, ge=1, description="requests answered at once (more: 503)")
    keep_alive: float = Field(5.0, ge=0.1, description="seconds a connection that sends nothing is kept open")
    send_timeout: float = Field(30.0, ge=0.1, description="seconds a client may take nothing of its reply (then "
                                                          "dropped)")
    max_header: int = Field(16 << 10, ge=1024, description="bytes of a request's line and headers (more: 400)")
    reply_budget: int = Field(32 * MIB, ge=MIB, json_schema_extra={"cli": {"flag": "--reply-budget-mb",
                                                                           "scale": MIB}},
                              description="replies waiting on clients that do not read, all together (MiB; past "
                                          "it, the connection stalled the longest is dropped)")
    grace: float = Field(10.0, ge=0, description="seconds requests in flight get on SIGTERM (those arriving "
                                                 "meanwhile: 503)")

    @model_validator(mode="after")
    def _per_client_within_all(self) -> "Limits":
        if self.per_client > self.max_connections:  # one client cannot take every connection
            object.__setattr__(self, "per_client", self.max_connections)
        return self

    def as_json(self) -> dict:
        return self.model_dump()


PIECE = 64 << 10  # a reply body goes to the transport in pieces of this many bytes
LINGER = 1.0  # seconds an idle connection stays open after SIGTERM, so a request already on its way gets a 503
