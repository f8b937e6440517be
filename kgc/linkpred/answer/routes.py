"""``kgc serve`` for a link-prediction run: ``POST /predict`` (dynamically batched), ``GET /entities`` (name search),
``POST /entities`` (add entities, as ``kgc index --add``), ``GET /relations`` and the page at ``/``.

Answers are :meth:`LinkPredRun.answer_many`'s — the same code path as ``kgc predict`` — so a query answered
alone, in a batch, from the page or from the shell gives the same entities, and scores equal up to float rounding
(a batch pads its texts to one length; near-ties may then swap places).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import re
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kgc.data.graph import nfc
from kgc.errors import KGCError, ServiceStopping
from kgc.fileio import pid_alive, write_text
from kgc.linkpred.index.added import MAX_DESCRIPTION, MAX_ID, MAX_NAME
from kgc.linkpred.answer.query import QueryOptions
from kgc.training.routes import BatcherFactory, Serving

if TYPE_CHECKING:
    from fastapi import APIRouter

    from kgc.linkpred.answer.topk import Query

log = logging.getLogger("kgc.serve")


MAX_QUERIES = 1024  # per request
MAX_TOP_K = 1000  # answers per query from the server (Python and the CLI ask for any number)
MAX_ANSWERS = 20_000  # the sum of top_k over a request's queries: one response stays small
MAX_TEXT = 10_000  # characters of a head or relation (a head is cut to data.max_tokens tokens anyway)


class PredictQuery(QueryOptions):
    """(head, relation, ?) — or (?, relation, head) with ``inverse`` — and the question's options
    (:class:`~kgc.linkpred.answer.query.QueryOptions`), ``top_k`` at most :data:`MAX_TOP_K` here."""
    head: str = Field(..., min_length=1, max_length=MAX_TEXT,
                      description="entity id, name or text; or free text with free_text")
    relation: str = Field(..., min_length=1, max_length=MAX_TEXT, description="relation name or text")

    @field_validator("top_k")
    @classmethod
    def _server_limit(cls, v: int) -> int:
        if v > MAX_TOP_K:
            raise ValueError(f"top_k={v}: the server answers at most {MAX_TOP_K} per query")
        return v

    def options(self) -> dict[str, Any]:
        """The question's :class:`QueryOptions`, as keyword arguments."""
        return self.model_dump(include=set(QueryOptions.model_fields))


class NewEntityBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., min_length=1, max_length=MAX_ID)
    name: str = Field(..., min_length=1, max_length=MAX_NAME)
    description: str = Field("", max_length=MAX_DESCRIPTION)

    @field_validator("id", "name", "description")
    @classmethod
    def one_line(cls, v: str) -> str:
        if "\t" in v or "\n" in v or "\r" in v:
            raise ValueError("tabs and line breaks are not allowed")
        if any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError("control characters are not allowed")
        return v.strip()


class AddBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entities: List[NewEntityBody] = Field(..., min_length=1, max_length=10_000)


class QueryError(KGCError):
    """A bad query among several: the message names its position."""

    def __init__(self, position: int, error: KGCError) -> None:
        super().__init__(f"query {position}: {error}")
        self.position, self.error = position, error
        for attr in ("kind", "name", "suggestions", "valid"):
            if hasattr(error, attr):
                setattr(self, attr, getattr(error, attr))


PREFIX_ENTITIES = 200_000  # above this, /entities searches sorted names by bisection, not every name per request


class _LazyPrefixes:
    """A :class:`~kgc.data.spelling.Prefixes` of ``graph``, built on a thread at once (so the server starts without
    waiting for it); a search before it is ready waits."""

    def __init__(self, graph) -> None:
        self._ready = threading.Event()
        self._value = None
        threading.Thread(target=self._build, args=(graph,), daemon=True, name="kgc-prefixes").start()

    def _build(self, graph) -> None:
        from kgc.data.spelling import Prefixes

        try:
            self._value = Prefixes(graph.names, graph.entities)
        finally:
            self._ready.set()

    def find(self, prefix: str, limit: int) -> list[int]:
        self._ready.wait()
        return self._value.find(prefix, limit) if self._value is not None else []


