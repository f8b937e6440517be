"""A link-prediction run, as ``kgc.load`` returns it: the run-level verbs (evaluate, predict, index, add
entities, train the structural model, embed) over the library's parts.

State kept on the run is loaded once and never swapped: the model over the run's own graph, the tokenizer, and —
once an answer needs the index — the index with the graph and TextBank extended by added entities, passed
explicitly to whatever encodes with them. An operation that changes the index on disk forgets the cached one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from kgc.errors import KGCError, UnknownName
from kgc.fileio import Transaction, run_lock, tsv_text
from kgc.linkpred.predict import Answers, Query
from kgc.training.run import CHECKPOINTS, ExplainInputs, Run, RunDir, as_list, silent

if TYPE_CHECKING:
    import pandas as pd

    from kgc.data.graph import KnowledgeGraph
    from kgc.linkpred.model import LinkPredictor
    from kgc.linkpred.ranking import Evaluation

def find_latest_run(root: str | Path = "runs") -> Path:
    """The link-prediction run under ``root`` (searched recursively) whose weights were written last.

    A run directory holds ``recipe.yaml`` and ``best.pt`` or ``checkpoints/last.pt``; runs of other tasks are
    skipped, and a run still training (``checkpoints/last.pt`` only) counts only when no other has weights."""
    import yaml

    root = Path(root)
    found = []
    if root.is_dir():
        for recipe in root.rglob("recipe.yaml"):
            folder = recipe.parent
            mtime = RunDir.weights_mtime(folder)
            if mtime is None:
                continue
            try:
                tree = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if isinstance(tree, dict) and tree.get("task", LinkPredRun.task) == LinkPredRun.task:
                found.append(((folder / CHECKPOINTS[0]).is_file(), mtime, str(folder), folder))
    if not found:
        raise KGCError(f"no trained link-prediction run under {root.resolve()} (a folder with recipe.yaml and "
                       "best.pt or checkpoints/last.pt). Train one with `kgc train RECIPE` (e.g. "
                       "`kgc train recipes/umls_biencoder.yaml`), or name the run: `kgc predict RUN_DIR …`.")
    return max(found)[3]


class LinkPredRun(Run):
    """A link-prediction run: ``evaluate`` / ``evaluation``, ``predict`` / ``answer``, ``index``, ``add_entities``,
    ``train_structure``, ``embed_entities``, ``embed_queries``."""

    task = "linkpred"
    command = "kgc predict RUN --head … --relation …"

    def __init__(self, path: str | Path | RunDir, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._loaded: dict[str, Any] = {}
        # what is loaded once is loaded by one thread (kgc serve asks from several), and forgotten under it too
        self._loading = threading.RLock()

    # ------------------------------------------------------------ loading, once

    def graph(self) -> "KnowledgeGraph":
        """The run's own dataset."""
        if "graph" not in self._loaded:
            from kgc.data.graph import load_graph

            d = self.recipe.data
            self._loaded["graph"] = load_graph(d.dataset, path=d.path, long_text=d.long_text)
        return self._loaded["graph"]

    def model_for(self, graph: "KnowledgeGraph") -> "LinkPredictor":
        """The trained towers with a TextBank over ``graph`` (the weights do not depend on the graph), in eval mode
        on the run's device: a new model for every call."""
        from kgc.linkpred.model import build_model

        model, _ = build_model(self.recipe, graph, self.dir.backbone, pretrained=self.dir.pretrained)
        self.dir.load_weights(model)
        model.attach_layer_cache(self.recipe)
        return model.to(self.device).eval()

    def model(self) -> "LinkPredictor":
        """The trained model over the run's own graph, loaded once."""
        if "model" not in self._loaded:
            self._loaded["model"] = self.model_for(self.graph())
        return self._loaded["model"]

    def tokenizer(self):
        if "tokenizer" not in self._loaded:
            from kgc.encoding.backbone import load_tokenizer

            self._loaded["tokenizer"] = load_tokenizer(self.dir.backbone)
        return self._loaded["tokenizer"]

    def ensure_index(self, *, progress: bool = True) -> None:
        """Build the run's index when it has none, and rebuild it when it is stale or damaged (added entities are
        kept), holding the run's lock (another process building it meanwhile is a KGCError naming it). A fresh index
        is only read: a run folder that cannot be written serves answers as long as its index is fresh."""
        from kgc.linkpred.index import NO_INDEX, rebuild_index, stale_reason, stored_config

        model = self.model()
        if stale_reason(self.dir, model) is None:
            return
        with run_lock(self.path, "building the index"):
            reason = stale_reason(self.dir, model)  # again, under the lock: another process may have built it
            if reason is not None:
                self.echo(f"{self.path} has no index yet: building it (every entity embedded once)"
                          if reason == NO_INDEX else f"rebuilding the index of {self.path}: {reason}")
                # a stale index keeps its type and parameters (an ivf index built with `kgc index --type ivf`
                # stays ivf)
                config = None if reason == NO_INDEX else stored_config(self.dir)
                meta = rebuild_index(self.dir, model, self.graph(), progress=progress, config=config)
                self.echo(f"indexed {meta['entities']} entities in {meta.get('seconds', '?')}s → {self.dir.index}")
        self._forget_index()

    def searcher(self, *, progress: bool = False):
        """(FAISS index, graph with added entities, TextBank over it), the index built first when missing or
        stale; loaded once."""
        found = self._loaded.get("search")
        if found is not None:
            return found
        with self._loading:
            if "search" not in self._loaded:
                from kgc.linkpred.index import added_graph, load_index

                self.ensure_index(progress=progress)
                model = self.model()
                index = load_index(self.dir, model, faiss_device="cpu" if self.device.type == "cpu" else "auto")
                full = added_graph(self.dir, self.graph())
                bank = model.bank if full is self.graph() else model.bank.extended(full, self.tokenizer())
                self._loaded["search"] = (index, full, bank)
            return self._loaded["search"]

    def _forget_index(self) -> None:
        with self._loading:
            for key in ("search", "engine", "fused", "table"):
                self._loaded.pop(key, None)

    def _entity_table(self, model) -> torch.Tensor | None:
        """(entities, dim) from the run's index when it is fresh (a stale one is an error), else None."""
        from kgc.linkpred.index import load_embeddings

        cached = load_embeddings(self.dir, model)
        return None if cached is None else torch.from_numpy(cached)

    # ------------------------------------------------------------ evaluation

    def evaluation(self, split: str | None = None, *, batch_size: int | None = None, rerank: bool | None = None,
                   progress: bool = False, entities_from: str | Path | None = None, candidates: str | None = None,
                   use_index: bool = False, top_k: int | None = None, text_only: bool = False) -> "Evaluation":
        """Filtered ranks of ``split`` (test or dev), both directions, in PyKEEN's layout: ``.results``
        (``results["both"]["realistic"]["inverse_harmonic_mean_rank"]`` and a ``"kgc"`` block), ``.ranks``,
        ``.seconds``; ``results[.split].json`` and ``ranks[.split].tsv`` are written into the run.

        A run with a structural model ranks by the fused score (α chosen on dev). ``entities_from`` (a KG-BERT
        folder, e.g. from ``kgc data inductive-split``) ranks its ``split`` triples over its own entities, unseen
        in training — ``candidates`` ``"split"`` (the entities of the split's triples, SimKGC's protocol) or
        ``"all"`` — into ``results.inductive[.split].json``; ``use_index`` ranks within the top ``top_k`` (100)
        of the run's FAISS index, re-scored exactly. ``text_only``: a run with a structural model ranked by its
        text model alone, as a run without one is (its ``eval.rerank`` applies), into ``results.text[.split].json``
        — the fused results stay."""
        from kgc.linkpred.evaluate import evaluate
        from kgc.linkpred.structure import has_structure

        split = split or "test"
        if split not in ("test", "dev"):
            raise KGCError(f"split {split!r}: choose test or dev")
        if use_index and entities_from is not None:
            raise KGCError("use_index (--use-index) ranks against the run's own FAISS index; drop it with "
                           "entities_from (--entities-from)")
        if candidates is not None and entities_from is None:
            raise KGCError("candidates (--candidates) goes with entities_from (--entities-from)")
        if top_k is not None and not use_index:
            raise KGCError("top_k (--top-k) goes with use_index (--use-index)")
        rr = self.recipe.eval.rerank.model_dump()
        if rerank is not None:
            rr["enabled"] = rerank
        bs = batch_size or self.recipe.eval.batch_size
        budget = self.recipe.eval.max_score_bytes
        if entities_from is not None:
            from kgc.linkpred.inductive import inductive_graph

            if rerank:
                raise KGCError("--rerank with --entities-from: graph re-ranking boosts the train-graph neighbours of "
                               "the head, and unseen entities have none (SimKGC turns it off for inductive "
                               "evaluation; with an empty graph it would boost only the head itself). Drop --rerank.")
            graph, info = inductive_graph(entities_from, self.graph(), split=split, candidates=candidates or "split",
                                          long_text=self.recipe.data.long_text, warn=self.echo)
            ev = evaluate(self.model_for(graph), graph, split, batch_size=bs, rerank=None, progress=progress,
                          max_score_bytes=budget)  # never re-ranked, whatever eval.rerank says
            ev.results["kgc"]["inductive"] = info
            return self._write(ev, split, "inductive")
        graph = self.graph()
        if not len(graph.splits[split]):
            raise KGCError(f"{graph.source}: the {split} split has no triples to rank (train with testing= / "
                           "validation= factories, or a dataset with that split)")
        fused = has_structure(self.dir.structure)
        if text_only and not fused:
            raise KGCError(f"{self.path} has no structural model: its evaluation is the text model's already; "
                           "drop text_only (--text-only)")
        if fused and not text_only:
            if use_index or rerank:
                raise KGCError(f"{self.path} has a structural model: its evaluation fuses text and structure over "
                               "every entity; drop --use-index / --rerank, or rank by the text model alone with "
                               "--text-only")
            return self._write(self._evaluate_fused(split, bs, progress), split)
        model = self.model()
        search = None
        if use_index:
            from kgc.linkpred.index import index_params, load_index

            top_k = 100 if top_k is None else top_k
            if top_k < 1:
                raise KGCError(f"--top-k {top_k}: rank within at least 1 retrieved entity")
            search = (load_index(self.dir, model, faiss_device="cpu"), top_k)  # missing: the message says build it
        ev = evaluate(model, graph, split, batch_size=bs, rerank=rr, progress=progress,
                      entity_table=self._entity_table(model), max_score_bytes=budget, search=search)
        if use_index:
            ev.results["kgc"]["search"]["index"] = index_params(self.dir, model)
        if text_only:
            ev.results["kgc"]["text_only"] = True  # the run's structural model left out
        return self._write(ev, split, "text" if text_only else None)

    def _evaluate_fused(self, split: str, batch_size: int, progress: bool) -> "Evaluation":
        """α on dev, then ``split`` fused (the main result) with ``kgc.components`` text-only (α = 1) and
        structure-only (α = 0), all ranked in one pass per split through the ranking protocol."""
        from kgc.linkpred.evaluate import entity_states, evaluate
        from kgc.linkpred.structure import FORMULA, alpha_of, choose_alpha, fused_scorer, load_structure

        start = time.perf_counter()
        model, graph = self.model(), self.graph()
        structure = load_structure(self.dir.structure, self.device)
        budget = self.recipe.eval.max_score_bytes
        engine, table, *_ = entity_states(model, batch_size=batch_size, progress=progress,  # once, for dev and test;
                                          entity_table=self._entity_table(model),  # each split's evaluation
                                          heads=np.empty(0, dtype=np.int64))  # adds its heads' states
        choice = choose_alpha(self.dir.structure, model, graph, structure, batch_size=batch_size, entity_table=table,
                              progress=progress, engine=engine, max_score_bytes=budget)
        alpha = alpha_of(choice)
        ev = evaluate(model, graph, split, batch_size=batch_size, entity_table=table, progress=progress, engine=engine,
                      scorer=fused_scorer(structure, list(dict.fromkeys([alpha, 1.0, 0.0]))), max_score_bytes=budget)
        ev.seconds = time.perf_counter() - start
        ev.results["kgc"]["evaluation_seconds"] = round(ev.seconds, 3)
        ev.results["kgc"]["structure"] = {"model": structure.name, "alpha": choice["alpha"], "grid": choice["grid"],
                                          "formula": FORMULA, "params": structure.meta["params"],
                                          **{k: choice[k] for k in ("per_relation", "per_relation_dev_mrr")
                                             if k in choice}}
        ev.results["kgc"]["components"] = {"text": ev.variants[1.0], "structure": ev.variants[0.0]}
        return ev

    def _write(self, ev: "Evaluation", split: str, kind: str | None = None) -> "Evaluation":
        def write() -> None:  # one transaction: results.json and ranks.tsv always belong to one evaluation
            results, ranks = self.dir.results(split, kind), self.dir.table("ranks", split, kind)
            with Transaction(results.parent) as tx:
                tx.write_json(results.name, ev.results)
                tx.write_text(ranks.name, tsv_text(ev.ranks))
                tx.commit()

        return self._save(ev, write)  # a folder that refuses them: ResultsNotSaved, carrying the figures

    # ------------------------------------------------------------ answers

    def predict(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
                filter_known: bool = False, include_head: bool = False, progress: bool = False,
                free_text: bool = False) -> "pd.DataFrame":
        """Top-k answers to (head, relation, ?) — ``inverse``: (?, relation, head) — as a DataFrame with columns
        rank, entity, name, text, score, known (a triple of the graph), the rows ``kgc predict`` prints.
        ``head``: entity id or text (an entity added with ``kgc index --add`` too), or any free text, embedded
        on the fly (not for a run with a structural model: it scores known entities only) — but a string spelt
        like an entity's id or name is taken for a typo and raises :class:`kgc.errors.UnknownName` with the near
        misses, unless ``free_text``; ``relation``: name or text. The head itself is left out of the answers
        unless ``include_head`` (the evaluation protocol ranks it, as SimKGC does); ``filter_known`` also leaves
        out the answers the graph already has. A run with a structural model ranks by the fused score, others by
        cosine over the FAISS index, which is built first if the run has none (or a stale one)."""
        return self.answer(head, relation, top_k, inverse=inverse, filter_known=filter_known,
                           include_head=include_head, progress=progress, free_text=free_text).frame()

    def _head_tokens(self, head: str, entity: int | None, bank) -> list[int]:
        """Token ids (no specials) of a query's head: the entity's text from ``bank``, or the free text ``head`` (when
        ``entity`` is None), cut as entity texts are."""
        if entity is not None:
            return bank.entity_ids(entity)
        return self.tokenizer()(head, add_special_tokens=False)["input_ids"][: bank.max_tokens]

    def resolve_head(self, head: str, graph: "KnowledgeGraph", *, free_text: bool = False) -> int | None:
        """The entity ``head`` names in ``graph`` (the run's, or :meth:`searcher`'s with added entities), or None
        for free text; says nothing. A head that names no entity but is spelt like one (a typo: id or name within
        :data:`kgc.data.graph.NEAR_MISS`) raises :class:`kgc.errors.UnknownName` (kind "head", the near misses as
        ``suggestions``) unless ``free_text``, which embeds any string that names no entity as text."""
        h = graph.lookup_entity(head)
        if h is not None:
            return h
        if not head.strip():
            raise KGCError("empty head: give an entity id, an entity's name or text, or a free text")
        if not free_text:
            close = graph.near_misses(head)
            if close:
                raise UnknownName(f"{head!r} is not an entity of {self.path}; did you mean: {', '.join(close)}? "
                                  "(--free-text, or free_text=True, embeds it as text)",
                                  kind="head", name=head, suggestions=close)
        return None

    def _resolve_head(self, head: str, graph: "KnowledgeGraph", *, free_text: bool = False) -> int | None:
        """:meth:`resolve_head`, and a free-text head said on the run's echo with its nearest entities by
        embedding (:meth:`free_text_note`; not computed when the run is silent)."""
        h = self.resolve_head(head, graph, free_text=free_text)
        if h is None and self.echo is not silent:
            self.echo(self.free_text_note(head))
        return h

    def nearest_entities(self, texts: str | Sequence[str], n: int = 5) -> list[list[str]]:
        """For each text, the ``n`` entities of the index (added ones too) nearest to it by embedding — cosine of
        the text's tail-tower embedding against the entity embeddings — best first, each as a string that
        resolves to that entity. What the note on a free-text head lists."""
        from kgc.linkpred.index_types import search_index

        items, _ = as_list(texts)
        index, graph, _ = self.searcher()
        if not items or not index.ntotal:
            return [[] for _ in items]
        _, ids = search_index(index, self.embed_entities(items), min(n, index.ntotal))
        return [[graph.resolvable(int(e)) for e in row if e >= 0] for row in ids]

    def free_text_note(self, head: str) -> str:
        """The line said when ``head`` is embedded as free text, naming its nearest entities by embedding."""
        near = self.nearest_entities([head])[0]
        return (f"{head!r} is not an entity of {self.path}: embedded as free text (nearest entities by embedding: "
                f"{', '.join(near) or '(none)'})")

    @torch.no_grad()
    def answer(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
               filter_known: bool = False, include_head: bool = False, progress: bool = False,
               free_text: bool = False) -> Answers:
        """:meth:`predict` with the query as it was resolved (head id and text, relation) and the time taken: the
        batch of one of :meth:`answer_many` (what ``kgc serve`` and ``kgc predict --input`` run), so every way of
        asking gives the same answers."""
        q = self.resolve(head, relation, top_k, inverse=inverse, filter_known=filter_known,
                         include_head=include_head, free_text=free_text, progress=progress)
        return self.answer_many([q])[0]

    def resolve(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
                filter_known: bool = False, include_head: bool = False, free_text: bool = False,
                progress: bool = False, note: bool = True) -> Query:
        """A question as :meth:`answer_many` takes it: the head resolved to an entity (id, name or text; an added
        entity too) or kept as free text, the relation to its id. Bad names raise KGCError (an unknown relation
        lists the valid ones). ``note``: say a free-text head on the run's echo, with its nearest entities."""
        from kgc.linkpred.structure import has_structure

        if not isinstance(top_k, int) or top_k < 1:
            raise KGCError(f"top_k={top_k!r}: ask for at least 1 answer")
        _, graph, bank = self.searcher(progress=progress)
        r = graph.relation_id(relation, inverse=inverse)
        h = (self._resolve_head if note else self.resolve_head)(head, graph, free_text=free_text)
        if h is None and has_structure(self.dir.structure):
            raise KGCError(f"{self.path} has a structural model, which scores the graph's entities only: a free-text "
                           f"head ({head!r}) cannot be fused. Give an entity id or name.")
        return Query(head, h, r, self._head_tokens(head, h, bank), top_k, filter_known, include_head)

    def query_engine(self):
        """A QueryEngine over the run's entities when it costs nothing to build — a pooled conditioner (tri-encoders,
        Hyper-CL) whose towers are shared borrows the index's embeddings as the heads' sentence states, so a query
        about a known head runs only the conditioner's composition, no encoder pass (as ``kgc evaluate`` does).
        None for the others: they encode the head's text per query."""
        with self._loading:
            return self._query_engine()

    def _query_engine(self):
        if "engine" not in self._loaded:
            from kgc.linkpred.model import QueryEngine

            model, engine = self.model(), None
            if (model.conditioner.enters_at == "pooled" and model.query_encoder is model.tail_encoder
                    and model.tail_map is None):  # with a tail map, entity vectors are not the sentence states
                engine = QueryEngine(model, batch_size=self.recipe.eval.batch_size,
                                     entity_table=self._index_table()[: self.graph().num_entities])
            self._loaded["engine"] = engine
        return self._loaded["engine"]

    @torch.no_grad()
    def _query_vectors(self, queries: Sequence[Query]) -> np.ndarray:
        """(queries, dim) float32 unit vectors: known heads through the query engine when there is one, the rest
        (free text, added entities, other conditioners) in one encoder pass."""
        model = self.model()
        out = np.empty((len(queries), model.tail_encoder.dim), dtype=np.float32)
        engine = self.query_engine()
        known = self.graph().num_entities
        cached = [i for i, q in enumerate(queries) if engine is not None and q.h is not None and q.h < known]
        if cached:
            out[cached] = engine(np.array([queries[i].h for i in cached]),
                                 np.array([queries[i].r for i in cached])).float().cpu().numpy()
        skip = set(cached)
        rest = [i for i in range(len(queries)) if i not in skip]
        if rest:
            out[rest] = model.encode_query_tokens([queries[i].tokens for i in rest],
                                                  [queries[i].r for i in rest]).float().cpu().numpy()
        return out

    @torch.no_grad()
    def answer_many(self, queries: Sequence[Query]) -> list[Answers]:
        """Answers to resolved queries (:meth:`resolve`), all encoded in one pass and searched in one index call;
        each keeps its own top-k, filters and known-answer marks. ``seconds`` on each is the whole batch's."""
        from kgc.linkpred.predict import known_answers, rank_scores, search_many
        from kgc.linkpred.structure import has_structure, predict_fused

        if not queries:
            return []
        index, graph, _ = self.searcher()
        start = time.perf_counter()
        vectors = self._query_vectors(queries)
        knowns = [set(known_answers(graph, q.h, q.r).tolist()) if q.h is not None else set() for q in queries]
        excludes = [q.excluded(k) for q, k in zip(queries, knowns)]
        if has_structure(self.dir.structure):  # as `kgc evaluate`: fused with the structural model
            structure, alpha, table = self._fused()
            preds = [rank_scores(predict_fused(torch.from_numpy(vectors[i: i + 1]), table, structure, alpha,
                                               head=q.h, relation=q.r), graph, top_k=q.top_k, exclude=x, known=k)
                     for i, (q, x, k) in enumerate(zip(queries, excludes, knowns))]
        else:
            preds = search_many(vectors, index, graph, top_ks=[q.top_k for q in queries], excludes=excludes,
                                knowns=knowns)
        seconds = time.perf_counter() - start
        return [Answers(run=self.path, head=graph.entities[q.h] if q.h is not None else "(free text)",
                        relation=graph.relation_label(q.r),
                        head_text=graph.full_texts[q.h] if q.h is not None else q.head,
                        relation_text=graph.relation_text(q.r), predictions=p, seconds=seconds)
                for q, p in zip(queries, preds)]

    def _index_table(self) -> torch.Tensor:
        """(index rows, dim): every entity's embedding as the index holds it (the run's graph, then added entities),
        the index built first when missing or stale; loaded once, for the query engine and fused scores alike (a
        flat index on the CPU is this table already: shared, not read twice)."""
        with self._loading:
            if "table" not in self._loaded:
                from kgc.linkpred.index import load_embeddings
                from kgc.linkpred.index_types import ExactIndex

                index = self.searcher()[0]
                if isinstance(index, ExactIndex) and index.device.type == "cpu":
                    self._loaded["table"] = index.table
                else:
                    self._loaded["table"] = torch.from_numpy(load_embeddings(self.dir, self.model(), added=True))
            return self._loaded["table"]

    def _fused(self):
        """(structural model, α chosen on dev, entity table with added rows), loaded once."""
        with self._loading:
            return self._fused_once()

    def _fused_once(self):
        if "fused" not in self._loaded:
            from kgc.linkpred.structure import alpha_of, choose_alpha, load_structure

            structure = load_structure(self.dir.structure)
            alpha = alpha_of(choose_alpha(self.dir.structure, self.model(), self.graph(), structure,
                                          batch_size=self.recipe.eval.batch_size))
            self._loaded["fused"] = (structure, alpha, self._index_table().float())  # graph rows, then added
        return self._loaded["fused"]

    # ------------------------------------------------------------ the index

    def index(self, *, type: str | None = None, force: bool = False, progress: bool = True,
              **params: int | None) -> dict:
        """Build, update or keep the run's FAISS index (``kgc index``) and say what was done:
        ``{"action": "none" | "search" | "build", "why": …, "meta": index/meta.json}``.

        Type and parameters are the existing index's (a first build: the recipe's ``index:`` section; ``type``
        starts again from the recipe's), with ``params`` (nlist, nprobe, hnsw_m, ef_search, ef_construction,
        pq_bytes, train_size) applied. A fresh index of that type is kept; a changed nprobe / ef_search is stored
        without a rebuild; anything else rebuilds, reusing the stored embeddings (``force``: re-embed)."""
        from kgc.linkpred.index import _read_meta, index_plan, rebuild_index, stored_config, update_search_params
        from kgc.linkpred.index_types import index_config

        # an existing index keeps its type and build parameters (`kgc index RUN --nprobe 64` on an ivf index, or
        # a rebuild after retraining, must not turn it back into the recipe's type); `type` starts from the recipe
        stored = stored_config(self.dir) if type is None else None
        if stored is not None and params.get("nlist") is not None and params.get("train_size") is None:
            stored = stored.model_copy(update={"train_size": None})  # its train_size was 64·(old nlist)
        config = index_config(stored if stored is not None else self.recipe.index, type=type, **params)
        model = self.model()  # bad options stopped above, before the model is loaded
        action, why = index_plan(self.dir, model, config)
        if force:
            action = "build"
        if action == "none":
            meta = _read_meta(self.dir.index)
        elif action == "search":
            meta = update_search_params(self.dir, model, config)
        else:
            meta = rebuild_index(self.dir, model, self.graph(), progress=progress, config=config,
                                 reuse_embeddings=not force,
                                 faiss_device="cpu" if self.device.type == "cpu" else "auto")
        self._forget_index()
        return {"action": action, "why": why, "meta": meta}

    def add_entities(self, path: str | Path, *, progress: bool = True, guard=None, batch_size: int | None = None,
                     keep_loaded: bool = False) -> dict:
        """Embed the entities of a TSV (``id<TAB>name<TAB>description``, or ``id<TAB>name, description`` as in
        entity2text.txt) with the trained tail tower and append them to the index (built first if missing or
        stale), no retraining (``kgc index --add``); returns index/meta.json. The run's lock is held throughout: an
        add while another process (or thread) writes the run is a KGCError naming it — run it again afterwards.
        The list, the table and the index are committed as one transaction: a failure leaves the index as it was.

        ``guard`` / ``batch_size``: each embedding batch runs inside ``guard()`` (``kgc serve`` interleaves them
        with queries); ``keep_loaded``: keep this object's loaded index (the caller swaps in the new one, see
        :meth:`fork_search`), else it is reloaded on next use."""
        from kgc.linkpred.index import add_entities

        try:
            with run_lock(self.path, "adding entities to the index"):  # the build (if any) and the add, as one
                self.ensure_index(progress=progress)
                return add_entities(self.dir, self.model(), self.graph(), path,
                                    batch_size=batch_size or self.recipe.eval.batch_size, progress=progress,
                                    guard=guard)
        finally:  # the index on disk changed (or may have, if the add failed half-way)
            if not keep_loaded:
                self._forget_index()

    INDEX_STATE = ("search", "engine", "fused", "table")  # what _forget_index drops: all read from the index

    def fork_search(self) -> "LinkPredRun":
        """A shallow copy sharing this run's model, graph and tokenizer but none of its index state: warm it
        (``searcher()``, ``query_engine()``) off the query path, then :meth:`adopt_search` it — how ``kgc serve``
        makes added entities visible at once, without a query ever waiting for the index to load."""
        import copy

        fork = copy.copy(self)
        fork._loaded = {k: v for k, v in self._loaded.items() if k not in self.INDEX_STATE}
        fork._loading = threading.RLock()
        return fork

    def adopt_search(self, fork: "LinkPredRun") -> None:
        """Take ``fork``'s index state (see :meth:`fork_search`); the caller holds whatever orders it with queries."""
        with self._loading:
            for key in self.INDEX_STATE:
                if key in fork._loaded:
                    self._loaded[key] = fork._loaded[key]
                else:
                    self._loaded.pop(key, None)

    # ------------------------------------------------------------ the structural model

    def train_structure(self, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                        progress: bool = True, **kwargs: Any) -> dict:
        """(Re)train only the structural PyKEEN model (``RUN/structure/``; ``kgc structure``), from the run's
        ``structure:`` section (defaults if it has none) with ``structure.*`` overrides
        (``structure__epochs=200`` or ``{"structure.epochs": 200}``). Returns its meta (model, train_seconds …)."""
        from kgc.linkpred.structure import train_structure
        from kgc.recipe import StructureConfig, override_keys, resolve_recipe

        changes = override_keys(overrides, kwargs)
        bad = [k for k in changes if not k.startswith("structure.")]
        if bad:
            raise KGCError(f"{bad[0]}: only structure.* keys change the structural model (`kgc structure RUN "
                           "--set structure.KEY=VALUE`, run.train_structure(structure__KEY=VALUE))")
        config = self.recipe.structure
        if changes:
            base = {"task": self.task, "structure": config.model_dump(mode="json") if config else {}}
            config = resolve_recipe(base, changes).structure
        with run_lock(self.path, "training the structural model"):
            return train_structure(config or StructureConfig(), self.graph(), self.dir.structure,
                                   seed=self.recipe.train.seed, device=self.recipe.train.device, progress=progress,
                                   echo=self.echo)

    # ------------------------------------------------------------ embeddings

    @torch.no_grad()
    def embed_entities(self, ids_or_texts: str | Sequence[str], *, batch_size: int = 256) -> np.ndarray:
        """(n, dim) float32 tail-tower embeddings (unit vectors). An entity id of the run's graph gets its
        evaluation-time embedding (the row of the entity table / index); any other string is embedded as a text,
        tokenised as entity texts are (``data.max_tokens``)."""
        items, _ = as_list(ids_or_texts)
        model, graph = self.model(), self.graph()
        bank = model.bank
        rows = []
        for item in items:
            if not isinstance(item, str):
                raise KGCError(f"embed_entities: expected entity ids or texts (str), got {type(item).__name__}")
            e = graph.entity_index.get(item)
            rows.append(bank.entity_ids(e) if e is not None else None)
        texts = [i for i, r in enumerate(rows) if r is None]
        if texts:
            ids = self.tokenizer()([items[i] for i in texts], add_special_tokens=False)["input_ids"]
            for i, t in zip(texts, ids):
                rows[i] = t
        out = np.empty((len(items), model.tail_encoder.dim), dtype=np.float32)
        for s in range(0, len(rows), batch_size):
            batch = bank.special.pad([bank.special.wrap(r, bank.max_tokens) for r in rows[s: s + batch_size]])
            out[s: s + batch_size] = model.encode_tail_inputs(batch).float().cpu().numpy()
        return out

    @torch.no_grad()
    def embed_queries(self, heads: str | Sequence[str], relations: str | Sequence[str], *, inverse: bool = False,
                      batch_size: int = 256, free_text: bool = False) -> np.ndarray:
        """(n, dim) float32 query embeddings g(head | relation): heads by entity id or text (as ``kgc predict``
        resolves them; a string that names no entity is embedded as free text, but one spelt like an entity's name
        raises :class:`kgc.errors.UnknownName` unless ``free_text``), relations by name or text; one relation
        string applies to every head."""
        hs, _ = as_list(heads)
        rs, single = as_list(relations)
        if single:
            rs = rs * len(hs)
        if len(rs) != len(hs):
            raise KGCError(f"embed_queries: {len(hs)} heads but {len(rs)} relations (give one relation, or one "
                           "per head)")
        model, graph = self.model(), self.graph()
        for x in hs:
            if not isinstance(x, str):
                raise KGCError(f"embed_queries: expected entity ids or texts (str), got {type(x).__name__}")
        h = [graph.lookup_entity(x) if free_text else self.resolve_head(x, graph) for x in hs]
        r = [graph.relation_id(x, inverse=inverse) for x in rs]
        sentences = [self._head_tokens(x, e, model.bank) for x, e in zip(hs, h)]
        out = np.empty((len(hs), model.tail_encoder.dim), dtype=np.float32)
        for s in range(0, len(hs), batch_size):
            out[s: s + batch_size] = model.encode_query_tokens(sentences[s: s + batch_size],
                                                               r[s: s + batch_size]).float().cpu().numpy()
        return out

    # ------------------------------------------------------------ kgc explain

    def explain_inputs(self, *, head: str | None = None, relations: Sequence[str] = (), inverse: bool = False,
                       sentence: str | None = None, conditions: Sequence[str] = ()) -> ExplainInputs:
        """The head's text and the relations (default: every relation) for ``kgc explain``."""
        if sentence is not None or conditions:
            raise KGCError("--sentence/--condition are for C-STS runs; for link prediction give --head and --relation")
        model, graph = self.model(), self.graph()
        rels = [graph.relation_id(r, inverse=inverse) for r in relations] if relations else \
            graph.relation_ids(inverse=inverse)
        ids, subject = None, ""
        if head is not None:
            # with the index loaded (kgc serve), entities added to it are heads too; otherwise the run's own graph
            _, heads, bank = self._loaded.get("search") or (None, graph, model.bank)
            h = heads.find_entity(head)
            ids, subject = bank.entity_ids(h), f"{heads.entities[h]}, {heads.full_texts[h]}"
        return ExplainInputs(model.conditioner, self.tokenizer(), ids, subject,
                             [model.bank.relation_ids[r] for r in rels], [graph.relation_label(r) for r in rels],
                             "give --head (an entity id or text): the router weighs the tokens of its text")

    # ------------------------------------------------------------ kgc serve

    def serving(self):
        """``kgc serve``'s link-prediction routes and page (:mod:`kgc.linkpred.serving`)."""
        from kgc.linkpred.serving import LinkPredServing

        return LinkPredServing(self)

    def predict_file(self, path: str | Path, out: str | Path | None = None, *, format: str | None = None,
                     top_k: int = 10, inverse: bool = False, filter_known: bool = False, include_head: bool = False,
                     free_text: bool = False, batch_size: int = 64, progress: bool = False,
                     echo=None) -> dict:
        """``kgc predict RUN --input FILE``: answer every question of a query file (``head<TAB>relation`` lines, or
        JSONL objects that may set their own options) with one model load, ``batch_size`` questions per forward pass.
        Every line is resolved before anything is answered, so a bad name stops the run at once, naming its line.
        Answers go to ``out`` (written atomically) or, with ``out`` None, through ``echo`` once all are answered;
        ``format`` ``jsonl`` (one object per question, the default) or ``tsv`` (one row per answer; default for a
        ``.tsv`` ``out``). Returns {"questions", "answers", "seconds", "per_second"}."""
        import json

        from tqdm.auto import tqdm

        from kgc.fileio import tsv_text, write_text
        from kgc.linkpred.predict import ANSWER_COLUMNS, answer_record, answer_rows, read_query_file

        fmt = format or ("tsv" if out is not None and Path(out).suffix.lower() == ".tsv" else "jsonl")
        if fmt not in ("jsonl", "tsv"):
            raise KGCError(f"--format {fmt}: choose jsonl or tsv")
        if batch_size < 1:
            raise KGCError(f"--batch-size {batch_size}: at least 1")
        lines = read_query_file(path)
        defaults = {"top_k": top_k, "inverse": inverse, "filter_known": filter_known, "include_head": include_head,
                    "free_text": free_text}
        queries = []
        for q in lines:
            try:
                queries.append(self.resolve(q.head, q.relation, progress=progress, note=False,
                                            **{**defaults, **q.options}))
            except KGCError as exc:
                raise KGCError(f"{path}:{q.line}: {exc}") from None
        start, records, rows = time.perf_counter(), [], []
        for s in tqdm(range(0, len(queries), batch_size), desc="questions", unit="batch", disable=not progress,
                      leave=False):
            for q, a in zip(lines[s: s + batch_size], self.answer_many(queries[s: s + batch_size])):
                if fmt == "jsonl":
                    records.append(json.dumps(answer_record(q, a), ensure_ascii=False) + "\n")
                rows += answer_rows(q, a)  # one per answer: the TSV's rows, and the count
        seconds = time.perf_counter() - start
        text = "".join(records) if fmt == "jsonl" else tsv_text(rows, ANSWER_COLUMNS)
        if out is not None:
            write_text(out, text)
        elif echo is not None and text.strip():
            echo(text.rstrip("\n"))
        count = len(rows)
        return {"questions": len(queries), "answers": count, "seconds": round(seconds, 3),
                "per_second": round(len(queries) / max(seconds, 1e-9), 1), "format": fmt}
