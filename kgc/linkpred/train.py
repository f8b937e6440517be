"""Link prediction's part of training: every train triple in both directions, SimKGC's loss, dev MRR.

The loop itself (optimiser, schedule, checkpoints, resume, metrics, curves) is
:func:`kgc.training.loop.train`, shared with C-STS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kgc.data.graph import load_graph
from kgc.linkpred.evaluate import evaluate
from kgc.linkpred.loss import SimKGCLoss
from kgc.linkpred.model import build_model
from kgc.recipe import Recipe
from kgc.training.common import autocast
from kgc.training.loop import Task, train  # noqa: F401  (train: the entry point, re-exported)


def make_loss(recipe: Recipe) -> SimKGCLoss:
    return SimKGCLoss(**{k: v for k, v in recipe.loss.model_dump().items()
                         if k in SimKGCLoss.__init__.__kwdefaults__})


def batch_loss(model, criterion: SimKGCLoss, batch: np.ndarray, train_keys: torch.Tensor, *, amp: str = "auto"):
    """The SimKGC loss of one batch of (head, relation, tail) rows: both towers, then the objective."""
    graph, device = model.bank.graph, model.device
    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    with autocast(device, amp):  # the encoders may run in bf16 on CUDA ...
        query = model.encode_queries(heads, rels, excludes=tails)  # (B, d)
        ents = model.encode_entities(np.concatenate([tails, heads]), np.concatenate([heads, tails]))
    tail_vec, head_vec = ents[: len(batch)], ents[len(batch):]  # (B, d) each
    # ... the logits do not: a 0.02 margin on cosines scaled by 1/0.05 needs fp32
    as_t = lambda x: torch.as_tensor(x, device=device)  # noqa: E731
    return criterion(query.float(), tail_vec.float(), head_vec.float(), heads=as_t(heads), rels=as_t(rels),
                     tails=as_t(tails), train_keys=train_keys, num_entities=graph.num_entities,
                     num_relations2=2 * graph.num_relations)


class LinkPredTask(Task):
    unit = "triples"
    metric = "dev_mrr"

    def __init__(self, recipe: Recipe) -> None:
        super().__init__(recipe)
        d = recipe.data
        self.graph = load_graph(d.dataset, path=d.path, long_text=d.long_text)
        self.examples = self.graph.both_directions("train")  # (2n, 3): every triple in both directions
        self.b = min(recipe.train.batch_size, len(self.examples))
        self.train_keys = torch.as_tensor(self.graph.train_keys)

    def build_model(self, backbone_folder: Path, *, pretrained: bool = True):
        return build_model(self.recipe, self.graph, backbone_folder, pretrained=pretrained)

    def make_loss(self) -> SimKGCLoss:
        return make_loss(self.recipe)

    @property
    def steps_per_epoch(self) -> int:
        return max(1, len(self.examples) // self.b)  # drop_last, as SimKGC

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        seed = self.recipe.train.seed + epoch
        order = torch.randperm(len(self.examples), generator=torch.Generator().manual_seed(seed)).numpy()
        return [self.examples[order[i * self.b: (i + 1) * self.b]] for i in range(self.steps_per_epoch)]

    def to(self, device: torch.device) -> None:
        self.train_keys = self.train_keys.to(device)

    def batch_loss(self, model, criterion, batch):
        return batch_loss(model, criterion, batch, self.train_keys, amp=self.recipe.train.amp)

    def validate(self, model):
        ev = evaluate(model, self.graph, "dev", batch_size=self.recipe.eval.batch_size,
                      max_triples=self.recipe.eval.dev_queries, seed=self.recipe.train.seed, progress=False,
                      max_score_bytes=self.recipe.eval.max_score_bytes)
        mrr, h10 = ev.metric(), ev.metric(key="hits_at_10")
        return ({"dev_mrr": mrr, "dev_hits_at_10": h10, "dev_seconds": round(ev.seconds, 2)},
                f"dev MRR {mrr:.4f}  H@10 {h10:.4f}")

    def loss_state(self, criterion):
        return criterion.queue_state()

    def load_loss_state(self, criterion, state, device):
        criterion.load_queue_state(state or [], device)

    def after_training(self, run_dir: Path, *, progress: bool, echo) -> None:
        if self.recipe.structure is None:
            return
        from kgc.linkpred.structure import train_structure

        train_structure(self.recipe.structure, self.graph, run_dir, seed=self.recipe.train.seed,
                        device=self.recipe.train.device, progress=progress, echo=echo)
