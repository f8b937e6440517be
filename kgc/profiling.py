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
