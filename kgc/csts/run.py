"""A C-STS run, as ``kgc.load`` returns it: evaluate a split, score sentence pairs under conditions."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from kgc.errors import KGCError
from kgc.fileio import write_json, write_tsv
from kgc.training.run import ExplainInputs, Run, as_list


class CSTSRun(Run):
    """A C-STS run directory: ``evaluate`` / ``evaluation``, ``similarity``, ``score``."""

    task = "csts"
    command = "kgc similarity RUN --s1 … --s2 … --condition …"

    def data(self):
        from kgc.csts.data import load_csts

        d = self.recipe.data
        return load_csts(d.dataset, d.path, d.synth)

    def model(self):
        """(model, tokenizer) with the run's best weights, in eval mode, on the run's device; loaded once."""
        if not hasattr(self, "_model"):
            from kgc.csts.model import build_model

            model, tokenizer = build_model(self.recipe, self.dir.backbone, pretrained=self.dir.pretrained)
            self.dir.load_weights(model)
            model.attach_layer_cache(self.recipe)
            model = model.to(self.device).eval()
            model.choose_precision(self.recipe)  # train.amp on this machine
            self._model = (model, tokenizer)
        return self._model

    def evaluation(self, split: str | None = None, *, batch_size: int | None = None, progress: bool = False,
                   **options: Any):
        """Spearman, Pearson, pair accuracy and MSE on ``split`` (test, validation or train): ``.results``,
        ``.predictions``, ``.seconds``; ``results[.split].json`` and ``predictions[.split].tsv`` are written."""
        from kgc.csts.evaluate import evaluate
        from kgc.csts.model import Texts

        split = split or "test"
        if options:  # rerank, entities_from, use_index …: link prediction's
            raise KGCError(f"{', '.join(sorted(options))}: link-prediction option(s); {self.path} is a C-STS run "
                           "(it evaluates a split: test, validation or train)")
        if split not in ("test", "validation", "train"):
            raise KGCError(f"split {split!r}: a C-STS run has test, validation and train")
        model, tokenizer = self.model()
        data = self.data()
        ev = evaluate(model, Texts(data, tokenizer), data, split, batch_size=batch_size or self.recipe.eval.batch_size,
                      progress=progress)
        def write() -> None:
            write_json(self.dir.results(split), ev.results)
            write_tsv(self.dir.table("predictions", split), ev.predictions)

        return self._save(ev, write, split)  # a folder that refuses them: ResultsNotSaved, carrying the figures

    def similarity(self, s1: str | Sequence[str], s2: str | Sequence[str], condition: str | Sequence[str], *,
                   batch_size: int = 64) -> "float | np.ndarray":
        """cos(g(s1 | c), g(s2 | c)): a float for three strings, an array for lists (a single string among
        lists applies to every row). The 1-5 label scale is ``1 + 4 * clip(cos, 0, 1)``."""
        from kgc.csts.predict import similarities

        model, tokenizer = self.model()
        given = [as_list(x) for x in (s1, s2, condition)]
        n = max(len(c) for c, _ in given)
        cols = [c * n if single else c for c, single in given]
        if any(len(c) != n for c in cols):
            raise KGCError(f"similarity: s1, s2 and condition have {', '.join(str(len(c)) for c in cols)} rows; "
                           "give lists of one length (or single strings)")
        for name, col in zip(("s1", "s2", "condition"), cols):
            if any(not isinstance(x, str) or not x.strip() for x in col):
                raise KGCError(f"similarity: every {name} must be a non-empty string")
        sims = similarities(model, tokenizer, *cols, batch_size=batch_size)
        return float(sims[0]) if all(single for _, single in given) else sims

    def score(self, rows: Sequence[Mapping[str, Any]], *, batch_size: int = 64) -> list[dict]:
        """``kgc similarity --tsv``: rows with sentence1, sentence2, condition (label optional), each returned with
        ``similarity`` (cosine) and ``predicted_label`` (1-5 scale)."""
        from kgc.csts.predict import score

        model, tokenizer = self.model()
        for i, row in enumerate(rows):
            missing = [k for k in ("sentence1", "sentence2", "condition") if not isinstance(row.get(k), str)]
            if missing:
                raise KGCError(f"score: row {i} has no {', '.join(missing)} (strings)")
        return score(model, tokenizer, [dict(r) for r in rows], batch_size=batch_size)

    def explain_inputs(self, *, head: str | None = None, relations: Sequence[str] = (), inverse: bool = False,
                       sentence: str | None = None, conditions: Sequence[str] = ()) -> ExplainInputs:
        """The sentence and the conditions for ``kgc explain``."""
        if head is not None or relations or inverse:
            raise KGCError("--head/--relation/--inverse are for link-prediction runs; for C-STS give --sentence and "
                           "--condition")
        if not conditions:
            raise KGCError('give at least one --condition, e.g. --condition "The colour of the car."')
        model, tokenizer = self.model()
        ids = None if sentence is None else tokenizer(sentence, add_special_tokens=False)["input_ids"]
        return ExplainInputs(model.conditioner, tokenizer, ids, sentence or "",
                             tokenizer(list(conditions), add_special_tokens=False)["input_ids"], list(conditions),
                             "give --sentence: the router weighs its tokens")

    def serving(self):
        """``kgc serve``'s C-STS route (``POST /similarity``) and page (:mod:`kgc.csts.routes`)."""
        from kgc.csts.routes import CSTSServing

        return CSTSServing(self)
