"""A training run's session: what :func:`kgc.training.loop.train` sets up before its first step and carries
through every step — the run folder (taken under the run's lock, made on rank 0), the task's model and objective,
the device and precision (``train.amp``'s choice, with the probe of this recipe's own step), AdamW and its
schedule, the metrics log, checkpoints (written atomically, resumable) and validation with the best checkpoint."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from kgc.errors import KGCError
from kgc.fileio import run_lock, write_text
from kgc.recipe import Recipe
from kgc.training.common import (MetricsLog, end_schedule_at, fuse_adamw, linear_schedule,
                                 make_optimizer, resolve_threads, rng_state, save_checkpoint,
                                 seed_everything, set_rng_state)
from kgc.training import distributed as dist
from kgc.training import estimate
from kgc.training.run import CHECKPOINTS, RunDir, load_checkpoint, load_weights, saved_recipe_text, weights_to_save
from kgc.training.task import Training, make_training, task_class
from kgc.training.setup import freezes_weights, save_backbone_files

PROBE_ROWS = 64  # train.amp=auto on a CPU: the probe's step is the first batch's first rows (a step's shape, cheaply)


class _NoLog:
    """Ranks other than 0 write no metrics."""

    trackers = None

    def write(self, **record: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass


class _Step(nn.Module):
    """Model + objective as one module, so DDP averages the gradients of both (τ included)."""

    def __init__(self, task: Training, model: nn.Module, criterion: nn.Module) -> None:
        super().__init__()
        self.task, self.model, self.criterion = task, model, criterion

    def forward(self, batch: np.ndarray) -> torch.Tensor:
        return self.task.batch_loss(self.model, self.criterion, batch)


def probe_step(task: Training, model: nn.Module, criterion: nn.Module, rows: int) -> Callable[[], None]:
    """A training step's forward and backward on the first ``rows`` examples of epoch 0, as a callable that can run
    again and again and leaves no trace: no optimiser step, the gradients dropped, the objective's extra state (a
    queue of negatives) put back after each call, and what the first step's preparation would set made do for
    (:meth:`Objective.probing`). What ``train.amp: auto`` times in fp32 and bf16 on a CPU; the caller keeps the
    random generators and the layer cache."""
    prepared = task.prepare(model, criterion, task.epoch_batches(0)[0][:rows])
    device = next(model.parameters()).device

    def step() -> None:
        kept = criterion.extra_state()
        try:
            with criterion.probing():
                task.batch_loss(model, criterion, prepared).backward()
        finally:
            model.zero_grad(set_to_none=True)
            criterion.zero_grad(set_to_none=True)
            if kept is not None:
                criterion.load_extra_state(kept, device)

    return step


def _on_main(fn):
    """Run ``fn`` on rank 0 while the other ranks wait; every rank gets its result, or fails with its error.

    Any exception on rank 0 reaches the others (as a KGCError naming it) instead of leaving them waiting at
    the next collective until torchrun's timeout; rank 0 re-raises its own."""
    if not dist.active():
        return fn()
    result = error = None
    if dist.is_main():
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001  (forwarded, then re-raised)
            error = exc
    message = None if error is None else f"{type(error).__name__}: {error}"
    result, message = dist.broadcast((None if error is not None else result, message))
    if error is not None:
        raise error
    if message is not None:
        raise KGCError(f"rank 0 failed ({message}); this rank stops too")
    return result


