"""The training loop both tasks run: setup → epochs of optimiser steps → validation → best checkpoint.

A task's :class:`~kgc.training.task.Training` (link prediction, C-STS) supplies its data, model, objective,
batches and validation; everything else lives here once — run directory, device and precision, AdamW with a linear
schedule, gradient clipping, the metrics log, curves, the progress bar, checkpoints and resume.

Resumable: ``checkpoints/last.pt`` (written atomically every ``train.checkpoint_every`` steps, right
after each validation and at each epoch end) holds model, loss state, optimiser, schedule, RNG states and
the step count. The batches of an epoch are a pure function of (seed, epoch), so a resumed run replays
the same batches from the same step with the same schedule.

Under ``torchrun`` (:mod:`kgc.training.distributed`) every rank runs this loop on its shard of each global
batch inside DDP; rank 0 alone writes the run directory, checkpoints, metrics, curves and the progress bar.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Collection

import numpy as np
import torch
from torch import nn

from kgc.errors import KGCError
from kgc.fileio import run_lock, write_json, write_text
from kgc.recipe import Recipe
from kgc.training.common import (MetricsLog, end_schedule_at, fit_schedule, fuse_adamw, linear_schedule,
                                 make_optimizer, plot_curves, resolve_threads, rng_state, save_checkpoint,
                                 seed_everything, set_rng_state)
from kgc.training import distributed as dist
from kgc.training import estimate
from kgc.training.prefetch import Prefetcher
from kgc.training.run import CHECKPOINTS, RunDir, load_checkpoint, load_weights, saved_recipe_text, weights_to_save
from kgc.training.task import Training, make_training, task_class
from kgc.training.setup import count_parameters, freezes_weights, pooling_parameters, save_backbone_files


PACE_STEPS, PACE_SECONDS = 20, 30.0  # the pace is judged once, after this many steps or seconds of training
PROBE_ROWS = 64  # train.amp=auto on a CPU: the probe's step is the first batch's first rows (a step's shape, cheaply)
ETA_STEPS = 5  # the pace and end time are said once, this many steps (or PACE_SECONDS) after the first step
SLOW_EPOCH_SECONDS = 3600.0  # an epoch slower than this, with every layer training, is worth a word


def pace_warning(recipe: Recipe, *, steps: int, seconds: float, steps_per_epoch: int,
                 total_steps: int | None = None) -> str | None:
    """What ``kgc train`` says once, early, when ``steps`` taking ``seconds`` (validation excluded) imply more than
    an hour per epoch while every layer trains (``encoder.trainable_layers: all``); None otherwise — and when the
    run stops within the hour anyway (``train.max_minutes`` ≤ 60, or ``total_steps`` take less)."""
    tc = recipe.train
    if recipe.encoder.trainable_layers != "all" or steps < 1 or seconds <= 0:
        return None
    per_step = seconds / steps
    epoch = per_step * steps_per_epoch
    planned = per_step * min(steps_per_epoch, total_steps or steps_per_epoch)
    if epoch <= SLOW_EPOCH_SECONDS or planned <= SLOW_EPOCH_SECONDS or (tc.max_minutes and tc.max_minutes <= 60):
        return None
    return (f"warning: at {per_step:.2f}s a step, an epoch ({steps_per_epoch:,} steps) takes about "
            f"{epoch / 3600:.1f} h with every layer training (encoder.trainable_layers: all). "
            "encoder.trainable_layers=N (e.g. --set encoder.trainable_layers=2) trains only the top N layers and "
            "reads the frozen ones below from the layer cache, computed once: each step then runs N layers, "
            "not all of them")


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


def train(recipe: Recipe | None = None, *, out: Path | None = None, resume: Path | None = None,
          progress: bool = True, echo=print, check_memory: bool = True,
          on_validation: Callable[[int, dict], None] | None = None,
          validate_at: "Collection[int] | None" = None) -> Path:
    """Train (or resume) the recipe's task and return the run directory.

    Before anything is written, the memory a training step needs is estimated and said in one line; a run that
    does not fit is refused (:mod:`kgc.training.estimate`) unless ``train.check_memory`` or ``check_memory`` is
    false. ``on_validation(step, figures)`` is called on rank 0 after each validation (``kgc tune`` reports the dev
    curve to Optuna there; an exception it raises, a pruned trial, ends the training). ``validate_at``: validate
    at exactly these steps and at no other (each epoch's and ``eval.validate_every_steps``' validations left out):
    a study's trial reports ``tune.reports`` times, whatever the recipe's epochs.

    Under ``torchrun`` every process calls this; the run directory is rank 0's and is returned on every rank.
    Rank 0 holds the run directory's lock for the whole training (:func:`kgc.fileio.run_lock`): another
    ``kgc train`` into it, or an index build, is refused meanwhile.
    """
    try:
        with contextlib.ExitStack() as hold:  # the run directory's lock, released when training ends
            return _train(recipe, out=out, resume=resume, progress=progress, echo=echo, hold=hold,
                          check_memory=check_memory, on_validation=on_validation, validate_at=validate_at)
    finally:
        dist.shutdown()


class _Setup:
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


def _train(recipe: Recipe | None, *, out: Path | None, resume: Path | None, progress: bool, echo,
           hold: contextlib.ExitStack, check_memory: bool = True,
           on_validation: Callable[[int, dict], None] | None = None,
           validate_at: "Collection[int] | None" = None) -> Path:
    from tqdm.auto import tqdm

    s = _Setup(recipe, out=out, resume=resume, echo=echo, hold=hold, check_memory=check_memory)
    s.on_validation = on_validation
    planned = None if validate_at is None else {int(x) for x in validate_at}  # the only steps that validate
    recipe, task, model, criterion, tc = s.recipe, s.task, s.model, s.criterion, s.recipe.train
    rate_key = f"{s.about.unit}_per_s"
    model.train()
    criterion.train()
    s.choose_precision()
    # disable=None: no bar where stderr is no terminal (a log file: the lines said during training, validations
    # among them, would be glued to the bar's carriage-return updates there)
    bar = tqdm(total=s.total, initial=s.step, desc="train", dynamic_ncols=True,
               disable=True if not progress or not dist.is_main() else None)
    t_start = time.perf_counter()
    s.clock_start, clock0, seen0 = t_start, s.clock, s.seen  # the training clock starts with the first step
    step0 = s.step
    profiler = None
    if tc.profile_steps and dist.is_main():  # train.profile_steps: RUN/profile.md
        from kgc.profiling import PROFILE_WARMUP, StepProfiler

        profiler = StepProfiler(s.step + PROFILE_WARMUP, tc.profile_steps, s.device,
                                lambda page: write_text(s.run.path / "profile.md", f"# {recipe.name}: profile\n\n{page}"))
    pace_step0: int | None = s.step  # pace_warning: steps counted from here; None once judged
    eta_from: tuple[int, float, int] | None = None  # (step, seconds, seen) after the first step (its one-off work:
    s.pace = None  # the entity table, the layer cache's first states) — the pace and end time, said once
    for epoch in range(s.step // s.steps_per_epoch if s.step < s.total else tc.epochs, tc.epochs):
        feed = _feed(s, task.epoch_batches(epoch), skip=max(0, s.step - epoch * s.steps_per_epoch))
        for size, batch in feed:  # this rank's share, made ready on the host (in a thread, a step ahead)
            if s.step >= s.total:
                break
            if profiler is not None:
                profiler.before(s.step)
            task.before_step(model, criterion, s.step)
            loss = s.step_module(batch)
            s.optimizer.zero_grad(set_to_none=True)
            s.scaler.scale(loss).backward()
            s.scaler.unscale_(s.optimizer)
            torch.nn.utils.clip_grad_norm_(s.params, tc.grad_clip)
            s.scaler.step(s.optimizer)
            s.scaler.update()
            criterion.after_step()
            s.scheduler.step()
            s.step += 1
            s.seen += size  # the global batch
            if profiler is not None:
                profiler.after(s.step)
            rate = (s.seen - seen0) / (s.seconds() - clock0)  # this process's, validation excluded
            logged = s.step % tc.log_every == 0 or s.step == s.total
            if logged:  # reading the loss or τ waits for the device: only on the steps that log them
                figures = criterion.figures()  # e.g. SimKGC's learnt τ as "tau"
                loss_value = dist.mean(loss)  # the global batch's loss
                if tc.schedule == "minutes" and tc.max_minutes and s.step > step0:  # the decay ends with the minutes
                    s.total = fit_schedule(s.scheduler, step=s.step,
                                           seconds_per_step=(s.seconds() - clock0) / (s.step - step0),
                                           seconds_left=60 * tc.max_minutes - s.seconds(),
                                           warmup=tc.warmup_steps, most=s.most)
            if pace_step0 is not None and (s.step - pace_step0 >= PACE_STEPS
                                           or s.seconds() - clock0 >= PACE_SECONDS):  # judged once
                slow = pace_warning(recipe, steps=s.step - pace_step0, seconds=s.seconds() - clock0,
                                    steps_per_epoch=s.steps_per_epoch, total_steps=s.total)
                if slow:
                    bar.clear()
                    s.say(slow)
                pace_step0 = None
            if s.pace is None and eta_from is None:
                eta_from = (s.step, s.seconds(), s.seen)
            elif s.pace is None and (s.step - eta_from[0] >= ETA_STEPS or s.seconds() - eta_from[1] >= PACE_SECONDS):
                took = max(s.seconds() - eta_from[1], 1e-9)
                line, s.pace = estimate.pace(step=s.step, total=s.total, seconds_per_step=took / (s.step - eta_from[0]),
                                             train_seconds=s.seconds(), max_minutes=tc.max_minutes,
                                             unit=s.about.unit, rate=(s.seen - eta_from[2]) / took)
                bar.clear()
                s.say(line)
            bar.update(1)
            if logged:
                bar.set_postfix(loss=f"{loss_value:.3f}", **{k: f"{v:.4f}" for k, v in figures.items()},
                                **{rate_key: f"{rate:.1f}"})
                s.metrics.write(step=s.step, epoch=epoch + 1, loss=round(loss_value, 5),
                                train_seconds=round(s.seconds(), 3), seen=s.seen, **figures,
                                lr=s.scheduler.get_last_lr()[0], **{rate_key: round(rate, 2)})
            every = recipe.eval.validate_every_steps if task.can_validate and planned is None else None
            if planned is not None and s.step in planned and task.can_validate:  # validate_at: these steps only
                s.validate(epoch)
                s.checkpoint()
            elif every and s.step % every == 0 and s.step % s.steps_per_epoch != 0 and s.step < s.total:  # else: below
                s.validate(epoch)
                s.checkpoint()  # right after: a resume never repeats or skips a validation
            elif s.step % tc.checkpoint_every == 0:
                s.checkpoint()
            over = tc.max_minutes and s.step < s.total and s.seconds() >= 60 * tc.max_minutes
            if tc.max_minutes and s.world > 1:  # every rank stops at the same step (any rank's clock decides)
                over = dist.mean(torch.tensor(float(bool(over)), device=loss.device)) > 0
            if over:
                s.say(f"train.max_minutes={tc.max_minutes:g} reached after {s.step} steps")
                s.total = s.step  # stop here: the end of the epoch's work (validation, checkpoint), then finish
                break
        feed.close()
        if s.validated <= epoch:
            validating = recipe.eval.validate_every_epoch and task.can_validate and planned is None
            if validating:
                s.validate(epoch)
            s.validated = epoch + 1
            # after a validation always (a resume never repeats or skips one); else as often as mid-epoch: an epoch
            # of WN18RR is 170 steps of 1024 (seconds of work on a GPU), a checkpoint with AdamW's state 100s of MB
            if validating or s.step - s.checkpointed >= tc.checkpoint_every or s.step >= s.total:
                s.checkpoint()
        if s.step >= s.total:
            break
    bar.close()
    s.peak_rss = estimate.resident_bytes()[1]  # the training's peak, before the finishing work (curves, summary)
    if not dist.is_main():
        return s.run.path
    s.clock, s.clock_start = s.seconds(), time.perf_counter()  # frozen here: finishing is not training
    _finish(s, time.perf_counter() - t_start + s.precision.seconds, progress=progress, echo=echo)  # the probe's too
    return s.run.path


def _feed(s: _Setup, batches: list, *, skip: int) -> Prefetcher:
    """The epoch's batches from ``skip`` on (those before were trained before a resume) as (examples in the global
    batch, this rank's share made ready by ``task.prepare``): built in a background thread a step ahead where
    ``train.prefetch`` says (auto: on a GPU), else when asked. Closed when training ends, whatever ends it."""
    task, tc = s.task, s.recipe.train
    ahead = tc.prefetch if tc.prefetch != "auto" else s.device.type == "cuda"

    def source():
        for batch in batches[skip:]:
            yield len(batch), dist.shard(batch, s.rank, s.world) if s.world > 1 else batch

    feed = Prefetcher(source(), lambda item: (item[0], task.prepare(s.model, s.criterion, item[1])), enabled=ahead)
    s.hold.callback(feed.close)
    return feed


def _finish(s: _Setup, seconds: float, *, progress: bool, echo) -> None:
    """best.pt when nothing was validated, the curves, train_summary.json, then the task's after-training work."""
    run, task, about, model = s.run, s.task, s.about, s.model
    if not run.best.is_file():  # no validation asked for: the final weights are the model
        save_checkpoint(run.best, {**weights_to_save(model, s.lean), "step": s.step, about.metric: None})
    model.save_cache()
    records = s.metrics.read()
    plot_curves(records, run.curves, metric=about.metric, unit=about.unit)
    rate_key = f"{about.unit}_per_s"
    rates = [r[rate_key] for r in records if rate_key in r]
    trainable, total_params = count_parameters(model, s.criterion)
    cache = model.layer_cache
    write_json(run.summary_file, {
        "task": s.recipe.task, "steps": s.step, f"best_{about.metric}": s.best if s.best > float("-inf") else None,
        rate_key: rates[-1] if rates else None, "trainable_params": trainable, "total_params": total_params,
        "pooling_params": pooling_parameters(model.encoders), "conditioner": s.recipe.model.conditioner,
        "layer_cache": None if cache is None else {"layer": cache.layer, "bytes": cache.nbytes, "hits": cache.hits,
                                                   "misses": cache.misses, "folder": str(cache.folder)},
        "train_seconds": round(seconds, 2), "train_seconds_without_validation": round(s.clock, 2),
        "device": str(s.device), "precision": s.precision.record(), "processes": s.world, "finished": True, "seen": s.seen,
        "epochs": round(s.step / s.steps_per_epoch, 3),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(s.device) if s.device.type == "cuda" else None,
        "memory": {**(s.memory.record() if s.memory is not None else {}), "rss_at_check_bytes": s.rss_at_check,
                   "peak_rss_bytes": s.peak_rss},  # the estimate said at the start, and measured
        "pace": s.pace,  # the pace and end time said after the first steps
        "files": run.file_records()})  # best.pt and backbone/*: a damaged one is refused when the run is loaded
    echo(f"finished {s.step} steps; run directory: {run.path}")
    if s.metrics.trackers:
        s.metrics.trackers.finish([run.curves, run.summary_file])
    task.after_training(run.path, progress=progress, echo=echo)
    if s.recipe.train.keep == "best" and run.last.is_file():  # resume state is no longer needed: keep the model only
        shutil.rmtree(run.last.parent)
    echo(f"next: kgc evaluate {run.path}    (then: {about.run_class().command.replace('RUN', str(run.path))})")
