"""The C-STS task: training (rows batched by sentence pair, MSE + Hyper-CL's contrastive term, dev Spearman)
and its hooks for the tools (recipe keys, run class, dataset check, evaluation report, compare row).

The loop itself is :func:`kgc.training.loop.train`, shared with link prediction. A batch holds
``train.batch_size // 2`` sentence pairs with all their rows (both conditions of a pair always share a
batch, so the contrastive term sees c_high and c_low together); its size counts rows.
"""

from __future__ import annotations

import math
from pathlib import Path

from typing import TYPE_CHECKING, List, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kgc.csts.recipe import CSTSRecipe
from kgc.recipe import Recipe
from kgc.training.task import ApiHooks, Counts, StepShape, Task, Training

if TYPE_CHECKING:  # imported where used: registering the task (every recipe's validation) stays light
    import torch

    from kgc.csts.loss import CSTSLoss
    from kgc.csts.model import Texts

class ExplainRequest(BaseModel):
    """``POST /explain`` on a C-STS run: the sentence's tokens under each condition (``kgc explain``)."""
    model_config = ConfigDict(extra="forbid")
    sentence: Optional[str] = Field(None, description="the sentence")
    conditions: List[str] = Field([], description="conditions")


def _read_pairs(path: str | Path) -> list[dict]:
    from kgc.csts.predict import read_queries

    return read_queries(Path(path))


def _write_pairs(path: str | Path | None, rows: list[dict], echo=print) -> None:
    from kgc.csts.predict import write_scores

    write_scores(None if path is None else Path(path), rows, echo=echo)


def _synth(out: str | Path, **options) -> None:
    from kgc.csts.synth import write_synthetic

    write_synthetic(Path(out), **options)


def _data_key(recipe: Recipe) -> str:
    d = recipe.data
    return f"{d.dataset}|{d.path}|{d.synth.model_dump() if d.dataset == 'synth-csts' else ''}"


