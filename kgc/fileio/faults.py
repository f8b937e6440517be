"""Fault injection for the tests' fault matrix: ``KGC_FAULT`` names the write, rename or commit step at which
this process fails as a full or failing disk does, or is killed (:func:`fault`); unset, nothing happens."""

from __future__ import annotations

import errno
import os
import time


_FAULTS: dict[str, int] = {}  # point -> countdown; parsed from $KGC_FAULT ("write:3", "commit:2")
_WRITES = [0]  # writes of this process so far (tests: how many points a fault sweep has)
_RENAMES = [0]  # renames that publish a file or folder, so far


def writes_so_far() -> int:
    """How many file writes (:func:`fault` points) this process made: a fault sweep's points."""
    return _WRITES[0]


def renames_so_far() -> int:
    """How many renames that publish a written file or folder this process made (``rename`` fault points)."""
    return _RENAMES[0]


def _fault_plan() -> dict[str, int]:
    spec = os.environ.get("KGC_FAULT", "")
    if spec and not _FAULTS:
        for item in spec.split(","):
            point, _, n = item.partition(":")
            _FAULTS[point.strip()] = int(n or 1)
    return _FAULTS


def fault(point: str) -> None:
    """A test hook at each file write (``write``) and each rename of a commit (``commit``): with ``KGC_FAULT=
    write:N`` the N-th write of the process fails as a full disk does (ENOSPC), with ``eio:N`` as a failing disk
    does (EIO), with ``kill:N`` it is killed (SIGKILL) there; with ``commit:N`` the process is
    killed (SIGKILL) at the N-th step of a commit (1: before its journal, then before each rename, then before
    the journal's removal); with ``rename:N`` killed at the N-th rename that publishes a file or a folder
    (``rename-eio:N``: that rename is an I/O error); with ``slow:MS`` each step of an add in ``kgc serve`` lasts
    MS milliseconds longer. Unset (always, outside tests), it does nothing."""
    plan = _fault_plan() if "KGC_FAULT" in os.environ else _FAULTS
    if point == "step":  # slow:MS — each step of a long write (an add's embedding batch) lasts MS ms longer
        if "slow" in plan:
            time.sleep(plan["slow"] / 1000)
        return
    if point == "rename":  # rename:N — killed (SIGKILL) at the N-th rename that publishes a file or folder;
        _RENAMES[0] += 1   # rename-eio:N — that rename fails as a failing disk does (EIO)
        for key in ("rename", "rename-eio"):
            if key in plan:
                plan[key] -= 1
                if plan[key] <= 0:
                    del plan[key]
                    if key == "rename":
                        os.kill(os.getpid(), 9)
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
        return
    if point == "write":
        _WRITES[0] += 1
        if "kill" in plan:  # kill:N — the process is killed (SIGKILL) at its N-th write
            plan["kill"] -= 1
            if plan["kill"] <= 0:
                os.kill(os.getpid(), 9)
    key = "eio" if point == "write" and "eio" in plan else point  # eio:N — the N-th write is an I/O error
    if key not in plan:
        return
    plan[key] -= 1
    if plan[key] > 0:
        return
    del plan[key]
    if point == "commit":
        os.kill(os.getpid(), 9)
    code = errno.EIO if key == "eio" else errno.ENOSPC
    raise OSError(code, os.strerror(code))
