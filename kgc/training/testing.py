"""The checks a tracker must pass, kgc's own and a plugin's alike (:func:`check_tracker`; ``kgc.testing`` gathers
every family's checks)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from kgc.conditioning.testing import fail

def check_tracker(name: str) -> None:
    """The contract of tracker ``name`` (``kgc.registry.TRACKERS``): a run's rows, its end, an abort, a resume."""
    from kgc.registry import TRACKERS
    from kgc.training.trackers import check_available

    what = f"tracker {name!r}"
    if name not in TRACKERS:
        fail(what, f"not registered (known: {', '.join(TRACKERS)})")
    check_available([name])
    cls = TRACKERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        tracker = cls(run, {"train": {"lr": 1e-3}}, title="kgc.testing", resume_step=None)
        for step in (1, 2):
            tracker.log({"step": step, "epoch": 0, "loss": 1.0 / step})
        tracker.finish([])
        resumed = cls(run, {"train": {"lr": 1e-3}}, title="kgc.testing", resume_step=2)
        resumed.log({"step": 3, "epoch": 1, "loss": 0.3})
        resumed.abort()