SERVICE_PREFIX = ".serve-"  # RUN/.serve-PID-XXXX/: a server's temporary folder (the TSV of a POST /entities)


def sweep_service_folders(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary folders that servers no longer alive left in ``run_dir`` (a killed one's); returns
    them. A live server's (its pid runs on this machine) is left alone."""
    import shutil

    gone = []
    for folder in Path(run_dir).glob(SERVICE_PREFIX + "*"):
        pid = folder.name[len(SERVICE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder)
    return gone


class LinkPredServing(Serving):
    def __init__(self, run) -> None:  # a LinkPredRun (its module imports this one)
        super().__init__(run)
        self._names: list[tuple[str, str, int]] = []  # (lower-case name, lower-case id, row) for /entities
        self._prefixes: "_LazyPrefixes | None" = None  # instead of _names, for a graph of millions
        self._add_gate = threading.Lock()  # one add at a time

    # ------------------------------------------------------------ loading

    def load(self) -> None:
        sweep_service_folders(self.run.path)
        with self.lock:
            self._warm()
            self.run.predictor.graph().held_out_keys  # noqa: B018 — built before ready (known_split)
            cache = self.run.predictor.model().layer_cache
            if cache is not None:  # the frozen layers' cache answers the texts it holds; new ones are not kept
                cache.store = False

    def _warm(self) -> None:
        self._names, self._prefixes = self._warmed(self.run)

    @staticmethod
    def _warmed(run) -> "tuple[list[tuple[str, str, int]], Any]":
        """Load what answers read in ``run`` — model, index, added entities, query engine, the graph's known
        answers — so that no request pays for it; returns what /entities searches: the name list, or for a graph
        of more than :data:`PREFIX_ENTITIES` entities a :class:`~kgc.data.spelling.Prefixes` of the sorted names
        and ids (built on a thread after the start) and the word index behind "did you mean" (before ready)."""
        _, graph, _ = run.entities.searcher(progress=False)  # the index is built first when missing or stale
        run.entities.query_engine()
        graph.all_answers  # noqa: B018 — the filter of every query's known answers, built once
        graph._exact_names  # noqa: B018 — heads by name (seconds at millions of names): before ready, not on a request
        if graph.num_entities > PREFIX_ENTITIES:
            # "did you mean" from its first request: the word index beside the graph cache (read in milliseconds;
            # built here, before ready, when the graph has no cache)
            graph._name_index  # noqa: B018
            return [], _LazyPrefixes(graph)
        return [(n.lower(), e.lower(), i) for i, (n, e) in enumerate(zip(graph.names, graph.entities))], None

    def info(self) -> dict[str, Any]:
        model = self.run.predictor.model()
        _, graph, _ = self.run.entities.searcher()
        return {"entities": graph.num_entities, "added_entities": graph.num_entities - self.run.predictor.graph().num_entities,
                "relations": self.run.predictor.graph().num_relations,
                "query_engine": self.run.entities.query_engine() is not None,
                "explainable": model.conditioner.explain_kind is not None,
                "precision": model.precision_choice.record()}  # what the queries are encoded in here

    # ------------------------------------------------------------ work

    def _answer(self, items: list[PredictQuery]) -> "list[bytes | BaseException]":
        """One batch, on the batcher's thread: each query resolved (a bad name is that query's own error), all
        answered in one forward pass and one index search, each encoded as JSON — so a request costs the event
        loop only its parsing and its reply. A batch that fails is answered query by query, so one bad query
        cannot fail the others."""
        with self.lock:
            out: list = [None] * len(items)
            todo: list[tuple[int, "Query"]] = []
            for i, q in enumerate(items):
                try:
                    todo.append((i, self.resolve_one(q)))
                except KGCError as exc:
                    out[i] = exc
            try:
                answers = self.run.answer_many([q for _, q in todo])
                records = self.run.answer_records([q for _, q in todo], answers)
                for (i, _), rec in zip(todo, records):
                    out[i] = self._encode(rec)
            except Exception:  # noqa: BLE001
                if len(todo) == 1:
                    raise
                for i, q in todo:
                    try:
                        out[i] = self._encode(self.run.answer_records([q], self.run.answer_many([q]))[0])
                    except Exception as exc:  # noqa: BLE001 — that query's own error, reported to it alone
                        out[i] = exc
            return out

    @staticmethod
    def _encode(record: dict) -> bytes:
        """A reply (:meth:`LinkPredRun.answer_records`: the fields of ``kgc predict --json``) as UTF-8 JSON."""
        return json.dumps(record, ensure_ascii=False).encode("utf-8", "backslashreplace")

    def resolve_one(self, q: PredictQuery) -> "Query":
        return self.run.resolve(q.head, q.relation, note=False, **q.options())

    def search_names(self, q: str, limit: int) -> list[dict]:
        """Entities whose name or id starts with ``q`` (case-insensitive), then those that contain it."""
        _, graph, _ = self.run.entities.searcher()
        key = nfc(q).strip().lower()
        if not key:
            return []
        if self._prefixes is not None:  # millions of names: sorted once, searched by bisection (no "contains")
            hits = self._prefixes.find(key, limit)
            return [{"id": graph.entities[i], "name": graph.names[i], "text": graph.full_texts[i]} for i in hits]
        starts, contains = [], []
        for name, ent, i in self._names:
            if name.startswith(key) or ent.startswith(key):
                starts.append(i)
            elif key in name:
                contains.append(i)
            if len(starts) >= limit:
                break
        return [{"id": graph.entities[i], "name": graph.names[i], "text": graph.full_texts[i]}
                for i in (starts + contains)[:limit]]

    ADD_BATCH = 16  # entities embedded per step of an add: a query waits for at most one step

    def add(self, rows: list[dict]) -> dict:
        """Append entities to the index as ``kgc index --add`` does, off the query path: embedded in small steps
        that alternate with query batches (a query waits for one step, not for the add), committed as one
        transaction (under the run's lock), then the new index is loaded beside the old one and swapped in at once.
        Queries meanwhile are answered from the index as it was. One add at a time (another gets 409). Asked to
        stop (SIGTERM) before its commit, it is abandoned (503, nothing changed); after it, it is reported done."""
        from kgc.errors import RunBusy
        from kgc.linkpred.index.added import NewEntity, tsv

        if not self._add_gate.acquire(blocking=False):
            raise RunBusy(f"{self.adding or 'another add'} is in progress; send this request again when GET /health "
                          "no longer says adding")
        try:
            self.adding = f"adding {len(rows)} entities"
            # the request as the file `kgc index --add` reads, in this server's own folder in the run (a killed
            # server's is swept by the next one that loads the run: sweep_service_folders)
            with tempfile.TemporaryDirectory(prefix=f"{SERVICE_PREFIX}{os.getpid()}-", dir=self.run.path) as tmp:
                path = Path(tmp) / f"POST-entities-{time.strftime('%Y%m%dT%H%M%S')}.tsv"
                try:
                    write_text(path, tsv([NewEntity(r["id"], r["name"], r.get("description", "")) for r in rows]))
                    meta = self.run.add_entities(path, progress=False, guard=self._step, batch_size=self.ADD_BATCH,
                                                 keep_loaded=True)
                except KGCError as exc:  # name the entity of the request, not the temporary file's line
                    exc.args = (re.sub(re.escape(str(path)) + r":(\d+)",
                                       lambda m: f"POST /entities, entities[{int(m.group(1)) - 1}]",
                                       str(exc)).replace(str(path), "POST /entities"),)
                    raise
            if meta.get("already"):  # the same entities again (a retried request): nothing changed
                return {"added": 0, "entities": meta["entities"], "ids": [nfc(r["id"].strip()) for r in rows],
                        "note": "these entities are in the index already, as they are; nothing was changed"}
            # committed: whatever happens now, the reply says the entities were added (they are, on disk)
            try:
                self._swap_in()
            except Exception as exc:  # noqa: BLE001 — answers go on from the old index; /health says why
                log.exception("reloading the index after POST /entities failed")
                self.degraded = (f"{len(rows)} entities were added to the run, but loading its new index failed "
                                 f"({type(exc).__name__}: {exc}); answers come from the index as it was. Restart "
                                 "the server.")
            return {"added": len(rows), "entities": meta["entities"], "ids": [nfc(r["id"].strip()) for r in rows]}
        finally:
            self.adding = None
            self._add_gate.release()

    @contextlib.contextmanager
    def _step(self):
        """One step of an add: abandoned when the server is stopping; run under the model's lock, so query batches
        and steps take turns."""
        from kgc.fileio import fault

        if self.stopping.is_set():
            raise ServiceStopping("the server is stopping: the entities were not added (nothing was changed); send "
                                  "them again once it is back")
        fault("step")  # tests: KGC_FAULT=slow:MS makes each step last MS milliseconds longer
        with self.lock:
            yield
        time.sleep(0.0005)  # hand the lock to a waiting batch

    def disk_version(self) -> "tuple[int, int, int] | None":
        """The index's meta.json as stat sees it (every commit of an index replaces it: a new inode and time)."""
        try:
            st = os.stat(Path(self.run.path) / "index" / "meta.json")
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def reload(self) -> bool:
        if not self._add_gate.acquire(blocking=False):
            return False  # this server's own add: it swaps in what it committed
        try:
            self._swap_in()
        finally:
            self._add_gate.release()
        return True

    def _swap_in(self) -> None:
        """Load the index as it is now on disk beside the one in use (queries go on), then swap it in at once."""
        self.seen_version = self.disk_version()  # read first: a commit after it is seen by the next watch
        fork = copy.copy(self.run)  # shares the run's predictor (model, graph), none of its index state
        fork.entities = self.run.entities.fork()
        names, prefixes = self._warmed(fork)  # before the swap, not by the first query after it
        with self.lock:
            self.run.entities = fork.entities  # one assignment, ordered with queries by the lock
            self._names, self._prefixes = names, prefixes

    def sample_requests(self, n: int, seed: int = 0) -> list[tuple[str, Any]]:
        """Test triples in both directions, shuffled: ``POST /predict`` of (head id, relation label, inverse)."""
        import numpy as np

        graph = self.run.predictor.graph()
        split = "test" if len(graph.splits["test"]) else "train"
        q = graph.both_directions(split)
        order = np.random.default_rng(seed).permutation(len(q))
        rels = graph.num_relations
        return [("/predict", {"head": graph.entities[int(q[i, 0])], "relation": graph.relations[int(q[i, 1]) % rels],
                              "inverse": bool(q[i, 1] >= rels)})
                for i in (order[j % len(order)] for j in range(n))]

    # ------------------------------------------------------------ routes

    def routes(self, batcher: BatcherFactory) -> "APIRouter":
        from fastapi import APIRouter, Body, Query as Param, Response

        answers = batcher(self._answer)

        router = APIRouter(tags=["link prediction"])

        @router.post("/predict", summary="Top-k answers to one query or a list of them (batched with other requests)",
                     response_class=Response)
        async def predict(body: Union[PredictQuery, Annotated[List[PredictQuery], Field(max_length=MAX_QUERIES)]]
                          = Body(...)):
            many = isinstance(body, list)
            items = body if many else [body]
            if sum(q.top_k for q in items) > MAX_ANSWERS:
                raise KGCError(f"{sum(q.top_k for q in items):,} answers asked in one request (the sum of top_k): "
                               f"ask for at most {MAX_ANSWERS:,}, or split the request")
            futures = answers.submit_many(items)
            done = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
            for i, r in enumerate(done):
                if isinstance(r, BaseException):
                    raise (QueryError(i, r) if many and isinstance(r, KGCError) else r)
            return Response(b"[" + b",".join(done) + b"]" if many else done[0], media_type="application/json")

        @router.get("/entities", summary="Entities whose name or id starts with (then contains) q")
        def entities(q: str = Param("", description="what was typed"), limit: int = Param(10, ge=1, le=100)):
            return self.search_names(q, limit)

        @router.post("/entities", summary="Add entities to the index (as `kgc index --add`), no retraining")
        def add_entities(body: AddBody) -> dict:
            return self.add([e.model_dump() for e in body.entities])

        @router.get("/relations", summary="Every relation: label and text")
        def relations() -> list[dict]:
            graph = self.run.predictor.graph()
            return [{"relation": graph.relations[r], "text": graph.relation_texts[r]}
                    for r in range(graph.num_relations)]

        return router

    def page(self) -> str:
        return resources.files("kgc.linkpred").joinpath("page.html").read_text(encoding="utf-8")
