"""Multi-process data-parallel training: one process per device under ``torchrun``, DDP, shared negatives.

``torchrun --nproc-per-node N -m kgc train RECIPE`` (or ``kgc train RECIPE --nproc N``, which launches
exactly that) starts N processes; :func:`init` joins them into one process group (``nccl`` on GPUs,
``gloo`` on CPUs). ``train.batch_size`` is the *global* batch: every step, rank r takes rows
``[r·B/N, (r+1)·B/N)`` of the same global batch, so N processes take the same optimiser steps on the
same examples as one process would. The objective gathers every rank's tail (and query) vectors *with
gradients* (:func:`gather_with_grad`), so each query is scored against the
global batch, false negatives are masked against the gathered ids, and the pre-batch queue holds global
batches. DDP averages the gradients; since the gather's backward sums what every rank's loss sends back
to each slice, the averaged gradient is exactly the gradient of the global batch's loss.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from kgc.errors import KGCError


def launched() -> bool:
    """True inside a ``torchrun`` group of more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def init(device_spec: str) -> torch.device:
    """Join the ``torchrun`` group (once) and return this process's device; outside torchrun, a no-op."""
    from kgc.training.common import pick_device

    device = pick_device(device_spec)
    if not launched():
        return device
    _die_with_parent()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # validation runs on rank 0 while the others wait at a barrier: allow a long one
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=3))
    return device


def _die_with_parent() -> None:
    """Linux: a worker gets SIGKILL when its torchrun agent dies (kill -9 of the launcher leaves no orphan
    ranks training on, or holding a GPU); ``--resume`` then continues the group from its last checkpoint."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if active():
        dist.barrier()


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward hands each rank the *sum over ranks* of the gradient of its slice.

    The same contract as ``torch.distributed.nn.functional.all_gather`` (deprecated in torch 2.13), done
    with one ``all_reduce`` so it runs on every backend (gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        ctx.rows = x.size(0)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)  # every rank's loss sends gradient into every slice
        start = dist.get_rank() * ctx.rows
        return grad[start: start + ctx.rows]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """(B/N, …) on each rank → (B, …) on every rank, rank order; gradients flow back to each rank's slice."""
    return _GatherWithGrad.apply(x) if active() else x


@torch.no_grad()
def gather(x: torch.Tensor) -> torch.Tensor:
    """All-gather without gradients (ids, masks)."""
    if not active():
        return x
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out, dim=0)


def mean(value: torch.Tensor) -> float:
    """The mean of a scalar tensor over ranks, as a float (the logged loss is the global batch's); reduced on
    the tensor's own device, read once."""
    if not active():
        return value.item()
    t = value.detach().reshape(1).clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def shard(batch, part: int, parts: int):
    """Rows ``[part·B/parts, (part+1)·B/parts)`` of a global batch (``B`` divisible by ``parts``)."""
    b = len(batch) // parts
    return batch[part * b: (part + 1) * b]


def check_batch(batch_size: int) -> None:
    n = world_size()
    if batch_size % n:
        raise KGCError(f"train.batch_size={batch_size} is the global batch and must divide evenly over the {n} "
                       f"processes; use a multiple of {n}, e.g. --set train.batch_size={batch_size - batch_size % n or n}")


def launch(nproc: int, argv: list[str]) -> int:
    """``kgc train … --nproc N``: re-run the same command under ``torchrun --standalone`` (a free port).

    torchrun's agent runs in this process (``torch.distributed.run.main``, what the ``torchrun`` script calls), so
    one interpreter fewer starts; it starts the N workers as ``python -m kgc …`` processes. Its exit code is the
    ``torchrun`` command's: 0, or 1 with the failure's summary on stderr when a worker failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if nproc < 1:
        raise KGCError(f"--nproc {nproc}: give 1 or more processes")
    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "kgc", *argv])
    except ChildFailedError as exc:
        print(f"torchrun: {exc}", file=sys.stderr)
        return 1
    return 0
