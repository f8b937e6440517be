"""The Python API: ``kgc.train`` / ``kgc.load`` return a :class:`Run`, which answers what the CLI answers.

    import kgc
    run = kgc.train("recipes/umls_biencoder.yaml", train__max_steps=10)
    run.evaluate()["both"]["realistic"]["inverse_harmonic_mean_rank"]
    run.predict("C0001175", "affects", top_k=5)          # a pandas DataFrame
    run = kgc.load("runs/umls_biencoder-…")              # any run directory, later

Recipe overrides are keyword arguments with ``__`` between section and key (``train__max_steps=10`` is
``--set train.max_steps=10``; Python names cannot hold dots), or the same keys dotted in ``overrides=``
(``{"train.max_steps": 10}`` or ``["train.max_steps=10"]``, the ``--set`` syntax). Unknown keys fail exactly as
``--set`` does. The model, graph, tokenizer and index are loaded on first use and kept on the Run.
"""

from __future__ import annotations

import copy
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, Union

from kgc.errors import KGCError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from kgc.recipe import Recipe

RecipeLike = Union[str, Path, "Recipe", Mapping[str, Any]]

PREDICTION_COLUMNS = ["rank", "entity", "text", "score"]
Echo = Callable[[str], None]


@dataclass
class Answers:
    """:meth:`Run.answer`: the query as it was resolved and its ranked answers (what ``kgc predict`` prints)."""
    run: Path
    head: str                # entity id (the text given was resolved to it)
    relation: str            # relation label; ``inverse`` answers (?, relation, head)
    head_text: str           # the head's full text
    relation_text: str       # the relation's text, "inverse …" for the inverse direction
    predictions: list        # kgc.linkpred.predict.Prediction: rank, entity, text, score
    seconds: float           # answering, index loading excluded

    def frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame([{c: getattr(p, c) for c in PREDICTION_COLUMNS} for p in self.predictions],
                            columns=PREDICTION_COLUMNS)


# ---------------------------------------------------------------- recipes and overrides


