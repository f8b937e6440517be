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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from kgc.errors import KGCError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from kgc.recipe import Recipe

RecipeLike = Union[str, Path, "Recipe", Mapping[str, Any]]

PREDICTION_COLUMNS = ["rank", "entity", "text", "score"]


# ---------------------------------------------------------------- recipes and overrides


def _override_keys(overrides: Mapping[str, Any] | Sequence[str] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted key → value from ``overrides`` (mapping or ``key=value`` strings) and ``section__key`` kwargs."""
    from kgc.recipe import parse_overrides

    out: dict[str, Any] = {}
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        items = list(parse_overrides(list(overrides or [])).items())  # the --set syntax, values as YAML
    items += [(k.replace("__", "."), v) for k, v in kwargs.items()]
    for key, value in items:
        parse_overrides([f"{key}="])  # an unknown key: the same KGCError as --set
        out[key] = value
    return out


def resolve_recipe(recipe: RecipeLike, overrides: Mapping[str, Any] | Sequence[str] | None = None,
                   **kwargs: Any) -> "Recipe":
    """A validated :class:`~kgc.recipe.Recipe` from a path, a Recipe or a dict, with overrides applied."""
    from pydantic import ValidationError

    from kgc.recipe import Recipe, _explain, _set_dotted, load_recipe

    if isinstance(recipe, (str, Path)):
        tree, source = load_recipe(recipe).model_dump(mode="json", exclude_unset=True), str(recipe)
    elif isinstance(recipe, Recipe):
        tree, source = recipe.model_dump(mode="json", exclude_unset=True), "recipe"
    elif isinstance(recipe, Mapping):
        tree, source = copy.deepcopy(dict(recipe)), "recipe"
    else:
        raise KGCError(f"recipe: expected a path to a YAML recipe, a kgc.recipe.Recipe or a dict, got "
                       f"{type(recipe).__name__}")
    for key, value in _override_keys(overrides, kwargs).items():
        _set_dotted(tree, key, value)
    try:
        return Recipe.model_validate(tree)
    except ValidationError as err:
        raise _explain(err, source) from None


# ---------------------------------------------------------------- train / load


def train(recipe: RecipeLike, out: str | Path | None = None, *, progress: bool = True,
          overrides: Mapping[str, Any] | Sequence[str] | None = None, data: Any = None, validation: Any = None,
          testing: Any = None, texts: Mapping[str, str] | None = None,
          relation_texts: Mapping[str, str] | None = None, device: str = "cpu", **kwargs: Any) -> "Run":
    """Train a recipe (path, Recipe or dict) into ``out`` (default ``runs/<name>-<time>``) and return the Run.

    ``data``: a PyKEEN ``TriplesFactory`` (with optional ``validation=`` / ``testing=`` factories) or dataset
    instance; it is written as a KG-BERT folder ``out/data`` and ``data.path`` points there. Texts are the
    labels (``_`` → space) unless ``texts`` / ``relation_texts`` map a label to its text. Without validation
    triples no validation runs (the final weights are the model); without test triples ``evaluate("test")``
    has nothing to rank. ``device`` is where the returned Run loads its model (training: ``train.device``).
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
    return Run(run_train(rec, out=Path(out) if out is not None else None, progress=progress), device=device)


def load(run_dir: str | Path, *, device: str = "cpu") -> "Run":
    """The trained run in ``run_dir`` (link prediction or C-STS)."""
    return Run(run_dir, device=device)


def _as_list(x: Any) -> tuple[list, bool]:
    """(items, was a single string)."""
    if isinstance(x, str):
        return [x], True
    return list(x), False


# ---------------------------------------------------------------- the run


class Run:
    """A run directory: ``path``, ``recipe``, ``task``; link prediction: ``evaluate``, ``predict``,
    ``embed_entities``, ``embed_queries``; C-STS: ``evaluate``, ``similarity``."""

    def __init__(self, path: str | Path, *, device: str = "cpu") -> None:
        from kgc.training.common import pick_device
        from kgc.training.run import open_run

        self._dir = open_run(path)  # a missing or foreign folder fails here, with the fix
        self.path: Path = self._dir.path
        self.recipe: "Recipe" = self._dir.recipe
        self.device = pick_device(device)
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
            raise KGCError(f"Run.{method}() needs a {'C-STS' if task == 'csts' else 'link-prediction'} run; "
                           f"{self.path} is a {self.task} run (it offers {use})")

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

            ensure_index(self._dir, model, graph, progress=progress)
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
                 progress: bool = False) -> dict:
        """Evaluate on ``split`` and return the dict written to ``results[.split].json``: PyKEEN's layout for
        link prediction (``results["both"]["realistic"]["inverse_harmonic_mean_rank"]``, a ``"kgc"`` block of
        extras), Spearman/Pearson for C-STS. Link prediction: test or dev; C-STS: test, validation or train."""
        if self.task == "csts":
            from kgc.csts.evaluate import evaluate_run as evaluate_csts

            if split not in ("test", "validation", "train"):
                raise KGCError(f"split {split!r}: a C-STS run has test, validation and train")
            if rerank is not None:
                raise KGCError("rerank is link prediction's graph re-ranking; a C-STS run has none")
            return evaluate_csts(self._dir, split, device=self.device, batch_size=batch_size,
                                 progress=progress).results
        from kgc.linkpred.evaluate import evaluate_run

        if split not in ("test", "dev"):
            raise KGCError(f"split {split!r}: choose test or dev")
        model, graph = self._linkpred()
        if not len(graph.splits[split]):
            raise KGCError(f"{graph.source}: the {split} split has no triples to rank (train with testing= / "
                           "validation= factories, or a dataset with that split)")
        return evaluate_run(_Loaded(self), split, device=self.device, batch_size=batch_size, rerank=rerank,
                            progress=progress).results

    # -- link prediction

    def predict(self, head: str, relation: str, top_k: int = 10, *, inverse: bool = False,
                filter_known: bool = False, progress: bool = False) -> "pd.DataFrame":
        """Top-k answers to (head, relation, ?) — ``inverse``: (?, relation, head) — as a DataFrame with columns
        rank, entity, text, score (cosine), the rows ``kgc predict`` prints. ``head``: entity id or text;
        ``relation``: name or text. The run's index is built first if it has none (as ``kgc predict`` does)."""
        import pandas as pd

        from kgc.linkpred.predict import answer

        self._need("linkpred", "predict")
        model, graph, index = self._predictor(progress)
        model.bank = self._cache["full_bank"]
        try:  # as `kgc predict`: fused with the structural model when the run has one
            _, _, preds = answer(self._dir, model, graph, index, head=head, relation=relation, top_k=top_k,
                                 inverse=inverse, filter_known=filter_known)
        finally:
            model.bank = self._cache["bank"]
        return pd.DataFrame([{c: getattr(p, c) for c in PREDICTION_COLUMNS} for p in preds],
                            columns=PREDICTION_COLUMNS)

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
        import numpy as np
        import torch

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
        tok = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in cols]
        with torch.no_grad():
            sims = np.concatenate([model.similarity(*(t[k: k + batch_size] for t in tok)).cpu().numpy()
                                   for k in range(0, n, batch_size)]) if n else np.empty(0, dtype=np.float32)
        if all(single for _, single in [_as_list(x) for x in (s1, s2, condition)]):
            return float(sims[0])
        return sims.astype(np.float32)


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
