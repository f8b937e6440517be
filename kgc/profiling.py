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
