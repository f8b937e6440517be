"""What answers a run's questions: the trained model over the run's own graph and its tokenizer, and — for a run
with a structural model — that model and the α it is fused with, each loaded once on the run's device (α chosen
once: :meth:`Predictor.alpha_choice` is the one caller of ``choose_alpha``); then the answering itself: a question
resolved, its query vector (through the index's query engine when it has one), the index's search or the fused
scores over every entity, the answers. The embeddings of the API and the inputs of ``kgc explain`` too.

The index a question is answered from is passed in (a :class:`kgc.linkpred.answer.entities.EntityIndex`), never
kept: ``kgc serve`` swaps the index after an add while the model stays.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import torch

from kgc.errors import KGCError, UnknownName
from kgc.linkpred.answer.topk import Answers, Query
from kgc.training.run import ExplainInputs, as_list, silent


class Entities(Protocol):
    """What the predictor asks of the run's entities (:class:`kgc.linkpred.answer.entities.EntityIndex` is the one
    kgc hands it): the index to search with the graph it answers in and that graph's texts, and the query engine
    of a conditioner that caches per entity (None for the others)."""

    def searcher(self, *, progress: bool = False) -> "tuple[SearchIndex, KnowledgeGraph, TextBank]": ...

    def query_engine(self) -> "QueryEngine | None": ...

if TYPE_CHECKING:
    from kgc.data.graph import KnowledgeGraph
    from kgc.data.texts import TextBank
    from kgc.linkpred.index.types import SearchIndex
    from kgc.linkpred.model import QueryEngine
    from kgc.linkpred.model import LinkPredictor
    from kgc.linkpred.answer.query import QueryOptions
    from kgc.linkpred.structure.pykeen import Structure
    from kgc.training.run import RunDir


class Predictor:
    """The model side of one run, on ``device``; ``echo`` says a free-text head and what training the structural
    model prints."""

    def __init__(self, run: "RunDir", device: torch.device, *, echo: Callable[[str], None]) -> None:
        self.dir, self.recipe, self.device, self.echo = run, run.recipe, device, echo
        self._lock = threading.RLock()  # what is loaded once is loaded by one thread (kgc serve asks from several)
        self._loaded: dict[str, Any] = {}

    def _once(self, key: str, load: Callable[[], Any]) -> Any:
        found = self._loaded.get(key)
        if found is None:
            with self._lock:
                if key not in self._loaded:
                    self._loaded[key] = load()
                found = self._loaded[key]
        return found

    # ------------------------------------------------------------ the model

    def graph(self) -> "KnowledgeGraph":
        """The run's own dataset."""
        def load():
            from kgc.data.formats import load_graph

            d = self.recipe.data
            return load_graph(d.dataset, path=d.path, long_text=d.long_text)

        return self._once("graph", load)

    def model_for(self, graph: "KnowledgeGraph") -> "LinkPredictor":
        """The trained towers with a TextBank over ``graph`` (the weights do not depend on the graph), in eval mode
        on the run's device, in the precision ``train.amp`` means on this machine (``model.precision_choice``): a
        new model for every call."""
        from kgc.linkpred.model import build_model

        model, _ = build_model(self.recipe, graph, self.dir.backbone, pretrained=self.dir.pretrained)
        self.dir.load_weights(model)
        model.attach_layer_cache(self.recipe)
        model = model.to(self.device).eval()
        model.choose_precision(self.recipe)
        model.hold_weights()  # answering only: a bf16 encoder casts each weight once, not at every call
        return model

    def model(self) -> "LinkPredictor":
        """The trained model over the run's own graph, loaded once."""
        return self._once("model", lambda: self.model_for(self.graph()))

    def tokenizer(self):
        def load():
            from kgc.encoding.backbone import load_tokenizer

            return load_tokenizer(self.dir.backbone)

        return self._once("tokenizer", load)

    # ------------------------------------------------------------ the structural model and α

    @property
    def fused(self) -> bool:
        """The run has a structural model: its answers and evaluations fuse text and structure."""
        from kgc.linkpred.structure.pykeen import has_structure

        return has_structure(self.dir.structure)

    def structure(self) -> "Structure":
        """The structural model, loaded once on the run's device."""
        from kgc.linkpred.structure.kinds import load_structure

        return self._once("structure", lambda: load_structure(self.dir.structure, self.device))

    def alpha_choice(self, *, batch_size: int | None = None, progress: bool = False, engine=None,
                     entity_table: torch.Tensor | None = None) -> dict:
        """The α the text and structural scores are fused with, chosen on dev (``structure/alpha.json``; reused
        while the structural model is the same) once: ``{alpha, grid, model, …}``. ``engine`` / ``entity_table``:
        states the caller computed already (the dev evaluation reuses them)."""
        def choose():
            from kgc.linkpred.structure.pykeen import choose_alpha

            return choose_alpha(self.dir.structure, self.model(), self.graph(), self.structure(),
                                batch_size=batch_size or self.recipe.eval.batch_size, entity_table=entity_table,
                                progress=progress, engine=engine, max_score_bytes=self.recipe.eval.max_score_bytes)

        return self._once("alpha", choose)

    def train_structure(self, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                        progress: bool = True, **kwargs: Any) -> dict:
        """(Re)train the structural model from the recipe's ``structure:`` section with ``structure.*``
        overrides (see :meth:`kgc.linkpred.answer.run.LinkPredRun.train_structure`); the next answer reloads it and
        chooses α again."""
        from kgc.fileio import run_lock
        from kgc.linkpred.structure.kinds import train_structure
        from kgc.recipe import override_keys, resolve_recipe

        changes = override_keys(overrides, kwargs)
        bad = [k for k in changes if not k.startswith("structure.")]
        if bad:
            raise KGCError(f"{bad[0]}: only structure.* keys change the structural model (`kgc structure RUN "
                           "--set structure.KEY=VALUE`, run.train_structure(structure__KEY=VALUE))")
        config = self.recipe.structure
        if changes or config is None:  # none in the recipe: the defaults
            base = config.model_dump(mode="json") if config else {}
            if config is not None and "structure.model" in changes:  # another model: the keys it reads stay
                other = resolve_recipe({"task": self.recipe.task, "structure": {"model": changes["structure.model"]}})
                base = {k: v for k, v in base.items() if k in type(other.structure).model_fields}
            config = resolve_recipe({"task": self.recipe.task, "structure": base}, changes).structure
        try:
            with run_lock(self.dir.path, "training the structural model"):
                return train_structure(config, self.graph(), self.dir.structure, seed=self.recipe.train.seed,
                                       device=self.recipe.train.device, progress=progress, echo=self.echo)
        finally:
            with self._lock:
                self._loaded.pop("structure", None)
                self._loaded.pop("alpha", None)

    # ------------------------------------------------------------ questions

    def head_tokens(self, head: str, entity: int | None, bank) -> list[int]:
        """Token ids (no specials) of a query's head: the entity's text from ``bank``, or the free text ``head`` (when
        ``entity`` is None), cut as entity texts are."""
        if entity is not None:
            return bank.entity_ids(entity)
        return self.tokenizer()(head, add_special_tokens=False)["input_ids"][: bank.max_tokens]

    def resolve_head(self, head: str, graph: "KnowledgeGraph", *, free_text: bool = False) -> int | None:
        """The entity ``head`` names in ``graph``, or None for free text; says nothing. A head spelt like an entity
        (a typo) raises :class:`kgc.errors.UnknownName` with the near misses unless ``free_text``."""
        bad = next((i for i, c in enumerate(head) if "\ud800" <= c <= "\udfff"), None)
        if bad is not None:  # a lone surrogate (a shell's undecodable bytes): no tokenizer reads it
            raise KGCError(f"head {head[:40]!r}: not valid text (a lone surrogate, {head[bad]!r}, at character "
                           f"{bad + 1}: bytes that are not UTF-8). Give the head as UTF-8 text.")
        h = graph.lookup_entity(head)
        if h is not None:
            return h
        if not head.strip():
            raise KGCError("empty head: give an entity id, an entity's name or text, or a free text")
        if not free_text:
            close = graph.near_misses(head)
            if close:
                raise UnknownName(f"{head!r} is not an entity of {self.dir.path}; did you mean: {', '.join(close)}? "
                                  "(--free-text, or free_text=True, embeds it as text)",
                                  kind="head", name=head, suggestions=close)
        return None

    def resolve(self, head: str, relation: str, options: "QueryOptions", entities: Entities, *, progress: bool = False,
                note: bool = True) -> Query:
        """A question as :meth:`answer_many` takes it, resolved against ``entities``' graph (added entities too).
        ``note``: say a free-text head on ``echo``, with its nearest entities."""
        _, graph, bank = entities.searcher(progress=progress)
        r = graph.relation_id(relation, inverse=options.inverse)
        h = self.resolve_head(head, graph, free_text=options.free_text)
        if h is None and note and self.echo is not silent:
            self.echo(self.free_text_note(head, entities))
        if h is None and self.fused:
            raise KGCError(f"{self.dir.path} has a structural model, which scores the graph's entities only: a "
                           f"free-text head ({head!r}) cannot be fused. Give an entity id or name.")
        return Query(head, h, r, self.head_tokens(head, h, bank), options)

    def nearest_entities(self, texts: str | Sequence[str], entities: Entities, n: int = 5) -> list[list[str]]:
        """For each text, the ``n`` entities of the index (added ones too) nearest to it by embedding, best first,
        each as a string that resolves to that entity."""
        from kgc.linkpred.index.types import search_index

        items, _ = as_list(texts)
        index, graph, _ = entities.searcher()
        if not items or not index.ntotal:
            return [[] for _ in items]
        _, ids = search_index(index, self.embed_entities(items), min(n, index.ntotal))
        return [[graph.resolvable(int(e)) for e in row if e >= 0] for row in ids]

    def free_text_note(self, head: str, entities: Entities) -> str:
        """The line said when ``head`` is embedded as free text, naming its nearest entities by embedding."""
        near = self.nearest_entities([head], entities)[0]
        return (f"{head!r} is not an entity of {self.dir.path}: embedded as free text (nearest entities by "
                f"embedding: {', '.join(near) or '(none)'})")

    @torch.no_grad()
    def query_vectors(self, queries: Sequence[Query], entities: Entities) -> np.ndarray:
        """(queries, dim) float32 unit vectors: known heads through ``entities``' query engine when there is one,
        the rest (free text, added entities, other conditioners) in one encoder pass."""
        model = self.model()
        out = np.empty((len(queries), model.tail_encoder.dim), dtype=np.float32)
        engine = entities.query_engine()
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
    def answer_many(self, queries: Sequence[Query], entities: Entities) -> list[Answers]:
        """Answers to resolved queries, all encoded in one pass and searched in one index call (a run with a
        structural model: ranked by the fused score, as ``kgc evaluate`` ranks); each keeps its own top-k, filters
        and known-answer marks. ``seconds`` on each is the whole batch's."""
        from kgc.linkpred.answer.topk import known_answers, rank_scores, search_many
        from kgc.linkpred.structure.pykeen import alpha_of, predict_fused

        if not queries:
            return []
        index, graph, _ = entities.searcher()
        start = time.perf_counter()
        vectors = self.query_vectors(queries, entities)
        knowns = [set(known_answers(graph, q.h, q.r).tolist()) if q.h is not None else set() for q in queries]
        excludes = [q.excluded(k) for q, k in zip(queries, knowns)]
        if self.fused:
            table = entities.table().float()  # the graph's rows, then the added ones
            alpha = alpha_of(self.alpha_choice(entity_table=table[: self.graph().num_entities]))
            structure = self.structure()
            preds = [rank_scores(predict_fused(torch.from_numpy(vectors[i: i + 1]), table, structure, alpha,
                                               head=q.h, relation=q.r), graph, top_k=q.top_k, exclude=x, known=k)
                     for i, (q, x, k) in enumerate(zip(queries, excludes, knowns))]
        else:
            preds = search_many(vectors, index, graph, top_ks=[q.top_k for q in queries], excludes=excludes,
                                knowns=knowns)
        seconds = time.perf_counter() - start
        return [Answers(run=self.dir.path, head=graph.entities[q.h] if q.h is not None else "(free text)",
                        relation=graph.relation_label(q.r),
                        head_text=graph.full_texts[q.h] if q.h is not None else q.head,
                        relation_text=graph.relation_text(q.r), predictions=p, seconds=seconds)
                for q, p in zip(queries, preds)]

    # ------------------------------------------------------------ embeddings, explain

    @torch.no_grad()
    def embed_entities(self, ids_or_texts: str | Sequence[str], *, batch_size: int = 256) -> np.ndarray:
        """(n, dim) float32 tail-tower embeddings of entity ids (their evaluation-time embedding) or texts."""
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
        """(n, dim) float32 query embeddings g(head | relation), heads resolved as questions' heads are."""
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
        sentences = [self.head_tokens(x, e, model.bank) for x, e in zip(hs, h)]
        out = np.empty((len(hs), model.tail_encoder.dim), dtype=np.float32)
        for s in range(0, len(hs), batch_size):
            out[s: s + batch_size] = model.encode_query_tokens(sentences[s: s + batch_size],
                                                               r[s: s + batch_size]).float().cpu().numpy()
        return out

    def explain_inputs(self, *, head: str | None, relations: Sequence[str], inverse: bool,
                       loaded: tuple | None) -> ExplainInputs:
        """The head's text and the relations (default: every relation) for ``kgc explain``; ``loaded``: the
        index's searcher when it was read (kgc serve: added entities are heads too), else None."""
        model, graph = self.model(), self.graph()
        rels = [graph.relation_id(r, inverse=inverse) for r in relations] if relations else \
            graph.relation_ids(inverse=inverse)
        ids, subject = None, ""
        if head is not None:
            _, heads, bank = loaded or (None, graph, model.bank)
            h = heads.find_entity(head)
            ids, subject = bank.entity_ids(h), f"{heads.entities[h]}, {heads.full_texts[h]}"
        return ExplainInputs(model.conditioner, self.tokenizer(), ids, subject,
                             [model.bank.relation_ids[r] for r in rels], [graph.relation_label(r) for r in rels],
                             "give --head (an entity id or text): the router weighs the tokens of its text")
