"""Optimiser, schedule, device/precision policy, seeding, atomic checkpoints, metrics log and curves."""

from __future__ import annotations

import json
import random
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from torch import nn

from kgc.errors import KGCError
from kgc.fileio import append_line, write_with

NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "log_inv_t")


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise KGCError(f"train.device={spec}: CUDA is not available here. Use train.device=cpu (or auto).")
    return dev


def busy_cores(samples: int = 5, interval: float = 0.05) -> int:
    """Cores other processes keep busy now: the runnable tasks of /proc/loadavg, less this process's own thread
    (the median of a few samples); where there is no /proc, the 1-minute load average."""
    import os
    import time

    try:
        counts = []
        for i in range(samples):
            with open("/proc/loadavg", encoding="ascii") as fh:
                counts.append(int(fh.read().split()[3].split("/")[0]) - 1)
            if i + 1 < samples:
                time.sleep(interval)
        return max(0, sorted(counts)[len(counts) // 2])
    except (OSError, ValueError, IndexError):
        return max(0, round(os.getloadavg()[0])) if hasattr(os, "getloadavg") else 0


def resolve_threads(spec: int | str | None) -> int | None:
    """``train.num_threads`` as a count: ``auto`` is the cores this process may use (its CPU affinity) less those
    busy with other work, at least 1 — torch's default takes every core, and two runs that both do so on one
    machine run many times slower than with one thread each. ``auto`` is also at most ``$OMP_NUM_THREADS`` where
    that is set to a count (as torch's own default is). None: leave torch's default."""
    import os

    if spec is None or isinstance(spec, int):
        return spec
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        cores = min(cores, int(omp))
    return max(1, cores - busy_cores())


def autocast(device: torch.device, precision: str):
    """A training step's autocast in ``precision`` (fp32, bf16 or fp16: what :func:`kgc.encoding.precision.choose`
    made of ``train.amp`` on this machine, ``model.precision``), on CUDA or the CPU; fp32: nothing."""
    from kgc.encoding.precision import autocast as precision_autocast

    if device.type not in ("cuda", "cpu"):
        return nullcontext()
    return precision_autocast(device.type, precision)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(modules: Iterable[nn.Module], lr: float, weight_decay: float, *,
                   other: set[int] = frozenset(), other_lr: float | None = None,
                   fused: bool = False) -> torch.optim.AdamW:
    """AdamW; biases, LayerNorm weights and the temperature are excluded from weight decay. Parameters whose
    ``id`` is in ``other`` (a conditioner's own parameters) train at ``other_lr`` when it is given. ``fused``
    (every parameter on a GPU): torch's fused kernel, one launch for the whole update instead of several per
    parameter; its state is the same as the loop version's, so a checkpoint resumes on either."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module in modules:
        for name, p in module.named_parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            key = (other_lr is not None and id(p) in other, any(k in name for k in NO_DECAY))
            groups.setdefault(key, []).append(p)
    order = [(False, False), (False, True), (True, False), (True, True)]  # fixed: resumable optimiser state
    return torch.optim.AdamW([{"params": groups.get(k, []), "weight_decay": 0.0 if k[1] else weight_decay,
                               "lr": other_lr if k[0] else lr} for k in order if k[0] is False or k in groups],
                             lr=lr, **({"fused": True} if fused else {}))


def fuse_adamw(optimizer: torch.optim.Optimizer, on: bool) -> None:
    """torch's fused AdamW kernel (one kernel for the whole update, 3.5× faster than the per-parameter loop on a
    CPU) on or off for every group, whatever a resumed state said. On for a GPU and for a CPU step in bf16 (whose
    last bits are not repeatable across thread counts anyway); off for a CPU step in fp32, which stays bit for bit
    the runs saved before (tests/data/runs_at_efc2a8e.json): the two kernels round apart by ~1e-8."""
    for group in optimizer.param_groups:
        group["fused"] = bool(on)
        if on:
            group["foreach"] = None  # fused and foreach exclude each other


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    """Linear warm-up to the peak lr over ``warmup`` steps, then linear decay to 0 at ``total``. Both may be
    changed later through the returned scheduler's ``span`` dict (``train.schedule: minutes`` refits them)."""
    span = {"warmup": warmup, "total": total}

    def factor(step: int) -> float:
        if step < span["warmup"]:
            return (step + 1) / max(1, span["warmup"])
        return max(0.0, (span["total"] - step) / max(1, span["total"] - span["warmup"]))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scheduler.span = span
    return scheduler


def fit_schedule(scheduler, *, step: int, seconds_per_step: float, seconds_left: float, warmup: int,
                 most: int) -> int:
    """``train.schedule: minutes``: the step at which the minutes left run out at the pace measured (at least
    one more step, at most ``most``) becomes the schedule's end; warm-up is at most a tenth of it. Returns it."""
    total = int(min(most, max(step + 1, step + seconds_left / max(seconds_per_step, 1e-9))))
    return end_schedule_at(scheduler, total, warmup)


def end_schedule_at(scheduler, total: int, warmup: int) -> int:
    """The schedule's decay ends at step ``total``; its warm-up is ``warmup`` steps, at most a tenth of it."""
    scheduler.span.update(total=total, warmup=min(warmup, max(1, total // 10)))
    return total


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def state_bytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) state: about what torch.save writes for it."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temp file, fsync, rename: the previous checkpoint survives a kill mid-write, and a disk
    without room for it is refused before the first byte (:func:`kgc.fileio.ensure_space`) or, if it fills
    meanwhile, one message naming the folder and the bytes (exit 2), the previous checkpoint intact."""
    write_with(path, lambda tmp: torch.save(state, tmp), needed=state_bytes(state))


class MetricsLog:
    """metrics.jsonl: one JSON object per line, appended; a torn last line (after a kill) is skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trackers = None  # kgc.training.trackers.Trackers: each row also to TensorBoard, MLflow, …

    def write(self, **record: Any) -> None:
        append_line(self.path, json.dumps(record))
        if self.trackers:
            self.trackers.log(record)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def truncate_after(self, step: int) -> None:
        """On resume, drop records logged after the checkpoint we restart from (they will be redone)."""
        keep = [r for r in self.read() if r.get("step", 0) <= step]
        write_with(self.path, lambda tmp: tmp.write_text("".join(json.dumps(r) + "\n" for r in keep)))


METRIC_TITLES = {"dev_mrr": "dev MRR (filtered)", "dev_spearman": "dev Spearman"}


def plot_curves(records: list[dict[str, Any]], path: Path, metric: str = "dev_mrr", *, unit: str = "examples") -> None:
    """curves.png: loss, temperature (where the objective learns one) and the validation metric against steps
    (against ``unit`` seen where the records carry ``seen``), and the validation metric against minutes of training
    (validation excluded) where they carry ``train_seconds``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r]
    val = [r for r in records if metric in r]
    title = METRIC_TITLES.get(metric, metric)
    panels = [(train, "loss", "training loss", "step", lambda r: r["step"])]
    if any("tau" in r for r in train):
        panels.append((train, "tau", "temperature τ", "step", lambda r: r["step"]))
    if val and all("seen" in r for r in val):
        panels.append((val, metric, title, f"{unit} seen", lambda r: r["seen"]))
    else:
        panels.append((val, metric, title, "step", lambda r: r["step"]))
    timed = [r for r in val if "train_seconds" in r]
    if timed:
        panels.append((timed, metric, f"{title} by time", "training minutes (validation excluded)",
                       lambda r: r["train_seconds"] / 60))
    width, height = 4.4 * len(panels), 3.6
    fig, axes = plt.subplots(1, len(panels), figsize=(width, height))
    for ax, (rows, key, name, xlabel, x) in zip(axes, panels):
        ax.plot([x(r) for r in rows], [r[key] for r in rows], marker="o" if key == metric else None)
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    # margins in inches (tick labels, a title, an axis label: the same every run) rather than tight_layout, which
    # measures every text first and took 40 % of the figure's time; every run draws this figure
    fig.subplots_adjust(left=0.62 / width, right=1 - 0.18 / width, bottom=0.55 / height, top=1 - 0.38 / height,
                        wspace=0.26)
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def best_record(records: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The validation record with the highest ``metric`` (higher is better; the earliest of equals, as best.pt
    keeps it), or None when no record has it."""
    best = None
    for r in records:
        if metric in r and r[metric] is not None and (best is None or r[metric] > best[metric]):
            best = r
    return best


def plot_runs(runs: dict[str, list[dict[str, Any]]], path: Path, metric: str = "dev_mrr", *,
              unit: str = "examples") -> list[str]:
    """One figure comparing runs (name → metrics records): the validation metric against ``unit`` seen and
    against minutes of training (validation excluded), each run's best validation marked with a star. Returns the
    names of runs without validation records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = METRIC_TITLES.get(metric, metric)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    empty = []
    for name, records in runs.items():
        val = [r for r in records if metric in r]
        if not val:
            empty.append(name)
            continue
        seen = [r for r in val if "seen" in r]
        timed = [r for r in val if "train_seconds" in r]
        lines = [axes[0].plot([r["seen"] for r in seen], [r[metric] for r in seen], marker="o", ms=3, label=name),
                 axes[1].plot([r["train_seconds"] / 60 for r in timed], [r[metric] for r in timed], marker="o", ms=3,
                              label=name)]
        best = best_record(val, metric)
        for ax, line, key, scale in zip(axes, lines, ("seen", "train_seconds"), (1, 60)):
            if key in best:  # the best validation, in the run's colour
                ax.plot([best[key] / scale], [best[metric]], marker="*", ms=12, ls="", color=line[0].get_color(),
                        markeredgecolor="black", markeredgewidth=0.5, zorder=3)
    for ax, xlabel in zip(axes, (f"{unit} seen", "training minutes (validation excluded)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    if len(empty) < len(runs):
        axes[1].plot([], [], marker="*", ms=10, ls="", color="grey", markeredgecolor="black", label="best")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return empty
