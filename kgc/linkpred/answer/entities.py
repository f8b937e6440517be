"""The entity index of a run, as a loaded run holds it: its files in ``RUN/index`` (built, rebuilt, updated and
extended through the store, :mod:`kgc.linkpred.index.store`), whether they are fresh for the run's model and added
entities, what is read from them once — the search structure with the graph and TextBank of the added entities,
the exact table, the query engine over it — and the device the search runs on, decided here once.

What it reads it keeps until the files change under it (a build, an add): then it forgets it, and the next
question reads the files again. :meth:`EntityIndex.fork` is the same index with nothing read yet, to load the new
files beside the ones in use (``kgc serve`` after an add) and swap it in at once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from kgc.fileio import run_lock

if TYPE_CHECKING:
    from kgc.data.graph import KnowledgeGraph
    from kgc.data.texts import TextBank
    from kgc.linkpred.index.types import SearchIndex
    from kgc.linkpred.model import LinkPredictor, QueryEngine
    from kgc.training.run import RunDir


class EntityIndex:
    """``RUN/index`` for one run. ``model``, ``graph``, ``tokenizer``: the run's loaders (each loads once), called
    only when the index needs them; ``batch_size``: the query engine's (``eval.batch_size``)."""

    def __init__(self, run: "RunDir", device: torch.device, *, model: "Callable[[], LinkPredictor]",
                 graph: "Callable[[], KnowledgeGraph]", tokenizer: Callable[[], Any], batch_size: int,
                 echo: Callable[[str], None]) -> None:
        self.dir, self.device, self.batch_size, self.echo = run, device, batch_size, echo
        self._model, self._graph, self._tokenizer = model, graph, tokenizer
        self._lock = threading.RLock()  # kgc serve asks from several threads: what is read once, is read by one
        self._search: tuple | None = None
        self._table: torch.Tensor | None = None
        self._engine: list = []  # [QueryEngine or None] once decided

    def faiss_device(self, *, deep: bool = False) -> str:
        """Where the index searches — and is built: the CPU for a run on the CPU, and for a ``deep`` search (an
        evaluation ranks within the top K plus every known answer; FAISS on a GPU returns at most 2048 hits per
        query), else the GPU when there is one (``auto``). The one place this is decided: building, answering and
        evaluating within the index all ask here."""
        return "cpu" if deep or self.device.type == "cpu" else "auto"

    def fork(self) -> "EntityIndex":
        """This index with nothing read yet (same run, same loaders)."""
        return EntityIndex(self.dir, self.device, model=self._model, graph=self._graph, tokenizer=self._tokenizer,
                           batch_size=self.batch_size, echo=self.echo)

    def forget(self) -> None:
        """Drop what was read from the files (they changed): the next question reads them again."""
        with self._lock:
            self._search, self._table, self._engine = None, None, []

    # ------------------------------------------------------------ freshness

    def stale_reason(self) -> str | None:
        """Why the index cannot serve the run's model (missing, stale, damaged), or None when it is fresh."""
        from kgc.linkpred.index.store import stale_reason

        return stale_reason(self.dir, self._model())

    def ensure(self, *, progress: bool = True) -> None:
        """Build the index when the run has none, and rebuild it when it is stale or damaged (added entities are
        kept), holding the run's lock (another process building it meanwhile is a KGCError naming it). A fresh index
        is only read: a run folder that cannot be written serves answers as long as its index is fresh."""
        from kgc.linkpred.index.records import stored_config
        from kgc.linkpred.index.store import NO_INDEX, rebuild_index

        if self.stale_reason() is None:
            return
        with run_lock(self.dir.path, "building the index"):
            reason = self.stale_reason()  # again, under the lock: another process may have built it
            if reason is not None:
                path = self.dir.path
                self.echo(f"{path} has no index yet: building it (every entity embedded once)"
                          if reason == NO_INDEX else f"rebuilding the index of {path}: {reason}")
                # a stale index keeps its type and parameters (an ivf index built with `kgc index --type ivf` stays ivf)
                config = None if reason == NO_INDEX else stored_config(self.dir)
                meta = rebuild_index(self.dir, self._model(), self._graph(), progress=progress, config=config,
                                     faiss_device=self.faiss_device())
                if meta.get("note"):
                    self.echo(meta.pop("note"))
                self.echo(f"indexed {meta['entities']} entities in {meta.get('seconds', '?')}s → {self.dir.index}")
        self.forget()

    # ------------------------------------------------------------ what is read from it

    def open(self, *, deep: bool = False):
        """The fresh index as stored, on :meth:`faiss_device`, read now (not kept); a missing or stale one is a
        KGCError that says how to build it (an evaluation never builds one)."""
        from kgc.linkpred.index.store import load_index

        return load_index(self.dir, self._model(), faiss_device=self.faiss_device(deep=deep))

    def searcher(self, *, progress: bool = False) -> "tuple[SearchIndex, KnowledgeGraph, TextBank]":
        """(index, graph with added entities, TextBank over it), the index built first when missing or stale;
        read once."""
        found = self._search
        if found is not None:
            return found
        with self._lock:
            if self._search is None:
                from kgc.linkpred.index.store import added_graph

                self.ensure(progress=progress)
                model, graph = self._model(), self._graph()
                full = added_graph(self.dir, graph)
                bank = model.bank if full is graph else model.bank.extended(full, self._tokenizer())
                self._search = (self.open(), full, bank)
            return self._search

    def loaded(self) -> tuple | None:
        """:meth:`searcher`'s answer when it was read already, else None (reads nothing)."""
        return self._search

    def table(self) -> torch.Tensor:
        """(index rows, dim): every entity's embedding as the index holds it (the run's graph, then the added
        entities), the index built first when missing or stale; read once, for the query engine and fused scores
        alike (a flat index on the CPU is this table already: shared, not read twice)."""
        with self._lock:
            if self._table is None:
                from kgc.linkpred.index.store import load_embeddings
                from kgc.linkpred.index.types import ExactIndex

                index = self.searcher()[0]
                if isinstance(index, ExactIndex) and index.device.type == "cpu":
                    self._table = index.table
                else:
                    self._table = torch.from_numpy(load_embeddings(self.dir, self._model(), added=True))
            return self._table

    def embeddings(self) -> torch.Tensor | None:
        """(graph entities, dim) from the index when it is fresh (a stale one is a KGCError), None when there is
        none: what an evaluation scores against instead of embedding every entity again."""
        from kgc.linkpred.index.store import load_embeddings

        cached = load_embeddings(self.dir, self._model())
        return None if cached is None else torch.from_numpy(cached)

    def params(self) -> dict:
        """The fresh index's type and parameters plus ``exact`` (results.json's record of a search)."""
        from kgc.linkpred.index.store import index_params

        return index_params(self.dir, self._model())

    def query_engine(self) -> "QueryEngine | None":
        """A QueryEngine over the run's entities when it costs nothing to build — a pooled conditioner (tri-encoders,
        Hyper-CL) whose towers are shared borrows the index's embeddings as the heads' sentence states, so a query
        about a known head runs only the conditioner's composition, no encoder pass (as ``kgc evaluate`` does).
        None for the others: they encode the head's text per query."""
        with self._lock:
            if not self._engine:
                from kgc.linkpred.model import QueryEngine

                model, engine = self._model(), None
                if (model.conditioner.enters_at == "pooled" and model.query_encoder is model.tail_encoder
                        and model.tail_map is None):  # with a tail map, entity vectors are not the sentence states
                    engine = QueryEngine(model, batch_size=self.batch_size,
                                         entity_table=self.table()[: self._graph().num_entities])
                self._engine = [engine]
            return self._engine[0]

    # ------------------------------------------------------------ changing the files

    def update(self, *, type: str | None = None, force: bool = False, progress: bool = True,
               nproc: int | None = None, chunk_size: int | None = None, **params: int | None) -> dict:
        """``kgc index``: build, update or keep the index; ``{"action": "none" | "search" | "build", "why", "meta"}``
        (see :meth:`kgc.linkpred.answer.run.LinkPredRun.index`). ``nproc`` > 1 (or under torchrun): a table to encode
        is encoded in shards by that many processes (``chunk_size`` entities per chunk file;
        :mod:`kgc.linkpred.answer.sharded`), and the answer adds ``shards`` (each rank's report); a torchrun rank > 0
        answers ``{"action": "follow", …}``."""
        from kgc.linkpred.answer.sharded import Shards

        shards = Shards.open(self.dir, nproc, chunk_size=chunk_size)
        if shards is None:
            return self._update(type, force, progress, params)
        with shards:
            if not shards.leads:
                return shards.follow()
            return {**self._update(type, force, progress, params, embed=shards.encode), "shards": shards.reports}

    def _update(self, type: str | None, force: bool, progress: bool, params: dict, embed=None) -> dict:
        from kgc.linkpred.index.records import DamagedMeta, stored_config
        from kgc.linkpred.index.store import index_plan, rebuild_index, update_search_params
        from kgc.linkpred.index.types import index_config
        from kgc.training.run import read_json

        # an existing index keeps its type and build parameters (`kgc index RUN --nprobe 64` on an ivf index, or
        # a rebuild after retraining, must not turn it back into the recipe's type); `type` starts from the recipe
        damaged = None
        try:
            stored = stored_config(self.dir) if type is None else None
        except DamagedMeta as exc:  # --force repairs it (the recipe's type then), anything else says so
            if not force:
                raise
            stored, damaged = None, exc.why
        if stored is not None and params.get("nlist") is not None and params.get("train_size") is None:
            stored = stored.model_copy(update={"train_size": None})  # its train_size was 64·(old nlist)
        config = index_config(stored if stored is not None else self.dir.recipe.index, type=type, **params)
        model = self._model()  # bad options stopped above, before the model is loaded
        if damaged is not None:
            action, why = "build", f"meta.json is damaged ({damaged}): rebuilt as the recipe's index says"
        else:
            action, why = index_plan(self.dir, model, config)
        if force:
            action = "build"
        if action == "none":
            meta = read_json(self.dir.index / "meta.json", f"Rebuild it with `kgc index {self.dir.path} --force`.")
        elif action == "search":
            meta = update_search_params(self.dir, model, config)
        else:
            meta = rebuild_index(self.dir, model, self._graph(), progress=progress, config=config,
                                 reuse_embeddings=not force, faiss_device=self.faiss_device(), embed=embed)
        self.forget()
        note = meta.pop("note", None) if isinstance(meta, dict) else None  # where the added entities came from
        return {"action": action, "why": why, "meta": meta, **({"note": note} if note else {})}

    def drop_added(self, *, progress: bool = True) -> dict:
        """``kgc index --drop-added``: the index rebuilt without its added entities (type and parameters kept),
        their list and copies of record removed (:func:`kgc.linkpred.index.store.drop_added`)."""
        from kgc.linkpred.index.records import DamagedMeta, stored_config
        from kgc.linkpred.index.store import drop_added

        try:
            config = stored_config(self.dir)
        except DamagedMeta:
            config = None  # the recipe's
        try:
            return drop_added(self.dir, self._model(), progress=progress, config=config,
                              faiss_device=self.faiss_device())
        finally:
            self.forget()

    def add(self, path: str | Path, *, progress: bool = True, guard=None, batch_size: int, keep_loaded: bool) -> dict:
        """``kgc index --add``: the entities of ``path`` embedded and appended (the index built first if missing or
        stale), under the run's lock; ``keep_loaded``: keep what was read (the caller swaps in a :meth:`fork`)."""
        from kgc.linkpred.index.store import add_entities

        try:
            with run_lock(self.dir.path, "adding entities to the index"):  # the build (if any) and the add, as one
                self.ensure(progress=progress)
                return add_entities(self.dir, self._model(), self._graph(), path, batch_size=batch_size,
                                    progress=progress, guard=guard)
        finally:  # the index on disk changed (or may have, if the add failed half-way)
            if not keep_loaded:
                self.forget()
