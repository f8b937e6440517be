"""One writer per run directory: :func:`run_lock` keeps two processes from writing into one run at once (the
second is refused with one KGCError naming the holder); :func:`lock_holder` says who holds it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from kgc.errors import KGCError, RunBusy
from kgc.fileio.atomic import write_json
from kgc.fileio.space import write_error
from kgc.fileio.staging import sweep_leftovers

LOCK_FILE = ".lock"  # the file the lock is taken on (left in place: removing a locked file breaks the lock)
HOLDER_FILE = ".lock.json"  # who holds it: pid, host, command, what, since (removed on release)
_LOCKS: dict[str, Any] = {}  # one FileLock per run directory per process: reentrant within a thread
_LOCKS_GUARD = threading.Lock()


def _command_line() -> str:
    """This process's command, as a user would type it (``kgc index runs/x --add new.tsv``), shortened."""
    argv = list(sys.argv) or ["python"]
    prog = Path(argv[0]).name
    if prog == "kgc" or argv[0].replace(os.sep, "/").endswith("kgc/__main__.py") or argv[:2] == ["-m", "kgc"]:
        prog = "kgc"
    elif prog.endswith(".py"):
        prog = f"python {prog}"
    text = " ".join([prog, *argv[1:]]).strip()
    return text if len(text) <= 160 else text[:157] + "..."


def lock_holder(run_dir: str | os.PathLike) -> dict | None:
    """What ``run_dir``'s holder file says (pid, host, command, what, since), or None when there is none."""
    try:
        holder = json.loads((Path(run_dir) / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _in_use(run_dir: Path) -> KGCError:
    holder = lock_holder(run_dir)
    if holder is None:  # it was taken an instant ago, or by a kgc that wrote no holder file
        who = "another process"
    else:
        who = (f"`{holder.get('command', '?')}` ({holder.get('what', '?')}; pid {holder.get('pid', '?')} on "
               f"{holder.get('host', '?')}, since {holder.get('since', '?')})")
    return RunBusy(f"{run_dir} is in use by {who}; wait for it to finish or stop it, then run this again.")


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, what: str, *, timeout: float = 0) -> Iterator[Path]:
    """Hold ``run_dir``'s lock (``run_dir/.lock``, created with the folder if need be) while the block writes into
    it; yields ``run_dir``. ``what`` says what the holder does ("training", "building the index").

    Another process — or another thread — that holds it makes this one KGCError naming the holder (its command,
    pid, host and start time, from ``run_dir/.lock.json``) after ``timeout`` seconds (0: at once). The same
    thread may take it again inside the block (reentrant: ``add_entities`` builds a missing index under the lock
    it holds). A folder that cannot be written is one KGCError naming it and the fix. The operating system drops
    the lock of a process that dies, so a killed writer leaves nothing to clean up."""
    from filelock import FileLock, Timeout

    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise (write_error(run_dir / LOCK_FILE, exc) or exc) from None
    key = os.path.realpath(run_dir)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = FileLock(run_dir / LOCK_FILE)
    first = not lock.is_locked  # this thread's view (thread-local): a nested call only counts
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise _in_use(run_dir) from None
    except OSError as exc:
        error = write_error(run_dir / LOCK_FILE, exc)
        if error is None:
            raise
        raise KGCError(f"{run_dir} cannot be written ({exc.strerror or exc}), and {what} writes into it. Make it "
                       f"writable (e.g. `chmod -R u+w {run_dir}` as its owner), or copy the run to a folder you "
                       "can write, and run this again.") from None
    try:
        if first:
            for folder in (run_dir, run_dir / "checkpoints", run_dir / "index"):  # a killed writer's leftovers
                sweep_leftovers(folder)
            write_json(run_dir / HOLDER_FILE, {"pid": os.getpid(), "host": socket.gethostname(),
                                               "command": _command_line(), "what": what,
                                               "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        yield run_dir
    finally:
        if first:
            with contextlib.suppress(OSError):  # the folder may be gone (a failed new run is removed whole)
                (run_dir / HOLDER_FILE).unlink(missing_ok=True)
        lock.release()