class Session:
    """What one training run holds: recipe, task, run directory, model, objective, optimiser, schedule and the
    counters a checkpoint restores."""

    def __init__(self, recipe: Recipe | None, *, out: Path | None, resume: Path | None, echo,
                 hold: contextlib.ExitStack, check_memory: bool = True) -> None:
        restart = False
        self.hold = hold  # what training releases when it ends: the lock, the thread count, the trackers
        if resume is not None:
            run = RunDir(resume)
            recipe = run.recipe
            if not run.last.is_file():
                if RunDir.finished(run.path):
                    raise KGCError(f"{run.path}: training finished, and it kept best.pt only (train.keep: best), so "
                                   "there is nothing to resume. To train further, start a new run (train.keep: all "
                                   "keeps checkpoints/last.pt with the optimiser state).")
                if RunDir.training_now(run.path) is not None:
                    raise KGCError(RunDir.no_weights_message(run.path))
                # died before its first checkpoint, or before it finished with no checkpoint to go on from
                # (train.keep: best, best.pt written by a validation or at the end): again from step 0, in place
                restart, out, resume = True, run.path, None
        assert recipe is not None
        task = make_training(recipe)  # reads the data first: a bad file fails before a run directory exists
        self.about = about = task_class(recipe.task)  # the task's description: its metric, its unit
        tc = recipe.train
        threads = resolve_threads(tc.num_threads)
        if threads:  # for this run only: the caller's thread count is back when training returns or fails
            hold.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
        self.device = dist.init(tc.device)  # joins the torchrun group, if any
        self.world, self.rank = dist.world_size(), dist.rank()
        self.say = echo if dist.is_main() else (lambda _msg: None)
        if self.world > 1 and not about.distributed:
            raise KGCError(f"task {recipe.task} trains in one process (its batches must be seen whole by one rank); "
                           "drop --nproc / torchrun")
        dist.check_batch(tc.batch_size)
        # what a step will need, said (and refused where it does not fit) before the first byte of the run is written
        self.memory = estimate.check(recipe, task.counts, device=self.device, world=self.world, say=self.say,
                                     enabled=tc.check_memory and check_memory,
                                     backbone=RunDir.backbone_folder(run.path) if resume is not None else None)
        self.rss_at_check = estimate.resident_bytes()[0]
        if resume is not None:
            _on_main(lambda: hold.enter_context(run_lock(run.path, "training")) and None)  # before any write
            ckpt = load_checkpoint(run.last)
            self.say(f"resuming {run.path} from step {ckpt['step']}")
            self._init_model(recipe, task, run.path, ckpt, run)
            return
        target = Path(out) if out else RunDir.default_path(recipe.name)
        existed = target.exists()
        had_best = restart and (target / CHECKPOINTS[0]).is_file()
        run_dir = _on_main(lambda: RunDir.create(target, hold, restart=restart))  # the one maker of run folders
        if restart:
            self.say(f"{run_dir} stopped before its first checkpoint" + (" it could resume from" if had_best else "")
                     + ": starting it again from step 0 (its recipe.yaml)")
        self.say(f"run directory: {run_dir}" + (f" ({self.world} processes, global batch {tc.batch_size})"
                                               if self.world > 1 else ""))
        # what this command may make; what is there already (a young run's backbone/, started again) is not its own
        makes = [RunDir.backbone_folder(run_dir), run_dir / "metrics.jsonl"] + ([] if restart else
                                                                               [run_dir / "recipe.yaml"])
        found = {m for m in makes if m.exists()}
        try:
            self._init_model(recipe, task, run_dir, None, None)
        except BaseException:  # nothing half-written: what this setup made goes (data/ handed in by the API stays)
            if dist.is_main():
                for made in makes:
                    if made not in found:  # nothing a failed command touched is deleted unless it was new in it
                        shutil.rmtree(made) if made.is_dir() else made.unlink(missing_ok=True)
                if not existed:
                    shutil.rmtree(run_dir, ignore_errors=True)
            raise

    def _init_model(self, recipe: Recipe, task: Training, run_dir: Path, ckpt: dict | None, run: RunDir | None) -> None:
        from kgc.encoding.backbone import resolve_backbone

        seed_everything(recipe.train.seed)
        if ckpt is None:
            model, tokenizer = task.build_model(resolve_backbone(recipe.model.backbone))

            def publish() -> None:
                save_backbone_files(RunDir.backbone_folder(run_dir), recipe, tokenizer,
                                    weights=freezes_weights(recipe, model))
                write_text(run_dir / "recipe.yaml", saved_recipe_text(recipe, run_dir))

            _on_main(publish)
        else:
            model, _ = task.build_model(RunDir.backbone_folder(run_dir), pretrained=run.pretrained)
            load_weights(model, ckpt, run.last)
        for _level, line in task.summary:
            self.say(line)
        self.recipe, self.task, self.model, self.ckpt = recipe, task, model, ckpt
        self.run = RunDir(run_dir)
        self.lean = self.run.pretrained  # checkpoints leave out the frozen weights: backbone/ holds them
        self._build_objective()

    def _build_objective(self) -> None:
        recipe, task, model, tc = self.recipe, self.task, self.model, self.recipe.train
        steps = task.steps_per_epoch * tc.epochs if not tc.max_steps else min(task.steps_per_epoch * tc.epochs,
                                                                              tc.max_steps)
        # freezes layers below T - n (before the optimiser sees them); the cache sized for the run's examples first
        model.attach_layer_cache(recipe, examples=steps * tc.batch_size, say=self.say)
        self.criterion = criterion = task.make_loss(self.device)
        model.to(self.device)
        criterion.to(self.device)
        if tc.compile:  # one graph per length-group width, built at the first steps (their time counts as training)
            for encoder in model.encoders:
                encoder.compile()
        self.step_module: nn.Module = _Step(task, model, criterion)
        if self.world > 1:  # rank 0's weights are broadcast; gradients are averaged in buckets during backward
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.step_module = DistributedDataParallel(self.step_module, device_ids=ids,
                                                       static_graph=True)  # the same parameters every step
        self.steps_per_epoch = task.steps_per_epoch
        self.total = self.steps_per_epoch * tc.epochs
        if tc.max_steps:
            self.total = min(self.total, tc.max_steps)
        self.most = self.total  # the steps the recipe allows: train.schedule=minutes fits its end below this
        own = {id(p) for p in model.conditioner.own_parameters()}  # train.conditioner_lr's
        self.optimizer = make_optimizer([model, criterion], tc.lr, tc.weight_decay, other=own,
                                        other_lr=tc.conditioner_lr, fused=self.device.type == "cuda")
        self.scheduler = linear_schedule(self.optimizer, tc.warmup_steps, self.total)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.device.type == "cuda" and tc.amp == "fp16")
        self.params = [p for p in list(model.parameters()) + list(criterion.parameters()) if p.requires_grad]
        self.metrics = MetricsLog(self.run.metrics) if dist.is_main() else _NoLog()
        self.step, self.validated, self.best = 0, 0, float("-inf")
        self.on_validation: Callable[[int, dict], None] | None = None  # kgc tune: the dev curve, as it grows
        self.checkpointed = 0  # the step of the last resumable checkpoint
        self.clock = 0.0  # seconds of training so far (validation excluded), across resumes
        self.seen = 0  # training examples (the task's unit) seen so far, across resumes
        self.clock_start = time.perf_counter()
        ckpt = self.ckpt
        if ckpt is not None:
            criterion.load_state_dict(ckpt["loss"])
            criterion.load_extra_state(ckpt.get("loss_extra"), self.device)
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            if tc.schedule == "minutes" and ckpt.get("total_steps"):  # the end it was fitted to (refitted on)
                self.total = end_schedule_at(self.scheduler, min(self.total, ckpt["total_steps"]), tc.warmup_steps)
            ranks = ckpt.get("rng_ranks")
            set_rng_state(ranks[self.rank] if ranks and len(ranks) == self.world else ckpt["rng"])
            self.step, self.validated, self.best = ckpt["step"], ckpt["validated_epochs"], ckpt["best_metric"]
            self.checkpointed = self.step
            self.clock, self.seen = ckpt.get("train_seconds", 0.0), ckpt.get("seen", 0)
            self.metrics.truncate_after(self.step)
        elif self.world > 1:
            torch.manual_seed(tc.seed + self.rank)  # the weights are rank 0's; dropout masks differ per rank
        if tc.trackers and dist.is_main():  # rank 0 alone logs; resumed: past the checkpoint's step is redone
            from kgc.training.trackers import open_trackers

            self.metrics.trackers = open_trackers(tc.trackers, self.run.path, self.recipe.model_dump(mode="json"),
                                                  title=self.recipe.name, resume_step=self.step if ckpt else None)
            self.hold.callback(self.metrics.trackers.close)  # a failed run's trackers are closed (finished ones: no-op)

    def choose_precision(self) -> None:
        """What the step runs in on this machine (``train.amp``, :func:`kgc.encoding.precision.choose`): on a CPU
        with bf16 hardware, ``auto`` times this recipe's own step (:func:`probe_step`, the first batch's
        first PROBE_ROWS rows) both ways, once per machine and shape (cached); the probe's seconds count as
        training time (``train.max_minutes``), and it leaves no trace: the random generators, the layer cache and
        the objective's state are as they were. Said once; recorded in train_summary.json."""
        from kgc.encoding.precision import choose, encoder_shape

        recipe, model, tc = self.recipe, self.model, self.recipe.train
        model.set_bf16_stream(tc.bf16_stream)  # before the probe: it times the step the run will take
        rows = min(tc.batch_size, PROBE_ROWS)
        made: list = []  # the probe's step, made when the choice asks for it (auto on a CPU with bf16 hardware)

        def probe(name: str) -> None:
            if not made:
                made.append(probe_step(self.task, model, self.criterion, rows))
            model.set_precision(name)
            made[0]()

        # what the step's cost depends on: the recipe but its name, data, training and evaluation settings (the
        # batch and the text length aside) and the backbone's path (its architecture instead), and the data's counts
        sections = recipe.model_dump(mode="json", exclude={"name", "data", "train", "eval"})
        sections["model"].pop("backbone", None)
        shape = {"work": "train step", "batch": tc.batch_size, "sections": sections,
                 **encoder_shape(model.encoders[0], recipe.data.max_tokens, rows),
                 "towers": len({id(e) for e in model.encoders}), "counts": repr(self.task.counts)}
        if tc.bf16_stream:  # a different step (the key is absent otherwise: the probes cached before still match)
            shape["bf16_stream"] = True
        cache = model.layer_cache
        kept = (torch.get_rng_state(), cache and (cache.store, cache.hits, cache.misses))
        if cache is not None:
            cache.store = False  # the probe's lower states are not kept: the run's cache is the run's own
        try:
            choice = choose(tc.amp, self.device, shape=shape,
                            probe=probe if self.world == 1 and self.device.type == "cpu" else None)
        finally:
            torch.set_rng_state(kept[0])
            if cache is not None:
                cache.store, cache.hits, cache.misses = kept[1]
        model.set_precision(choice.name)
        fuse_adamw(self.optimizer, self.device.type == "cuda" or choice.name == "bf16")
        self.precision = choice
        self.clock += choice.seconds  # the probe is in the budget
        self.say(choice.line())
        if choice.warning:
            self.say(f"warning: {choice.warning}")

    def seconds(self) -> float:
        """Training wall time so far: this process's since setup (validation excluded) plus earlier runs'."""
        return self.clock + time.perf_counter() - self.clock_start

    def checkpoint(self) -> None:
        self.checkpointed = self.step
        rngs = dist.gather_objects(rng_state())  # every rank's generators: a resumed group replays them

        def write() -> None:
            self.model.save_cache()
            save_checkpoint(self.run.last, {
                **weights_to_save(self.model, self.lean), "loss": self.criterion.state_dict(),
                "loss_extra": self.criterion.extra_state(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rngs[0],
                "rng_ranks": rngs if self.world > 1 else None, "world_size": self.world, "step": self.step,
                "validated_epochs": self.validated, "best_metric": self.best, "total_steps": self.total,
                "train_seconds": self.seconds(), "seen": self.seen})

        _on_main(write)

    def validate(self, epoch: int) -> None:
        """Rank 0 validates (and keeps best.pt) while the others wait; an error there stops every rank."""
        start, at = time.perf_counter(), round(self.seconds(), 3)

        def run() -> None:
            values, summary = self.task.validate(self.model)
            self.metrics.write(step=self.step, epoch=epoch + 1, train_seconds=at, seen=self.seen, **values)
            value = values[self.about.metric]
            improved = value > self.best
            if improved:
                self.best = value
                save_checkpoint(self.run.best, {**weights_to_save(self.model, self.lean), "step": self.step,
                                                self.about.metric: value})
            self.say(f"step {self.step} (epoch {epoch + 1}): {summary}{'  (best)' if improved else ''}  "
                     f"[{values['dev_seconds']:.1f}s]")
            if self.on_validation is not None:
                self.on_validation(self.step, values)

        _on_main(run)
        self.clock_start += time.perf_counter() - start  # validation is not training time
        self.model.train()
        self.criterion.train()
