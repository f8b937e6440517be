"""A link-prediction run, as ``kgc.load`` returns it: each verb handed to the part that does it — the
:class:`~kgc.linkpred.answer.predictor.Predictor` (model, structural model and α, loaded once), the
:class:`~kgc.linkpred.answer.entities.EntityIndex` (index files, freshness, search device), or a function."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kgc.errors import KGCError
from kgc.linkpred.answer.entities import EntityIndex
from kgc.linkpred.answer.topk import Answers, Query, answer_records
from kgc.linkpred.answer.predictor import Predictor
from kgc.linkpred.answer.query import QueryOptions
from kgc.training.run import CHECKPOINTS, ExplainInputs, Run, RunDir

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from kgc.linkpred.evaluation.ranking import Evaluation


def find_latest_run(root: str | Path = "runs") -> Path:
    """The link-prediction run under ``root`` (searched recursively) whose weights were written last.

    A run directory holds ``recipe.yaml`` and ``best.pt`` or ``checkpoints/last.pt``; runs of other tasks are
    skipped, and a run still training (``checkpoints/last.pt`` only) counts only when no other has weights."""
    import yaml

    root, found = Path(root), []
    for recipe in root.rglob("recipe.yaml") if root.is_dir() else ():
        mtime = RunDir.weights_mtime(recipe.parent)
        if mtime is None:
            continue
        try:
            tree = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(tree, dict) and tree.get("task", LinkPredRun.task) == LinkPredRun.task:
            found.append(((recipe.parent / CHECKPOINTS[0]).is_file(), mtime, str(recipe.parent), recipe.parent))
    if not found:
        raise KGCError(f"no trained link-prediction run under {root.resolve()} (a folder with recipe.yaml and "
                       "best.pt or checkpoints/last.pt). Train one with `kgc train RECIPE` (e.g. "
                       "`kgc train recipes/umls_biencoder.yaml`), or name the run: `kgc predict RUN_DIR …`.")
    return max(found)[3]


class LinkPredRun(Run):
    """A link-prediction run, its user verbs: ``evaluate`` / ``evaluation``, ``predict`` / ``answer`` (and
    ``resolve`` / ``answer_many`` / ``answer_records`` / ``predict_file``: many questions at once, as records), ``index``, ``add_entities``,
    ``train_structure``, ``embed_entities``, ``embed_queries``, ``explain_inputs``, ``serving``. The rest is on its
    two parts: ``run.predictor`` (the model, graph, tokenizer and structural model, loaded once: ``.model()``,
    ``.graph()``, ``.tokenizer()``, ``.resolve_head``, ``.nearest_entities``) and ``run.entities`` (the index:
    ``.searcher()``, ``.query_engine()``, ``.ensure()``)."""

    task = "linkpred"
    command = "kgc predict RUN --head … --relation …"

    def __init__(self, path: str | Path | RunDir, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.predictor = p = Predictor(self.dir, self.device, echo=self.echo)
        self.entities = EntityIndex(self.dir, self.device, model=p.model, graph=p.graph, tokenizer=p.tokenizer,
                                    batch_size=self.recipe.eval.batch_size, echo=self.echo)

    def evaluation(self, split: str | None = None, *, batch_size: int | None = None, progress: bool = False,
                   **options: Any) -> "Evaluation":
        """Filtered ranks of ``split`` (test or dev), both directions, in PyKEEN's layout (``.results``, ``.ranks``,
        ``.seconds``), written into the run (``results[.split].json``, ``ranks[.split].tsv``); fused with a structural
        model (α chosen on dev). ``options``: :class:`~kgc.linkpred.evaluation.options.EvalOptions`' fields
        (``rerank``; ``entities_from``, a KG-BERT folder, with ``candidates``: over its unseen entities, into
        ``results.inductive…``; ``use_index``: within the index's top ``top_k`` (100), re-scored exactly;
        ``text_only``: the text model alone, ``results.text…``; ``inductive``, ``negatives``, ``seed``), checked
        there. See :func:`kgc.linkpred.answer.results.evaluate_run`."""
        from kgc.linkpred.answer.results import evaluate_run, write_evaluation

        ev, split, kind = evaluate_run(self.predictor, self.entities, split, batch_size=batch_size, progress=progress,
                                       options=options, echo=self.echo)
        return self._save(ev, lambda: write_evaluation(self.dir, ev, split, kind), split, kind)  # refused: ResultsNotSaved

    def predict(self, head: str, relation: str, top_k: int | None = None, *, progress: bool = False,
                **options: Any) -> "pd.DataFrame":
        """Top-k answers to (head, relation, ?) as a DataFrame (rank, entity, name, text, score, known): the rows
        ``kgc predict`` prints. ``head``: entity id or text (an added entity too), or any free text (not with a
        structural model) — one spelt like an entity is a typo (:class:`kgc.errors.UnknownName`) unless
        ``free_text``; ``relation``: name or text; ``top_k`` and ``options``: :class:`QueryOptions`' (``inverse``,
        ``filter_known``, ``include_head``, ``free_text``). Ranked by the fused score with a structural model, else
        by cosine over the index (built first if missing or stale)."""
        return self.answer(head, relation, top_k, progress=progress, **options).frame()

    def answer(self, head: str, relation: str, top_k: int | None = None, *, progress: bool = False,
               **options: Any) -> Answers:
        """:meth:`predict` with the query as it was resolved and the time taken: the batch of one of
        :meth:`answer_many` (what ``kgc serve`` and ``kgc predict --input`` run)."""
        return self.answer_many([self.resolve(head, relation, top_k, progress=progress, **options)])[0]

    def resolve(self, head: str, relation: str, top_k: int | None = None, *, progress: bool = False,
                note: bool = True, **options: Any) -> Query:
        """A question as :meth:`answer_many` takes it (bad names and options raise KGCError); ``note``: say a
        free-text head on the run's echo, with its nearest entities."""
        checked = QueryOptions.of(options, **({} if top_k is None else {"top_k": top_k}))
        return self.predictor.resolve(head, relation, checked, self.entities, progress=progress, note=note)

    def answer_many(self, queries: Sequence[Query]) -> list[Answers]:
        """Answers to resolved queries (:meth:`resolve`), encoded in one pass and searched in one index call."""
        return self.predictor.answer_many(queries, self.entities)

    def answer_records(self, queries: Sequence[Query], answers: Sequence[Answers]) -> list[dict]:
        """Each answer as ``kgc predict --json`` prints it and ``POST /predict`` answers it — one record, the same
        fields (:func:`kgc.linkpred.answer.topk.answer_records`)."""
        return answer_records(self, queries, answers)

    def predict_file(self, path: str | Path, out: str | Path | None = None, **options: Any) -> dict:
        """``kgc predict RUN --input FILE`` (:func:`kgc.linkpred.answer.topk.predict_file`): ``head<TAB>relation``
        lines or JSONL objects (each may set its own options), one model load, ``batch_size`` questions per pass;
        ``format`` jsonl or tsv, ``out`` (atomically) or ``echo``. Returns {questions, answers, seconds, per_second}."""
        from kgc.linkpred.answer.topk import predict_file

        return predict_file(self, path, out, **options)

    def index(self, *, type: str | None = None, force: bool = False, progress: bool = True, nproc: int | None = None,
              **params: int | None) -> dict:
        """Build, update or keep the run's index (``kgc index``): ``{"action": "none" | "search" | "build", "why",
        "meta"}``: the existing index's type (``type``: from the recipe's) with ``params`` (nlist, nprobe, hnsw_m,
        ef_search, ef_construction, pq_bytes, train_size) applied; ``force``: re-embed; ``nproc``: encode in shards,
        one per process (:mod:`kgc.linkpred.answer.sharded`, ``chunk_size`` entities per file; the answer adds ``shards``)."""
        return self.entities.update(type=type, force=force, progress=progress, nproc=nproc, **params)

    def drop_added(self, *, progress: bool = True) -> dict:
        """Remove every entity added to the run (``kgc index --drop-added``): the index is rebuilt with the graph's
        entities only and the copies of record in ``RUN/added/`` are removed; the only call that removes them.
        Returns index/meta.json with ``dropped`` and ``note``."""
        return self.entities.drop_added(progress=progress)

    def add_entities(self, path: str | Path, *, progress: bool = True, guard=None, batch_size: int | None = None,
                     keep_loaded: bool = False) -> dict:
        """Embed the entities of a TSV (``id<TAB>name<TAB>description``) and append them to the index in one
        transaction, under the run's lock (``kgc index --add``); returns index/meta.json. ``guard``: each batch runs
        inside ``guard()``; ``keep_loaded``: keep the loaded index (the caller swaps in a fork of ``run.entities``)."""
        return self.entities.add(path, progress=progress, guard=guard, keep_loaded=keep_loaded,
                                 batch_size=batch_size or self.recipe.eval.batch_size)

    def train_structure(self, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                        progress: bool = True, **kwargs: Any) -> dict:
        """(Re)train only the structural model (``RUN/structure/``; ``kgc structure``) from the run's ``structure:``
        section with ``structure.*`` overrides (``structure__epochs=200`` or ``{"structure.epochs": 200}``)."""
        return self.predictor.train_structure(overrides, progress=progress, **kwargs)

    def embed_entities(self, ids_or_texts: str | Sequence[str], *, batch_size: int = 256) -> "np.ndarray":
        """(n, dim) float32 tail-tower embeddings (unit vectors) of entity ids (the index's rows) or texts."""
        return self.predictor.embed_entities(ids_or_texts, batch_size=batch_size)

    def embed_queries(self, heads: str | Sequence[str], relations: str | Sequence[str], *, inverse: bool = False,
                      batch_size: int = 256, free_text: bool = False) -> "np.ndarray":
        """(n, dim) float32 query embeddings g(head | relation); one relation string applies to every head."""
        return self.predictor.embed_queries(heads, relations, inverse=inverse, batch_size=batch_size,
                                            free_text=free_text)

    def explain_inputs(self, *, head: str | None = None, relations: Sequence[str] = (), inverse: bool = False,
                       sentence: str | None = None, conditions: Sequence[str] = ()) -> ExplainInputs:
        """The head's text and the relations (default: every relation) for ``kgc explain``."""
        if sentence is not None or conditions:
            raise KGCError("--sentence/--condition are for C-STS runs; for link prediction give --head and --relation")
        return self.predictor.explain_inputs(head=head, relations=relations, inverse=inverse,
                                             loaded=self.entities.loaded())

    def serving(self):
        """``kgc serve``'s link-prediction routes and page (:mod:`kgc.linkpred.answer.routes`)."""
        from kgc.linkpred.answer.routes import LinkPredServing

        return LinkPredServing(self)