def _override_keys(overrides: Mapping[str, Any] | Sequence[str] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted key → value from ``overrides`` (mapping or ``key=value`` strings) and ``section__key`` kwargs."""
    from kgc.recipe import parse_overrides, valid_keys

    known = set(valid_keys())
    out: dict[str, Any] = {}
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        items = list(parse_overrides(list(overrides or [])).items())  # the --set syntax, values as YAML
    items += [(k.replace("__", "."), v) for k, v in kwargs.items()]
    for key, value in items:
        if key not in known:
            parse_overrides([f"{key}="])  # raises the same KGCError as an unknown --set key
        out[key] = value
    return out


def resolve_recipe(recipe: RecipeLike, overrides: Mapping[str, Any] | Sequence[str] | None = None,
                   **kwargs: Any) -> "Recipe":
    """A validated :class:`~kgc.recipe.Recipe` from a path, a Recipe or a dict, with overrides applied."""
    from kgc.recipe import Recipe, read_recipe_tree, validate_recipe

    if isinstance(recipe, (str, Path)):
        tree, source = read_recipe_tree(recipe), str(recipe)
    elif isinstance(recipe, Recipe):
        tree, source = recipe.model_dump(mode="json", exclude_unset=True), "recipe"
    elif isinstance(recipe, Mapping):
        tree, source = copy.deepcopy(dict(recipe)), "recipe"
    else:
        raise KGCError(f"recipe: expected a path to a YAML recipe, a kgc.recipe.Recipe or a dict, got "
                       f"{type(recipe).__name__}")
    return validate_recipe(tree, _override_keys(overrides, kwargs), source=source)


# ---------------------------------------------------------------- train / load


def train(recipe: RecipeLike, out: str | Path | None = None, *, progress: bool = True,
          overrides: Mapping[str, Any] | Sequence[str] | None = None, data: Any = None, validation: Any = None,
          testing: Any = None, texts: Mapping[str, str] | None = None,
          relation_texts: Mapping[str, str] | None = None, device: str = "cpu", echo: Echo | None = print,
          **kwargs: Any) -> "Run":
    """Train a recipe (path, Recipe or dict) into ``out`` (default ``runs/<name>-<time>``) and return the Run.

    ``data``: a PyKEEN ``TriplesFactory`` (with optional ``validation=`` / ``testing=`` factories) or dataset
    instance; it is written as a KG-BERT folder ``out/data`` and ``data.path`` points there. Texts are the
    labels (``_`` → space) unless ``texts`` / ``relation_texts`` map a label to its text. Without validation
    triples no validation runs (the final weights are the model); without test triples ``evaluate("test")``
    has nothing to rank. ``device`` is where the returned Run loads its model (training: ``train.device``).
    ``echo`` receives the progress lines (run directory, validations, the final test); ``None`` silences them.
    """
    from kgc.training.loop import _prepare_new_run, default_run_dir, train as run_train

    rec = resolve_recipe(recipe, overrides, **kwargs)
    if data is None:
        if validation is not None or testing is not None or texts is not None or relation_texts is not None:
            raise KGCError("validation=, testing=, texts= and relation_texts= go with data= (PyKEEN triples)")
    else:
        from kgc.data.from_pykeen import write_kgbert

        if rec.task != "linkpred":
            raise KGCError("data= takes PyKEEN triples, for link prediction; this recipe has task csts")
        run_dir = Path(out) if out is not None else default_run_dir(rec)
        fresh = not run_dir.exists()
        run_dir = _prepare_new_run(rec, run_dir)
        try:
            counts = write_kgbert(run_dir / "data", data, validation=validation, testing=testing, texts=texts,
                                  relation_texts=relation_texts)
        except BaseException:  # bad triples or labels: nothing half-written stays
            shutil.rmtree(run_dir if fresh else run_dir / "data", ignore_errors=True)
            raise
        update: dict[str, Any] = {"dataset": str((run_dir / "data").resolve()),
                                  "path": str((run_dir / "data").resolve())}
        rec = rec.model_copy(update={"data": rec.data.model_copy(update=update)})
        if not counts["dev"]:
            rec = rec.model_copy(update={"eval": rec.eval.model_copy(
                update={"validate_every_epoch": False, "validate_every_steps": None})})
        rec = resolve_recipe(rec)  # validated again, as a whole
        out = run_dir
    echo = echo or _silent
    return Run(run_train(rec, out=Path(out) if out is not None else None, progress=progress, echo=echo),
               device=device, echo=echo)


def resume(run_dir: str | Path, *, progress: bool = True, device: str = "cpu", echo: Echo | None = print) -> "Run":
    """Continue an interrupted run from its last checkpoint (its saved recipe; ``kgc train --resume``)."""
    from kgc.training.loop import train as run_train

    echo = echo or _silent
    return Run(run_train(None, resume=Path(run_dir), progress=progress, echo=echo), device=device, echo=echo)


def load(run_dir: str | Path | None = None, *, device: str = "cpu", echo: Echo | None = print) -> "Run":
    """The trained run in ``run_dir`` (link prediction or C-STS); ``None``: the link-prediction run under
    ``./runs`` whose weights were written last (as ``kgc predict`` without a run directory), named via ``echo``."""
    echo = echo or _silent
    if run_dir is None:
        from kgc.linkpred.prepare import find_latest_run

        run_dir = find_latest_run()
        echo(f"using the newest run: {run_dir}")
    return Run(run_dir, device=device, echo=echo)


def _silent(msg: str) -> None:
    pass


def _as_list(x: Any) -> tuple[list, bool]:
    """(items, was a single string)."""
    if isinstance(x, str):
        return [x], True
    return list(x), False


# ---------------------------------------------------------------- the run


class Run:
    """A run directory: ``path``, ``recipe``, ``task``; link prediction: ``evaluate``, ``predict``,
    ``embed_entities``, ``embed_queries``; C-STS: ``evaluate``, ``similarity``."""

    def __init__(self, path: str | Path, *, device: str = "cpu", echo: Echo | None = print) -> None:
        from kgc.training.common import pick_device
        from kgc.training.run import open_run

        self._dir = open_run(path)  # a missing or foreign folder fails here, with the fix
        self.path: Path = self._dir.path
        self.recipe: "Recipe" = self._dir.recipe
        self.device = pick_device(device)
        self._echo: Echo = echo or _silent
        self._cache: dict[str, Any] = {}

    @property
    def task(self) -> str:
        return self.recipe.task

    def __repr__(self) -> str:
        return f"kgc.Run({str(self.path)!r}, task={self.task!r})"

    def _need(self, task: str, method: str) -> None:
        if self.task != task:
            use = ("similarity(s1, s2, condition) and evaluate()" if self.task == "csts" else
                   "predict, embed_entities, embed_queries and evaluate()")
            hint = ("kgc similarity RUN --s1 … --s2 … --condition …" if self.task == "csts" else
                    "kgc predict RUN --head … --relation …")
            raise KGCError(f"Run.{method}() needs a {'C-STS' if task == 'csts' else 'link-prediction'} run; "
                           f"{self.path} is a {self.task} run, not {task}; use `{hint}` (in Python it offers "
                           f"{use})")

    # -- loading, once

    def _linkpred(self):
        """(model, graph) of the run's own dataset; the model's TextBank is the graph's own (no added entities)."""
        self._need("linkpred", "load")
        if "model" not in self._cache:
            self._cache["model"], self._cache["graph"] = self._dir.load(self.device)
            self._cache["bank"] = self._cache["model"].bank
        model = self._cache["model"]
        model.bank = self._cache["bank"]
        return model, self._cache["graph"]

    def _tokenizer(self):
        if "tokenizer" not in self._cache:
            from kgc.encoding.backbone import load_tokenizer

            self._cache["tokenizer"] = load_tokenizer(self._dir.backbone)
        return self._cache["tokenizer"]

    def _predictor(self, progress: bool):
        """(model, graph with added entities, FAISS index); the index is built first when missing or stale."""
        model, graph = self._linkpred()
        if "index" not in self._cache:
            from kgc.linkpred.index import load_index
            from kgc.linkpred.inductive import attach_added
            from kgc.linkpred.prepare import ensure_index

            ensure_index(self._dir, model, graph, progress=progress, echo=self._echo)
            self._cache["index"] = load_index(self._dir, model, faiss_device="cpu" if self.device.type == "cpu"
                                              else "auto")
            self._cache["full_graph"] = attach_added(self._dir, model, graph)
            self._cache["full_bank"] = model.bank
            model.bank = self._cache["bank"]
        return model, self._cache["full_graph"], self._cache["index"]

    def _csts(self):
        self._need("csts", "similarity")
        if "csts" not in self._cache:
            self._cache["csts"] = self._dir.load(self.device)
        return self._cache["csts"]

    # -- both tasks

    def evaluate(self, split: str = "test", *, batch_size: int | None = None, rerank: bool | None = None,
                 progress: bool = False, **options: Any) -> dict:
        """Evaluate on ``split`` and return the dict written to ``results[.split].json``: PyKEEN's layout for
        link prediction (``results["both"]["realistic"]["inverse_harmonic_mean_rank"]``, a ``"kgc"`` block of
        extras), Spearman/Pearson for C-STS. Link prediction: test or dev; C-STS: test, validation or train.
        ``options``: those of :meth:`evaluation` (``entities_from``, ``candidates``, ``use_index``, ``top_k``)."""
        return self.evaluation(split, batch_size=batch_size, rerank=rerank, progress=progress, **options).results

    def evaluation(self, split: str = "test", *, batch_size: int | None = None, rerank: bool | None = None,
                   progress: bool = False, entities_from: str | Path | None = None, candidates: str = "split",
                   use_index: bool = False, top_k: int = 100):
        """:meth:`evaluate` with its ranks / predictions and timing (``kgc evaluate``): ``.results``, ``.ranks``
        (``.predictions`` for C-STS), ``.seconds``; results.json and ranks.tsv are written into the run.

        Link prediction only: ``entities_from`` (a KG-BERT folder, e.g. from ``kgc data inductive-split``) ranks
        its ``split`` triples over its own entities, unseen in training — ``candidates`` ``"split"`` (the entities
        of the split's triples, SimKGC's protocol) or ``"all"`` — into ``results.inductive[.split].json``;
        ``use_index`` ranks within the top ``top_k`` of the run's FAISS index, re-scored exactly."""
        if use_index and (entities_from is not None or self.task != "linkpred"):
            raise KGCError("use_index (--use-index) evaluates a link-prediction run against its own FAISS index; "
                           "drop it here")
        if self.task == "csts":
            from kgc.csts.evaluate import evaluate_run as evaluate_csts

            if entities_from is not None:
                raise KGCError("entities_from (--entities-from) is inductive link prediction; this is a C-STS run")
            if split not in ("test", "validation", "train"):
                raise KGCError(f"split {split!r}: a C-STS run has test, validation and train")
            if rerank is not None:
                raise KGCError("rerank is link prediction's graph re-ranking; a C-STS run has none")
            return evaluate_csts(self._dir, split, device=self.device, batch_size=batch_size, progress=progress)
        if split not in ("test", "dev"):
            raise KGCError(f"split {split!r}: choose test or dev")
        if entities_from is not None:
            from kgc.linkpred.inductive import evaluate_inductive

            return evaluate_inductive(_Loaded(self), entities_from, split=split, candidates=candidates,
                                      device=self.device, batch_size=batch_size, rerank=rerank, progress=progress,
                                      warn=self._echo)
        from kgc.linkpred.evaluate import evaluate_run

        _, graph = self._linkpred()
        if not len(graph.splits[split]):
            raise KGCError(f"{graph.source}: the {split} split has no triples to rank (train with testing= / "
                           "validation= factories, or a dataset with that split)")
        return evaluate_run(_Loaded(self), split, device=self.device, batch_size=batch_size, rerank=rerank,
                            progress=progress, use_index=use_index, top_k=top_k)

    # -- link prediction

    def predict(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
                filter_known: bool = False, progress: bool = False) -> "pd.DataFrame":
        """Top-k answers to (head, relation, ?) — ``inverse``: (?, relation, head) — as a DataFrame with columns
        rank, entity, text, score, the rows ``kgc predict`` prints. ``head``: entity id or text (an entity added
        with ``kgc index --add`` too); ``relation``: name or text. A run with a structural model ranks by the fused
        score, others by cosine over the FAISS index, which is built first if the run has none (or a stale one)."""
        return self.answer(head, relation, top_k, inverse=inverse, filter_known=filter_known,
                           progress=progress).frame()

    def answer(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
               filter_known: bool = False, progress: bool = False) -> Answers:
        """:meth:`predict` with the query as it was resolved (head id and text, relation) and the time taken."""
        from kgc.linkpred.predict import answer

        self._need("linkpred", "predict")
        model, graph, index = self._predictor(progress)
        model.bank = self._cache["full_bank"]
        start = time.perf_counter()
        try:  # as `kgc predict`: fused with the structural model when the run has one
            h, r, preds = answer(self._dir, model, graph, index, head=head, relation=relation, top_k=top_k,
                                 inverse=inverse, filter_known=filter_known)
        finally:
            model.bank = self._cache["bank"]
        return Answers(run=self.path, head=graph.entities[h], relation=graph.relation_label(r),
                       head_text=graph.full_texts[h], relation_text=graph.relation_text(r), predictions=preds,
                       seconds=time.perf_counter() - start)

    def index(self, *, type: str | None = None, force: bool = False, progress: bool = True,
              **params: int | None) -> dict:
        """Build, update or keep the run's FAISS index (``kgc index``) and say what was done:
        ``{"action": "none" | "search" | "build", "why": …, "meta": index/meta.json}``.

        Type and parameters are the existing index's (a first build: the recipe's ``index:`` section; ``type``
        starts again from the recipe's), with ``params`` (nlist, nprobe, hnsw_m, ef_search, ef_construction,
        pq_bytes, train_size) applied. A fresh index of that type is kept; a changed nprobe / ef_search is stored
        without a rebuild; anything else rebuilds, reusing the stored embeddings (``force``: re-embed)."""
        from kgc.linkpred.index import _read_meta, index_plan, stored_config, update_search_params
        from kgc.linkpred.index_types import index_config
        from kgc.linkpred.inductive import rebuild_index

        self._need("linkpred", "index")
        # an existing index keeps its type and build parameters (`kgc index RUN --nprobe 64` on an ivf index, or
        # a rebuild after retraining, must not turn it back into the recipe's type); `type` starts from the recipe
        stored = stored_config(self._dir) if type is None else None
        if stored is not None and params.get("nlist") is not None and params.get("train_size") is None:
            stored = stored.model_copy(update={"train_size": None})  # its train_size was 64·(old nlist)
        config = index_config(stored if stored is not None else self.recipe.index, type=type, **params)
        model, graph = self._linkpred()  # bad options stopped above, before the model is loaded
        action, why = index_plan(self._dir, model, config)
        if force:
            action = "build"
        if action == "none":
            meta = _read_meta(self.path / "index")
        elif action == "search":
            meta = update_search_params(self._dir, model, config)
        else:
            meta = rebuild_index(self._dir, model, graph, progress=progress, config=config,
                                 reuse_embeddings=not force, faiss_device="cpu" if self.device.type == "cpu" else "auto")
        self._forget_index()
        return {"action": action, "why": why, "meta": meta}

    def add_entities(self, path: str | Path, *, progress: bool = True) -> dict:
        """Embed the entities of a TSV (``id<TAB>name<TAB>description``) with the trained tail tower and append them
        to the index (built first if missing), no retraining (``kgc index --add``); returns index/meta.json."""
        from kgc.linkpred.inductive import add_entities
        from kgc.linkpred.prepare import ensure_index

        self._need("linkpred", "add_entities")
        model, graph = self._linkpred()
        ensure_index(self._dir, model, graph, progress=progress, echo=self._echo)
        try:
            return add_entities(self._dir, model, graph, path, batch_size=self.recipe.eval.batch_size,
                                progress=progress)
        finally:  # the index on disk changed (or may have, if the add failed half-way)
            self._forget_index()

    def _forget_index(self) -> None:
        for key in ("index", "full_graph", "full_bank"):
            self._cache.pop(key, None)

    def train_structure(self, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                        progress: bool = True, **kwargs: Any) -> dict:
        """(Re)train only the structural PyKEEN model (``RUN/structure/``; ``kgc structure``), from the run's
        ``structure:`` section (defaults if it has none) with ``structure.*`` overrides
        (``structure__epochs=200`` or ``{"structure.epochs": 200}``). Returns its meta (model, train_seconds …)."""
        from kgc.linkpred.structure import train_run_structure
        from kgc.recipe import StructureConfig

        self._need("linkpred", "train_structure")
        changes = _override_keys(overrides, kwargs)
        bad = [k for k in changes if not k.startswith("structure.")]
        if bad:
            raise KGCError(f"{bad[0]}: only structure.* keys change the structural model (`kgc structure RUN "
                           "--set structure.KEY=VALUE`, Run.train_structure(structure__KEY=VALUE))")
        config = self.recipe.structure
        if changes:
            base = {"task": "linkpred", "structure": config.model_dump(mode="json") if config else {}}
            config = resolve_recipe(base, changes).structure
        return train_run_structure(self._dir, config=config or StructureConfig(), progress=progress,
                                   echo=self._echo)

    def export(self, out: str | Path, *, format: str = "sentence-transformers", force: bool = False) -> dict:
        """Write the towers as a sentence-transformers (``SentenceTransformer(out)`` embeds entities) or Hugging
        Face (``format="hf"``) folder, with ``kgc.json`` saying how to compose queries (``kgc export``)."""
        from kgc.export import export_run

        return export_run(self.path, out, format=format, force=force)

    def embed_entities(self, ids_or_texts: str | Sequence[str], *, batch_size: int = 256) -> "np.ndarray":
        """(n, dim) float32 tail-tower embeddings (unit vectors). An entity id of the run's graph gets its
        evaluation-time embedding (the row of the entity table / index); any other string is embedded as a text,
        tokenised as entity texts are (``data.max_tokens``)."""
        import numpy as np
        import torch

        self._need("linkpred", "embed_entities")
        items, _ = _as_list(ids_or_texts)
        model, graph = self._linkpred()
        bank = model.bank
        rows = []
        for item in items:
            if not isinstance(item, str):
                raise KGCError(f"embed_entities: expected entity ids or texts (str), got {type(item).__name__}")
            e = graph.entity_index.get(item)
            rows.append(bank.entity_ids(e) if e is not None else None)
        texts = [i for i, r in enumerate(rows) if r is None]
        if texts:
            ids = self._tokenizer()([items[i] for i in texts], add_special_tokens=False)["input_ids"]
            for i, t in zip(texts, ids):
                rows[i] = t
        out = np.empty((len(items), model.tail_encoder.dim), dtype=np.float32)
        with torch.no_grad():
            for s in range(0, len(rows), batch_size):
                batch = bank.special.pad([bank.special.wrap(r, bank.max_tokens) for r in rows[s: s + batch_size]])
                batch = {k: v.to(model.device) for k, v in batch.items()}
                out[s: s + batch_size] = model.tail_encoder.encode_unique(batch).float().cpu().numpy()
        return out

    def embed_queries(self, heads: str | Sequence[str], relations: str | Sequence[str], *, inverse: bool = False,
                      batch_size: int = 256) -> "np.ndarray":
        """(n, dim) float32 query embeddings g(head | relation): heads by entity id or text (as ``kgc predict``
        resolves them), relations by name or text; one relation string applies to every head."""
        import numpy as np
        import torch

        self._need("linkpred", "embed_queries")
        hs, _ = _as_list(heads)
        rs, single = _as_list(relations)
        if single:
            rs = rs * len(hs)
        if len(rs) != len(hs):
            raise KGCError(f"embed_queries: {len(hs)} heads but {len(rs)} relations (give one relation, or one "
                           "per head)")
        model, graph = self._linkpred()
        h = [graph.find_entity(x) for x in hs]
        r = [graph.find_relation(x) + (graph.num_relations if inverse else 0) for x in rs]
        out = np.empty((len(hs), model.tail_encoder.dim), dtype=np.float32)
        with torch.no_grad():
            for s in range(0, len(h), batch_size):
                out[s: s + batch_size] = model.encode_queries(h[s: s + batch_size],
                                                              r[s: s + batch_size]).float().cpu().numpy()
        return out

    # -- C-STS

    def similarity(self, s1: str | Sequence[str], s2: str | Sequence[str], condition: str | Sequence[str], *,
                   batch_size: int = 64) -> "float | np.ndarray":
        """cos(g(s1 | c), g(s2 | c)): a float for three strings, an array for lists (a single string among
        lists applies to every row). The 1-5 label scale is ``1 + 4 * clip(cos, 0, 1)``."""
        from kgc.csts.predict import similarities

        model, tokenizer = self._csts()
        cols = [_as_list(x) for x in (s1, s2, condition)]
        n = max(len(c) for c, _ in cols)
        cols = [c * n if single else c for c, single in cols]
        if any(len(c) != n for c in cols):
            raise KGCError(f"similarity: s1, s2 and condition have {', '.join(str(len(c)) for c in cols)} rows; "
                           "give lists of one length (or single strings)")
        for name, col in zip(("s1", "s2", "condition"), cols):
            if any(not isinstance(x, str) or not x.strip() for x in col):
                raise KGCError(f"similarity: every {name} must be a non-empty string")
        sims = similarities(model, tokenizer, *cols, batch_size=batch_size)
        if all(single for _, single in [_as_list(x) for x in (s1, s2, condition)]):
            return float(sims[0])
        return sims

    def score(self, rows: Sequence[Mapping[str, Any]], *, batch_size: int = 64) -> list[dict]:
        """``kgc similarity --tsv``: rows with sentence1, sentence2, condition (label optional), each returned with
        ``similarity`` (cosine) and ``predicted_label`` (1-5 scale)."""
        from kgc.csts.predict import score

        model, tokenizer = self._csts()
        for i, row in enumerate(rows):
            missing = [k for k in ("sentence1", "sentence2", "condition") if not isinstance(row.get(k), str)]
            if missing:
                raise KGCError(f"score: row {i} has no {', '.join(missing)} (strings)")
        return score(model, tokenizer, [dict(r) for r in rows], batch_size=batch_size)


class _Loaded:
    """The run directory as ``evaluate_run`` sees it, with ``load()`` answering the Run's cached model."""

    def __init__(self, run: Run) -> None:
        self._run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run._dir, name)

    def load(self, device: Any = "cpu", **kwargs: Any):
        if kwargs:
            return self._run._dir.load(device, **kwargs)
        return self._run._linkpred()
