"""Named wall-clock sections, summed while :func:`collect` is active (``kgc bench train --profile``) and free
otherwise: ``with section("tail tower"): …``. Sections may nest (the layer-cache reads inside a tower's forward);
each total is its own wall time, so nested sections are parts of their parents, not additions."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

_totals: dict[str, float] | None = None


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    if _totals is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        _totals[name] += time.perf_counter() - start


@contextlib.contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Sum every :func:`section` entered inside the block into the returned dict (name → seconds)."""
    global _totals
    previous, _totals = _totals, defaultdict(float)
    try:
        yield _totals
    finally:
        _totals = previous


# What makes the host wait for a GPU, seen from the CPU: reading a value back (item, bool, int, tolist, numpy, cpu),
# operators whose output size depends on the data (nonzero, unique, masked_select, boolean indexing, repeat_interleave
# without its size), and host-made tensors (torch.tensor / as_tensor / arange … without a device) that a step would
# copy over from pageable memory.
_READ_BACK = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}
_DATA_SIZED = {"nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select", "nonzero_numpy",
               }
_FACTORIES = {"tensor", "as_tensor", "from_numpy", "arange", "zeros", "ones", "full", "empty", "randperm", "randint",
              "rand", "randn", "eye", "linspace"}


@contextlib.contextmanager
def count_syncs() -> Iterator[dict[str, int]]:
    """Count, inside the block, the calls that would synchronise the host with a GPU, as ``{what: calls}`` (an empty
    dict: none). Runs on the CPU, where nothing synchronises, so a test can hold a training step to "never waits"
    without a GPU; on a GPU ``torch.cuda.set_sync_debug_mode("error")`` is the stricter check
    (``tests/test_cuda.py``). Factories are counted only without a ``device=``: with one, nothing is copied."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict[str, int] = defaultdict(int)

    class _Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in _READ_BACK:
                counts[f"read back: Tensor.{name}"] += 1
            elif name in _FACTORIES and getattr(func, "__module__", "") in ("torch", "torch._C._VariableFunctions") \
                    and kwargs.get("device") is None and not (args and isinstance(args[0], torch.Tensor)):
                counts[f"host tensor: torch.{name} without device="] += 1
            return func(*args, **kwargs)

    class _Operators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name in _DATA_SIZED:
                counts[f"data-sized: aten.{name}"] += 1
            elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
                counts["data-sized: aten.repeat_interleave without output_size"] += 1
            elif name in ("index", "index_put", "index_put_") and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
                    if i is not None):
                counts[f"data-sized: aten.{name} with a boolean index"] += 1
            return func(*args, **kwargs)

    with _Functions(), _Operators():
        yield counts


PROFILE_WARMUP = 10  # steps before a profiled window (train.profile_steps): allocations, compilation, the first tables
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ",
               "cudaMemcpy\0")  # the runtime calls where the host waits ("cudaMemcpy" alone, not cudaMemcpyAsync)


def profile_table(prof, *, steps: int, seconds: float, top: int = 12) -> str:
    """A finished ``torch.profiler.profile`` over ``steps`` training steps taking ``seconds`` of wall time, as a short
    markdown page (not a trace): the top operators by GPU time and by CPU time (self times, ms per step), the GPU's
    idle share of the window (1 − kernel time / wall time), and host-device synchronisations per step (the CUDA
    runtime's synchronise and blocking-copy calls)."""
    events = prof.key_averages()

    def device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    kernels_us = sum(device_us(e) for e in events)
    gpu = kernels_us > 0
    syncs = sum(e.count for e in events if any((e.key + "\0").startswith(c) for c in _SYNC_CALLS))
    lines = [f"{steps} steps in {seconds:.2f} s ({1000 * seconds / steps:.1f} ms a step)" +
             (f"; GPU kernels {kernels_us / 1e3 / steps:.1f} ms a step, the GPU idle "
              f"{max(0.0, 1 - kernels_us / 1e6 / seconds):.0%} of the window" if gpu else "; no GPU kernels (a CPU run)") +
             f"; host-device synchronisations: {syncs / steps:.1f} a step", ""]
    tables = [("GPU", device_us)] if gpu else []
    tables.append(("CPU", lambda e: float(e.self_cpu_time_total)))
    for name, key in tables:
        rows = sorted((e for e in events if key(e) > 0), key=key, reverse=True)[:top]
        lines += [f"| top operators by {name} time | calls a step | ms a step | share |", "|---|---|---|---|"]
        total = sum(key(e) for e in events) or 1.0
        for e in rows:
            lines.append(f"| `{e.key[:60]}` | {e.count / steps:.1f} | {key(e) / 1e3 / steps:.2f} | {key(e) / total:.0%} |")
        lines.append("")
    return "\n".join(lines)


class StepProfiler:
    """``train.profile_steps``: torch.profiler over ``steps`` training steps from step ``start`` on; when they are
    done, :func:`profile_table` goes to ``write`` (a function of the markdown). The device is synchronised once at
    each end of the window, outside it, so the window's wall time is its steps' own."""

    def __init__(self, start: int, steps: int, device, write) -> None:
        self.start, self.steps, self.device, self.write = start, steps, device, write
        self.prof = None
        self.began = 0.0

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before(self, step: int) -> None:
        """Before training step ``step`` + 1 (``step`` done so far)."""
        if step != self.start or self.prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._sync()
        self.prof = profile(activities=activities)
        self.prof.__enter__()
        self.began = time.perf_counter()

    def after(self, step: int) -> None:
        """After the step that brought the count to ``step``."""
        if self.prof is None or step < self.start + self.steps:
            return
        self._sync()
        seconds = time.perf_counter() - self.began
        self.prof.__exit__(None, None, None)
        self.write(profile_table(self.prof, steps=step - self.start, seconds=seconds))
        self.prof = None
        self.start = -1  # once
