"""C-STS's part of training: rows batched by sentence pair, MSE + Hyper-CL's contrastive term, dev Spearman.

The loop itself is :func:`kgc.training.loop.train`, shared with link prediction. A batch holds
``train.batch_size // 2`` sentence pairs with all their rows (both conditions of a pair always share a
batch, so the contrastive term sees c_high and c_low together); its size counts rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from kgc.csts.data import load_csts
from kgc.csts.evaluate import evaluate
from kgc.csts.loss import CSTSLoss
from kgc.csts.model import Texts, build_model
from kgc.recipe import Recipe
from kgc.training.common import autocast
from kgc.training.loop import Task


class CSTSTask(Task):
    unit = "pairs"
    metric = "dev_spearman"

    def __init__(self, recipe: Recipe) -> None:
        super().__init__(recipe)
        d = recipe.data
        self.data = load_csts(d.dataset, d.path, d.synth)
        self.split = self.data.split("train")
        self.groups = self.split.groups
        self.per_batch = max(1, recipe.train.batch_size // 2)
        self.texts: Texts | None = None

    def build_model(self, backbone_folder: Path, *, pretrained: bool = True):
        model, tokenizer = build_model(self.recipe, backbone_folder, pretrained=pretrained)
        self.texts = Texts(self.data, tokenizer)  # every sentence and condition tokenised once
        return model, tokenizer

    def make_loss(self) -> CSTSLoss:
        loss = self.recipe.loss
        return CSTSLoss(mse_weight=loss.mse_weight, contrastive=loss.contrastive,
                        contrastive_weight=loss.contrastive_weight,
                        contrastive_temperature=loss.contrastive_temperature)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.groups) / self.per_batch)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng(self.recipe.train.seed + epoch).permutation(len(self.groups))
        return [np.concatenate([self.groups[g] for g in order[i: i + self.per_batch]])
                for i in range(0, len(order), self.per_batch)]

    def batch_loss(self, model, criterion, batch: np.ndarray) -> torch.Tensor:
        sp, texts = self.split, self.texts
        with autocast(model.device, self.recipe.train.amp):  # the encoder may run in bf16 on CUDA; the loss not
            cosine = model.similarity([texts.sentences[i] for i in sp.s1[batch]],
                                      [texts.sentences[i] for i in sp.s2[batch]],
                                      [texts.conditions[i] for i in sp.cond[batch]])  # (rows,) fp32
        position = np.full(len(sp), -1)
        position[batch] = np.arange(len(batch))  # train row → row of this batch
        high, low = sp.contrast_pairs(batch)
        as_t = lambda x: torch.as_tensor(x, device=model.device)  # noqa: E731
        return criterion(cosine, as_t(sp.label[batch]).float(), as_t(position[high]), as_t(position[low]))

    def validate(self, model):
        ev = evaluate(model, self.texts, self.data, "validation", batch_size=self.recipe.eval.batch_size,
                      max_groups=self.recipe.eval.dev_queries, seed=self.recipe.train.seed)
        r = ev.results
        nan = lambda v: float("nan") if v is None else v  # noqa: E731  (constant predictions: no correlation)
        values = {"dev_spearman": nan(r["spearman"]), "dev_pearson": nan(r["pearson"]),
                  "dev_pair_accuracy": r["pair_accuracy"], "dev_seconds": round(ev.seconds, 2)}
        return values, (f"dev Spearman {values['dev_spearman']:.4f}  Pearson {values['dev_pearson']:.4f}  "
                        f"pair accuracy {r['pair_accuracy']:.4f}")