class CSTSTask(Task):
    name = "csts"
    title = "C-STS"
    unit = "pairs"
    metric = "dev_spearman"
    dev_metrics = {"dev_spearman": "maximize", "dev_pearson": "maximize", "dev_pair_accuracy": "maximize"}
    recipe_class = CSTSRecipe
    distributed = False  # a batch is whole sentence-pair groups (c_high with c_low): one rank must see it whole
    splits = ("test", "validation", "train")
    compare_columns = ["recipe", "conditioner", "pooling", "data", "Spearman", "Pearson", "pair accuracy",
                       "trainable params", "total params", "train pairs/s", "train seconds", "eval seconds",
                       "cache bytes"]
    compare_metric = "Spearman"
    dataset_files = ("csts_train.csv",)
    # the lr and the contrastive term's τ (the recipes' 1.9 is Hyper-CL's; its paper reports 1.5-1.9)
    tune_space = {"train.lr": {"low": 1e-5, "high": 1e-3, "log": True},
                  "loss.contrastive_temperature": {"low": 0.5, "high": 4.0, "log": True}}

    @classmethod
    def tune_space_for(cls, recipe):
        """Without the contrastive term (``loss.contrastive: false``, as CASE's MSE recipes) its τ is not searched."""
        space = dict(cls.tune_space)
        if not recipe.loss.contrastive:
            space.pop("loss.contrastive_temperature")
        return space

    @classmethod
    def run_class(cls):
        from kgc.csts.run import CSTSRun

        return CSTSRun

    @classmethod
    def public_names(cls):
        from kgc.registry import lazy

        return {"CSTSRun": lazy("kgc.csts.run:CSTSRun")}

    @classmethod
    def datasets(cls) -> list:
        """The official C-STS CSVs (encrypted upstream) and the synthetic set kgc generates."""
        from kgc.data.catalog import CatalogEntry, Encrypted, Generated

        return [
            CatalogEntry("csts", "CSTS", "Conditional STS (Deshpande et al. 2023), official CSVs; encrypted upstream",
                         Encrypted("https://raw.githubusercontent.com/princeton-nlp/c-sts/main/data/csts.tar.enc",
                                   {f"csts_{s}.csv": None for s in ("train", "validation", "test")}),
                         probe=cls.dataset_files),
            CatalogEntry("synth-csts", "synth-csts", "synthetic conditional similarity, made by kgc "
                         "(`kgc data synth-csts OUT`)",
                         Generated("$KGC_CACHE_HOME/synth-csts (on first use)", command="kgc data synth-csts OUT"),
                         probe=cls.dataset_files),
        ]

    @classmethod
    def api_hooks(cls):
        """``kgc similarity --tsv``'s files, and ``kgc data synth-csts``."""
        return ApiHooks(read_pairs=_read_pairs, write_pairs=_write_pairs, synth=_synth)

    @classmethod
    def workload(cls, recipe: Recipe, counts, *, batch: int, global_batch: int) -> StepShape:
        """Each row's two sentences (and its condition, where the conditioner encodes it apart) through one tower;
        the scores: the row's cosine and its contrast pairs; every example's texts tokenised up front."""
        from kgc.conditioning.base import conditioner_class

        apart = conditioner_class(recipe.model.conditioner).encodes_conditions
        return StepShape(query_sequences=2.0 + (1.0 if apart else 0.0), score_columns=4,
                         texts=counts.examples if counts is not None else 0)

    @classmethod
    def explain_request(cls):
        return ExplainRequest

    @classmethod
    def check_dataset(cls, folder: Path) -> None:
        from kgc.csts.data import read_csts

        read_csts(folder)  # every row checked before a fetched folder is published

    @classmethod
    def check_data(cls, recipe: Recipe, dataset=None, *, strict: bool = False):
        """A :class:`kgc.csts.data.CSTSReport`: rows, labelled rows and sentence pairs per split, sentences and
        conditions, and what training would stumble on (pairs not asked twice, texts cut at data.max_tokens).
        ``strict`` changes nothing: C-STS has no leakage findings."""
        from kgc.csts.data import check_csts, find_csts, read_csts
        from kgc.data.texts import SpecialTokens
        from kgc.encoding.backbone import load_tokenizer, resolve_backbone

        d = recipe.data
        folder = find_csts(str(dataset)) if dataset is not None else find_csts(d.dataset, d.path, d.synth)
        data = read_csts(folder)
        tokenizer = load_tokenizer(resolve_backbone(recipe.model.backbone))
        extra = SpecialTokens.from_tokenizer(tokenizer).n_single
        lengths = {what: [len(ids) + extra for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
                   for what, texts in (("sentence", data.sentences), ("condition", data.conditions)) if texts}
        return check_csts(data, folder, lengths, d.max_tokens)

    @classmethod
    def report(cls, run, evaluation, split: str) -> list[str]:
        from kgc.csts.evaluate import format_summary

        r = evaluation.results
        lines = [f"{r['kgc']['dataset']} {split}: {r['rows']} rows ({r['labelled_rows']} labelled), "
                 f"{evaluation.seconds:.1f}s", format_summary(r)]
        if not r["labelled_rows"]:
            lines.append("no labels in this split (the public C-STS test set): predictions only")
        lines.append(f"wrote {run.dir.results(split)} and {run.dir.table('predictions', split)}")
        return lines

    @classmethod
    def compare_split(cls, recipe: Recipe, state: dict, echo) -> tuple[str, list[dict]]:
        """The test split when the dataset has test labels, else validation (the official test labels are
        hidden); before the first recipe of each dataset, the condition-blind baseline's row on that split."""
        key = _data_key(recipe)
        if key in state:
            return state[key], []
        split, row = _blind_row(recipe, echo)
        state[key] = split
        return split, [row]

    @classmethod
    def compare_row(cls, run, results: dict, summary: dict, seconds: float) -> dict:
        """The official C-STS test labels are hidden, so its rows are the validation split — the split best.pt was
        selected on when the run validated, which the data cell then says (the figure is optimistic)."""
        r = results
        selected = r["split"] == "validation" and summary.get(f"best_{cls.metric}") is not None
        data = f"{run.recipe.data.dataset} {r['split']}" + (" (best.pt selected on it)" if selected else "")
        return {"data": data, "Spearman": r["spearman"],
                "Pearson": r["pearson"], "pair accuracy": r["pair_accuracy"],
                "train pairs/s": summary["pairs_per_s"], "train seconds": round(seconds, 1)}


def _blind_row(recipe: Recipe, echo) -> tuple[str, dict]:
    """(the split to evaluate this recipe's dataset on — test when it has labels, else validation — and the
    condition-blind baseline's row there: plain sentence cosine of the recipe's untrained backbone)."""
    import time

    from kgc.csts.evaluate import condition_blind
    from kgc.encoding.backbone import resolve_backbone

    d = recipe.data
    start = time.perf_counter()
    from kgc.csts.data import load_csts

    data = load_csts(d.dataset, d.path, d.synth)
    split = "test" if "test" in data.splits and data.splits["test"].labelled.any() else "validation"
    r = condition_blind(data, resolve_backbone(recipe.model.backbone), split, max_tokens=d.max_tokens)
    seconds = time.perf_counter() - start
    rho = "n/a" if r["spearman"] is None else f"{r['spearman']:.4f}"
    echo(f"condition-blind baseline on {d.dataset}: {split} Spearman {rho}")
    return split, {"recipe": "(condition-blind)", "conditioner": "none: cos(f(s1), f(s2)), untrained",
                   "pooling": "mean", "data": f"{d.dataset} {split}", "Spearman": r["spearman"],
                   "Pearson": r["pearson"], "pair accuracy": r["pair_accuracy"], "trainable params": None,
                   "total params": None, "train pairs/s": None, "train seconds": None,
                   "eval seconds": round(seconds, 1), "cache bytes": None}


class CSTSTraining(Training):
    """Each row's two sentences under its condition through one tower; MSE to the scaled label plus the
    contrastive term within each condition group (:mod:`kgc.csts.loss`); dev Spearman."""

    def __init__(self, recipe: Recipe) -> None:
        super().__init__(recipe)
        d = recipe.data
        from kgc.csts.data import load_csts

        self.data = load_csts(d.dataset, d.path, d.synth)
        self.split = self.data.split("train")
        self.groups = self.split.groups
        self.per_batch = max(1, recipe.train.batch_size // 2)
        self.texts: "Texts | None" = None
        self.steps_per_epoch = math.ceil(len(self.groups) / self.per_batch)
        self.counts = Counts(examples=self.steps_per_epoch * recipe.train.batch_size, batch=recipe.train.batch_size)
        rows = ", ".join(f"{name} {len(split):,}" for name, split in self.data.splits.items())
        self.summary = [("", f"data: {self.data.source}: rows {rows}; {len(self.data.sentences):,} sentences, "
                             f"{len(self.data.conditions):,} conditions")]

    def build_model(self, backbone_folder: Path, *, pretrained: bool = True):
        from kgc.csts.model import Texts, build_model

        model, tokenizer = build_model(self.recipe, backbone_folder, pretrained=pretrained)
        self.texts = Texts(self.data, tokenizer)  # every sentence and condition tokenised once
        return model, tokenizer

    def make_loss(self, device) -> "CSTSLoss":
        from kgc.csts.loss import CSTSLoss

        loss = self.recipe.loss
        return CSTSLoss(mse_weight=loss.mse_weight, contrastive=loss.contrastive,
                        contrastive_weight=loss.contrastive_weight,
                        contrastive_temperature=loss.contrastive_temperature)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng(self.recipe.train.seed + epoch).permutation(len(self.groups))
        return [np.concatenate([self.groups[g] for g in order[i: i + self.per_batch]])
                for i in range(0, len(order), self.per_batch)]

    def batch_loss(self, model, criterion, batch: np.ndarray) -> "torch.Tensor":
        import torch

        from kgc.training.common import autocast

        sp, texts = self.split, self.texts
        with autocast(model.device, model.precision):  # the encoder may run in bf16 on CUDA; the loss not
            cosine = model.similarity([texts.sentences[i] for i in sp.s1[batch]],
                                      [texts.sentences[i] for i in sp.s2[batch]],
                                      [texts.conditions[i] for i in sp.cond[batch]])  # (rows,) fp32
        position = np.full(len(sp), -1)
        position[batch] = np.arange(len(batch))  # train row → row of this batch
        high, low = sp.contrast_pairs(batch)
        as_t = lambda x: torch.as_tensor(x, device=model.device)  # noqa: E731
        return criterion(cosine, as_t(sp.label[batch]).float(), as_t(position[high]), as_t(position[low]))

    def validate(self, model):
        from kgc.csts.evaluate import evaluate

        ev = evaluate(model, self.texts, self.data, "validation", batch_size=self.recipe.eval.batch_size,
                      max_groups=self.recipe.eval.dev_queries, seed=self.recipe.train.seed)
        r = ev.results
        nan = lambda v: float("nan") if v is None else v  # noqa: E731  (constant predictions: no correlation)
        values = {"dev_spearman": nan(r["spearman"]), "dev_pearson": nan(r["pearson"]),
                  "dev_pair_accuracy": r["pair_accuracy"], "dev_seconds": round(ev.seconds, 2)}
        return values, (f"dev Spearman {values['dev_spearman']:.4f}  Pearson {values['dev_pearson']:.4f}  "
                        f"pair accuracy {r['pair_accuracy']:.4f}")


CSTSTask.training = CSTSTraining
