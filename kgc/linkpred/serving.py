"""``kgc serve`` for a link-prediction run: ``POST /predict`` (dynamically batched), ``GET /entities`` (name search),
``POST /entities`` (add entities, as ``kgc index --add``), ``GET /relations`` and the page at ``/``.

Answers are :meth:`LinkPredRun.answer_many`'s — the same code path as ``kgc predict`` — so a query answered
alone, in a batch, from the page or from the shell gives the same entities, and scores equal up to float rounding
(a batch pads its texts to one length; near-ties may then swap places).
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kgc.errors import KGCError
from kgc.training.serving import BatcherFactory, Serving

if TYPE_CHECKING:
    from fastapi import APIRouter

    from kgc.linkpred.predict import Answers, Query

MAX_QUERIES = 1024  # per request
MAX_TOP_K = 1000
MAX_ANSWERS = 20_000  # the sum of top_k over a request's queries: one response stays small
MAX_TEXT = 10_000  # characters of a head or relation (a head is cut to data.max_tokens tokens anyway)


class PredictQuery(BaseModel):
    """(head, relation, ?) — or (?, relation, head) with ``inverse``."""
    model_config = ConfigDict(extra="forbid")
    head: str = Field(..., min_length=1, max_length=MAX_TEXT,
                      description="entity id, name or text; or free text with free_text")
    relation: str = Field(..., min_length=1, max_length=MAX_TEXT, description="relation name or text")
    top_k: int = Field(10, ge=1, le=MAX_TOP_K)
    inverse: bool = Field(False, description="ask (?, relation, head)")
    filter_known: bool = Field(False, description="leave out answers the graph already has")
    include_head: bool = Field(False, description="keep the head itself among the answers")
    free_text: bool = Field(False, description="embed a head that names no entity as text, even when it "
                                               "is close to an entity's name")


class NewEntityBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., min_length=1)
    name: str = Field(..., min_length=1)
    description: str = ""

    @field_validator("id", "name", "description")
    @classmethod
    def one_line(cls, v: str) -> str:
        if "\t" in v or "\n" in v or "\r" in v:
            raise ValueError("tabs and line breaks are not allowed")
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


class LinkPredServing(Serving):
    def __init__(self, run) -> None:  # a LinkPredRun (its module imports this one)
        super().__init__(run)
        self._names: list[tuple[str, str, int]] = []  # (lower-case name, lower-case id, row) for /entities

    # ------------------------------------------------------------ loading

    def load(self) -> None:
        with self.lock:
            self._warm()
            cache = self.run.model().layer_cache
            if cache is not None:  # the frozen layers' cache answers the texts it holds; new ones are not kept
                cache.store = False

    def _warm(self) -> None:
        """Load what answers read — model, index, added entities, query engine, the graph's known answers — so
        that no request pays for it (after POST /entities too)."""
        _, graph, _ = self.run.searcher(progress=False)  # the index is built first when missing or stale
        self.run.query_engine()
        graph.all_answers  # noqa: B018 — the filter of every query's known answers, built once
        self._names = [(n.lower(), e.lower(), i) for i, (n, e) in enumerate(zip(graph.names, graph.entities))]

    def info(self) -> dict[str, Any]:
        model = self.run.model()
        _, graph, _ = self.run.searcher()
        return {"entities": graph.num_entities, "added_entities": graph.num_entities - self.run.graph().num_entities,
                "relations": self.run.graph().num_relations,
                "query_engine": self.run.query_engine() is not None,
                "explainable": model.conditioner.explain_kind is not None}

    # ------------------------------------------------------------ work

    def _answer(self, items: list[dict]) -> "list[bytes | BaseException]":
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
                for (i, _), a in zip(todo, self.run.answer_many([q for _, q in todo])):
                    out[i] = self._encode(a)
            except Exception:  # noqa: BLE001
                if len(todo) == 1:
                    raise
                for i, q in todo:
                    try:
                        out[i] = self._encode(self.run.answer_many([q])[0])
                    except Exception as exc:  # noqa: BLE001 — that query's own error, reported to it alone
                        out[i] = exc
            return out

    @staticmethod
    def _encode(a: "Answers") -> bytes:
        return json.dumps(a.to_json(), ensure_ascii=False).encode()

    def resolve_one(self, q: dict) -> "Query":
        return self.run.resolve(q["head"], q["relation"], q["top_k"], inverse=q["inverse"],
                                filter_known=q["filter_known"], include_head=q["include_head"],
                                free_text=q["free_text"], note=False)

    def search_names(self, q: str, limit: int) -> list[dict]:
        """Entities whose name or id starts with ``q`` (case-insensitive), then those that contain it."""
        _, graph, _ = self.run.searcher()
        key = q.strip().lower()
        if not key:
            return []
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

    def add(self, rows: list[dict]) -> dict:
        """Append entities to the index as ``kgc index --add`` does (under the run's lock, persisted atomically)."""
        from kgc.linkpred.added import NewEntity, tsv

        with tempfile.TemporaryDirectory(prefix="kgc-serve-") as tmp:
            path = Path(tmp) / f"POST-entities-{time.strftime('%Y%m%dT%H%M%S')}.tsv"
            path.write_text(tsv([NewEntity(r["id"], r["name"], r.get("description", "")) for r in rows]),
                            encoding="utf-8")
            with self.lock:
                try:
                    meta = self.run.add_entities(path, progress=False)
                except KGCError as exc:  # name the entity of the request, not the temporary file's line
                    exc.args = (re.sub(re.escape(str(path)) + r":(\d+)",
                                       lambda m: f"POST /entities, entities[{int(m.group(1)) - 1}]",
                                       str(exc)).replace(str(path), "POST /entities"),)
                    raise
                finally:
                    self._warm()  # the new index (or, after a failure, the one on disk), loaded before answering
        return {"added": len(rows), "entities": meta["entities"], "ids": [r["id"] for r in rows]}

    def sample_requests(self, n: int, seed: int = 0) -> list[tuple[str, Any]]:
        """Test triples in both directions, shuffled: ``POST /predict`` of (head id, relation label, inverse)."""
        import numpy as np

        graph = self.run.graph()
        split = "test" if len(graph.splits["test"]) else "train"
        q = graph.both_directions(split)
        order = np.random.default_rng(seed).permutation(len(q))
        rels = graph.num_relations
        return [("/predict", {"head": graph.entities[int(q[i, 0])], "relation": graph.relations[int(q[i, 1]) % rels],
                              "inverse": bool(q[i, 1] >= rels), "top_k": 10})
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
            futures = answers.submit_many([q.model_dump() for q in items])
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
            graph = self.run.graph()
            return [{"relation": graph.relations[r], "text": graph.relation_texts[r]}
                    for r in range(graph.num_relations)]

        return router

    def page(self) -> str:
        return resources.files("kgc.linkpred").joinpath("page.html").read_text(encoding="utf-8")
