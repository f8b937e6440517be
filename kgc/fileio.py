"""Atomic writes: every file the toolkit writes goes to a temp file in the same folder, then os.replace.

A reader (or a resumed run after SIGKILL) therefore sees either the old file or the complete new one,
never a truncated file. A write the folder refuses (no permission, a read-only or full disk) is one
:class:`~kgc.errors.KGCError` naming the file and the fix.

:func:`run_lock` keeps two processes from writing into one run directory at once: the second is refused with
one KGCError naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from kgc.errors import KGCError, RunBusy

# errno values that mean "this folder cannot be written": the fix is the user's (permissions, space)
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, errno.EDQUOT}


def write_error(path: str | os.PathLike, exc: OSError) -> KGCError | None:
    """The KGCError for an ``OSError`` raised writing ``path`` when its cause is the user's to fix (no
    permission, a read-only or full disk), else None."""
    path = Path(path)
    reason = exc.strerror or str(exc)
    if exc.errno in _UNWRITABLE:
        return KGCError(f"{path}: cannot be written ({reason}). Make {path.parent} writable (e.g. `chmod -R u+w "
                        f"{path.parent}` as its owner), or copy the run to a folder you can write, and run this again.")
    if exc.errno in _FULL:
        return KGCError(f"{path}: cannot be written ({reason}). Free space on the disk that holds {path.parent}, "
                        "and run this again.")
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise (write_error(path, exc) or exc) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it private; the published file gets open()'s mode
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # make the bytes durable before the rename publishes them
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except OSError as exc:  # a full disk while writing, a folder made read-only meanwhile
        raise (write_error(path, exc) or exc) from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield a new empty folder beside ``path``; when the block succeeds it is renamed onto ``path``, so the
    folder appears complete or not at all (on failure it is removed). ``path`` may exist as an empty folder;
    with ``replace`` a non-empty one is moved aside first and removed after the rename. The folder gets the
    permissions of a plain ``mkdir`` (``mkdtemp`` makes it private)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    old = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        if path.exists():
            if replace and (not path.is_dir() or any(path.iterdir())):
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
                path.rename(old / path.name)
            else:
                path.rmdir()  # an empty folder; anything else is the caller's error, raised here
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the previous folder back
                (old / path.name).rename(path)
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_with(path: str | os.PathLike, writer: Callable[[Path], None]) -> None:
    """Atomically write ``path`` with ``writer(tmp_path)`` (for torch.save, np.save, faiss, savefig)."""
    with atomic_path(path) as tmp:
        writer(tmp)


def write_npy(path: str | os.PathLike, array) -> None:
    """Atomically ``np.save`` ``array`` to ``path`` (through a file object: np.save would append ".npy" to the
    temp file's name)."""
    import numpy as np

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, array)

    write_with(path, save)


def tsv_text(rows: list[dict], fieldnames: list[str] | None = None) -> str:
    """Dict rows as tab-separated text with a header (columns: ``fieldnames`` or the first row's keys)."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames or list(rows[0]), delimiter="\t", lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_tsv(path: str | os.PathLike, rows: list[dict], fieldnames: list[str] | None = None) -> None:
    write_text(path, tsv_text(rows, fieldnames))


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line (metrics.jsonl). A partial last line after a crash is skipped by readers."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line.rstrip("\n") + "\n")
        fh.flush()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_HASHED: dict[tuple, str] = {}  # (path, size, mtime, inode) -> sha256


def sha256_cached(path: str | os.PathLike, st: os.stat_result | None = None) -> str:
    """:func:`sha256_file`, computed once per version of the file in this process (a version: its size, time and
    inode, from ``st`` when the caller has stat'ed it already): a run's model and index files are checked on every
    load, and several loads in one process must not hash them again."""
    st = st if st is not None else os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


# ---------------------------------------------------------------- one writer per run directory

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
            write_json(run_dir / HOLDER_FILE, {"pid": os.getpid(), "host": socket.gethostname(),
                                               "command": _command_line(), "what": what,
                                               "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        yield run_dir
    finally:
        if first:
            with contextlib.suppress(OSError):  # the folder may be gone (a failed new run is removed whole)
                (run_dir / HOLDER_FILE).unlink(missing_ok=True)
        lock.release()
