"""The training loop both tasks run: setup → epochs of optimiser steps → validation → best checkpoint.

A task (:class:`Task`: link prediction, C-STS) supplies its data, model, objective, batches and
validation; everything else lives here once — run directory, device and precision, AdamW with a linear
schedule, gradient clipping, the metrics log, curves, the progress bar, checkpoints and resume.

Resumable: ``checkpoints/last.pt`` (written atomically every ``train.checkpoint_every`` steps, right
after each validation and at each epoch end) holds model, loss state, optimiser, schedule, RNG states and
the step count. The batches of an epoch are a pure function of (seed, epoch), so a resumed run replays
the same batches from the same step with the same schedule.

Under ``torchrun`` (:mod:`kgc.training.distributed`) every rank runs this loop on its shard of each global
batch inside DDP; rank 0 alone writes the run directory, checkpoints, metrics, curves and the progress bar.
"""

from __future__ import annotations

import importlib
import time
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from kgc.errors import KGCError
from kgc.fileio import write_json, write_text
from kgc.recipe import Recipe
from kgc.training.common import (MetricsLog, linear_schedule, load_checkpoint, make_optimizer,
                                 plot_curves, rng_state, save_checkpoint, seed_everything, set_rng_state)
from kgc.training import distributed as dist
from kgc.training.run import RunDir
from kgc.training.setup import count_parameters, pooling_parameters, save_backbone_files

TASKS = {"linkpred": "kgc.linkpred.train:LinkPredTask", "csts": "kgc.csts.train:CSTSTask"}


