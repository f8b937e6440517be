"""The training loop both tasks run: setup → epochs of optimiser steps → validation → best checkpoint.

A task's :class:`~kgc.training.task.Training` (link prediction, C-STS) supplies its data, model, objective,
batches and validation; everything else lives here once — the steps, gradient clipping, the pace, curves, the
progress bar and the run's summary — and in its :class:`~kgc.training.session.Session` (run directory, device and
precision, AdamW with a linear schedule, the metrics log, checkpoints and resume).

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
from typing import Callable, Collection

import torch

from kgc.fileio import write_json, write_text
from kgc.recipe import Recipe
from kgc.training.common import fit_schedule, plot_curves, save_checkpoint
from kgc.training import distributed as dist
from kgc.training import estimate
from kgc.training.prefetch import Prefetcher
from kgc.training.session import Session
from kgc.training.run import weights_to_save
from kgc.training.setup import count_parameters, pooling_parameters


PACE_STEPS, PACE_SECONDS = 20, 30.0  # the pace is judged once, after this many steps or seconds of training
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


def _train(recipe: Recipe | None, *, out: Path | None, resume: Path | None, progress: bool, echo,
           hold: contextlib.ExitStack, check_memory: bool = True,
           on_validation: Callable[[int, dict], None] | None = None,
           validate_at: "Collection[int] | None" = None) -> Path:
    from tqdm.auto import tqdm

    s = Session(recipe, out=out, resume=resume, echo=echo, hold=hold, check_memory=check_memory)
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


def _feed(s: Session, batches: list, *, skip: int) -> Prefetcher:
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


def _finish(s: Session, seconds: float, *, progress: bool, echo) -> None:
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