class Task(ABC):
    """One task's part of training. The model must offer ``encoders``, ``attach_layer_cache(recipe)``,
    ``layer_cache`` and ``save_cache()``; ``metric`` (higher is better) picks ``best.pt``."""

    unit: ClassVar[str]  # what a training example is: "triples", "pairs"
    metric: ClassVar[str]  # the validation metric that selects best.pt, e.g. "dev_mrr"

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    @abstractmethod
    def build_model(self, backbone_folder: Path, *, pretrained: bool = True) -> tuple[nn.Module, Any]:
        """(model, tokenizer); ``pretrained=False`` builds the architecture only."""

    @abstractmethod
    def make_loss(self) -> nn.Module: ...

    @property
    @abstractmethod
    def steps_per_epoch(self) -> int: ...

    @abstractmethod
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches (``steps_per_epoch`` of them); a pure function of (seed, epoch)."""

    @abstractmethod
    def batch_loss(self, model: nn.Module, criterion: nn.Module, batch: np.ndarray) -> torch.Tensor: ...

    def batch_size(self, batch: np.ndarray) -> int:
        """Training examples in a batch (for the throughput figure)."""
        return len(batch)

    @abstractmethod
    def validate(self, model: nn.Module) -> tuple[dict[str, float], str]:
        """(metrics including ``self.metric`` and ``dev_seconds``, a one-line summary)."""

    def to(self, device: torch.device) -> None:
        """Move task-side tensors (e.g. the false-negative keys) to the training device."""

    def loss_state(self, criterion: nn.Module) -> Any:
        """Training state the objective carries besides its parameters (SimKGC's pre-batch queue)."""
        return None

    def load_loss_state(self, criterion: nn.Module, state: Any, device: torch.device) -> None:
        pass

    def after_training(self, run_dir: Path, *, progress: bool, echo) -> None:
        """Work that follows the text model's training (main process only), e.g. a structural model beside it."""


class _NoLog:
    """Ranks other than 0 write no metrics."""

    def write(self, **record: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass


def make_task(recipe: Recipe) -> Task:
    module, cls = TASKS[recipe.task].split(":")
    return getattr(importlib.import_module(module), cls)(recipe)


def default_run_dir(recipe: Recipe) -> Path:
    return Path("runs") / f"{recipe.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _prepare_new_run(recipe: Recipe, out: Path | None) -> Path:
    run_dir = Path(out) if out else default_run_dir(recipe)
    if (run_dir / "recipe.yaml").exists():
        raise KGCError(f"{run_dir} already holds a run. Continue it with `kgc train --resume {run_dir}` "
                       "or pick another --out.")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class _Step(nn.Module):
    """Model + objective as one module, so DDP averages the gradients of both (τ included)."""

    def __init__(self, task: Task, model: nn.Module, criterion: nn.Module) -> None:
        super().__init__()
        self.task, self.model, self.criterion = task, model, criterion

    def forward(self, batch: np.ndarray) -> torch.Tensor:
        return self.task.batch_loss(self.model, self.criterion, batch)


def _on_main(fn):
    """Run ``fn`` on rank 0; every rank gets its result, or raises its error."""
    result = error = None
    if dist.is_main():
        try:
            result = fn()
        except KGCError as exc:
            error = str(exc)
    result, error = dist.broadcast((result, error))
    if error is not None:
        raise KGCError(error)
    return result


def train(recipe: Recipe | None = None, *, out: Path | None = None, resume: Path | None = None,
          progress: bool = True, echo=print) -> Path:
    """Train (or resume) the recipe's task and return the run directory.

    Under ``torchrun`` every process calls this; the run directory is rank 0's and is returned on every rank.
    """
    try:
        return _train(recipe, out=out, resume=resume, progress=progress, echo=echo)
    finally:
        dist.shutdown()


def _train(recipe: Recipe | None, *, out: Path | None, resume: Path | None, progress: bool, echo) -> Path:
    from tqdm.auto import tqdm

    from kgc.encoding.backbone import resolve_backbone

    ckpt = None
    if resume is not None:
        run_dir = Path(resume)
        recipe = RunDir(run_dir).recipe
        if not (run_dir / "checkpoints" / "last.pt").is_file():
            raise KGCError(f"{run_dir}: no checkpoints/last.pt to resume from; start it again with `kgc train`.")
    else:
        assert recipe is not None
        task = make_task(recipe)  # reads the data first: a bad file fails before a run directory exists
    tc = recipe.train
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = dist.init(tc.device)  # joins the torchrun group, if any
    world, rank = dist.world_size(), dist.rank()
    say = echo if dist.is_main() else (lambda _msg: None)
    if resume is not None:
        ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        say(f"resuming {run_dir} from step {ckpt['step']}")
    if world > 1 and recipe.task != "linkpred":
        raise KGCError(f"task {recipe.task} trains in one process (its batches are groups of rows that one rank must "
                       "see whole); drop --nproc / torchrun")
    dist.check_batch(tc.batch_size)
    if ckpt is None:
        run_dir = _on_main(lambda: _prepare_new_run(recipe, out))
        say(f"run directory: {run_dir}" + (f" ({world} processes, global batch {tc.batch_size})" if world > 1 else ""))
    seed_everything(tc.seed)
    if ckpt is None:
        model, tokenizer = task.build_model(resolve_backbone(recipe.model.backbone))
        if dist.is_main():
            save_backbone_files(run_dir / "backbone", recipe, tokenizer)
            write_text(run_dir / "recipe.yaml", f"# kgc train --resume {run_dir}\n" + recipe.to_yaml())
    else:
        task = make_task(recipe)
        model, _ = task.build_model(run_dir / "backbone", pretrained=False)
        model.load_state_dict(ckpt["model"])
    model.attach_layer_cache(recipe)  # freezes layers below T - n: before the optimiser sees them
    criterion = task.make_loss()
    model.to(device)
    criterion.to(device)
    task.to(device)
    step_module: nn.Module = _Step(task, model, criterion)
    if world > 1:  # rank 0's weights are broadcast; gradients are averaged in buckets during backward
        from torch.nn.parallel import DistributedDataParallel

        step_module = DistributedDataParallel(step_module, device_ids=[device.index] if device.type == "cuda" else None,
                                              static_graph=True)  # the same parameters every step; some unused

    steps_per_epoch = task.steps_per_epoch
    total = steps_per_epoch * tc.epochs
    if tc.max_steps:
        total = min(total, tc.max_steps)
    own = {id(p) for n, p in model.conditioner.named_parameters() if not n.startswith("encoder.")}
    optimizer = make_optimizer([model, criterion], tc.lr, tc.weight_decay, other=own, other_lr=tc.conditioner_lr)
    scheduler = linear_schedule(optimizer, tc.warmup_steps, total)
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and tc.amp == "fp16")
    params = [p for p in list(model.parameters()) + list(criterion.parameters()) if p.requires_grad]
    metrics = MetricsLog(run_dir / "metrics.jsonl") if dist.is_main() else _NoLog()
    rate_key = f"{task.unit}_per_s"

    step, validated, best = 0, 0, float("-inf")
    if ckpt is not None:
        criterion.load_state_dict(ckpt["loss"])
        task.load_loss_state(criterion, ckpt.get("loss_extra"), device)
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        ranks = ckpt.get("rng_ranks")
        set_rng_state(ranks[rank] if ranks and len(ranks) == world else ckpt["rng"])
        step, validated, best = ckpt["step"], ckpt["validated_epochs"], ckpt["best_metric"]
        metrics.truncate_after(step)
    elif world > 1:
        torch.manual_seed(tc.seed + rank)  # the weights are rank 0's; dropout masks differ per rank

    def checkpoint() -> None:
        rngs = dist.gather_objects(rng_state())  # every rank's generators: a resumed group replays them
        if not dist.is_main():
            return
        model.save_cache()
        save_checkpoint(run_dir / "checkpoints" / "last.pt", {
            "model": model.state_dict(), "loss": criterion.state_dict(), "loss_extra": task.loss_state(criterion),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rngs[0],
            "rng_ranks": rngs if world > 1 else None, "world_size": world,
            "step": step, "validated_epochs": validated, "best_metric": best, "total_steps": total})

    def validate(epoch: int) -> None:
        nonlocal best
        if not dist.is_main():  # rank 0 validates (and keeps best.pt); the others wait for it
            dist.barrier()
            model.train()
            criterion.train()
            return
        values, summary = task.validate(model)
        metrics.write(step=step, epoch=epoch + 1, **values)
        value = values[task.metric]
        improved = value > best
        if improved:
            best = value
            save_checkpoint(run_dir / "best.pt", {"model": model.state_dict(), "step": step, task.metric: value})
        say(f"step {step} (epoch {epoch + 1}): {summary}{'  (best)' if improved else ''}  "
            f"[{values['dev_seconds']:.1f}s]")
        dist.barrier()
        model.train()
        criterion.train()

    model.train()
    criterion.train()
    bar = tqdm(total=total, initial=step, desc="train", disable=not progress or not dist.is_main(), dynamic_ncols=True)
    seen, t_start = 0, time.perf_counter()
    for epoch in range(step // steps_per_epoch if step < total else tc.epochs, tc.epochs):
        batches = task.epoch_batches(epoch)
        for i, batch in enumerate(batches):
            if epoch * steps_per_epoch + i < step:
                continue  # done before the resume
            if step >= total:
                break
            loss = step_module(dist.shard(batch, rank, world) if world > 1 else batch)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            seen += task.batch_size(batch)  # the global batch
            rate = seen / (time.perf_counter() - t_start)
            tau = getattr(criterion, "temperature", None)
            loss_value = dist.mean(loss)  # the global batch's loss
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}", **({"tau": f"{tau:.4f}"} if tau is not None else {}),
                            **{rate_key: f"{rate:.1f}"})
            if step % tc.log_every == 0 or step == total:
                metrics.write(step=step, epoch=epoch + 1, loss=round(loss_value, 5),
                              **({"tau": tau} if tau is not None else {}), lr=scheduler.get_last_lr()[0],
                              **{rate_key: round(rate, 2)})
            every = recipe.eval.validate_every_steps
            if every and step % every == 0 and step % steps_per_epoch != 0 and step < total:  # else: below
                validate(epoch)
                checkpoint()  # right after: a resume never repeats or skips a validation
            elif step % tc.checkpoint_every == 0:
                checkpoint()
        if validated <= epoch:
            if recipe.eval.validate_every_epoch:
                validate(epoch)
            validated = epoch + 1
            checkpoint()
        if step >= total:
            break
    bar.close()
    if not dist.is_main():
        return run_dir
    if not (run_dir / "best.pt").is_file():  # no validation asked for: the final weights are the model
        save_checkpoint(run_dir / "best.pt", {"model": model.state_dict(), "step": step, task.metric: None})
    model.save_cache()
    records = metrics.read()
    plot_curves(records, run_dir / "curves.png", metric=task.metric)
    rates = [r[rate_key] for r in records if rate_key in r]
    trainable, total_params = count_parameters(model, criterion)
    cache = model.layer_cache
    write_json(run_dir / "train_summary.json", {
        "task": recipe.task, "steps": step, f"best_{task.metric}": best if best > float("-inf") else None,
        rate_key: rates[-1] if rates else None, "trainable_params": trainable, "total_params": total_params,
        "pooling_params": pooling_parameters(model.encoders), "conditioner": recipe.model.conditioner,
        "layer_cache": None if cache is None else {"layer": cache.layer, "bytes": cache.nbytes, "hits": cache.hits,
                                                   "misses": cache.misses, "folder": str(cache.folder)},
        "train_seconds": round(time.perf_counter() - t_start, 2), "device": str(device), "processes": world,
        "finished": True})
    echo(f"finished {step} steps; run directory: {run_dir}")
    task.after_training(run_dir, progress=progress, echo=echo)
    return run_dir
