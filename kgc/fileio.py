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
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from kgc.errors import DiskFull, KGCError, RunBusy

# errno values that mean "this folder cannot be written": the fix is the user's (permissions, space)
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # EFBIG: a file-size limit (`ulimit -f`), full for that file
LOW_SPACE = 64 << 20  # a library's write error (torch, safetensors, faiss) with less free than this: a full disk
SPACE_MARGIN = 16 << 20  # kept free beyond a write's known size by :func:`ensure_space`


def cache_home() -> Path:
    """``$KGC_CACHE_HOME`` (default ``~/.cache/kgc``): the layer, graph, token and synthetic-data caches live under it."""
    return Path(os.environ.get("KGC_CACHE_HOME", Path.home() / ".cache" / "kgc")).expanduser()


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Free bytes for an unprivileged writer on the disk that holds ``folder`` (or its nearest existing parent)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _fsize_limit() -> int | None:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _full_message(path: Path, needed: int | None, reason: str) -> DiskFull:
    free = free_bytes(path.parent)
    need = f"it needs {human_bytes(needed)}" if needed else "it needs more space"
    have = f", {human_bytes(free)} free" if free is not None else ""
    limit = _fsize_limit()
    hint = f" (this process may write files of at most {human_bytes(limit)}: `ulimit -f`)" if limit else ""
    return DiskFull(f"{path}: cannot be written ({reason}): {need}{have} on the disk that holds {path.parent}"
                    f"{hint}. Nothing was changed. Free space there (or move the run to a larger disk) and run this "
                    "again.")


def write_error(path: str | os.PathLike, exc: BaseException, needed: int | None = None, *,
                written: int | None = None) -> KGCError | None:
    """The KGCError for an error raised writing ``path`` when its cause is the user's to fix (no permission, a
    read-only or full disk), else None. ``needed``: the bytes the write needs, when known, for the message.

    Libraries that write files themselves do not always raise an ``OSError`` on a full disk (torch.save: a
    RuntimeError "unexpected pos"; safetensors: SafetensorError; FAISS: RuntimeError "fwrite"): such an error is
    read as a full disk when the disk has less than :data:`LOW_SPACE` free, or the file (``written`` bytes so far)
    reached the process's file-size limit."""
    path = Path(path)
    if isinstance(exc, KGCError):
        return exc
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno in _UNWRITABLE:
            return KGCError(f"{path}: cannot be written ({reason}). Make {path.parent} writable (e.g. `chmod -R u+w "
                            f"{path.parent}` as its owner), or copy the run to a folder you can write, and run this "
                            "again.")
        if exc.errno in _FULL:
            return _full_message(path, needed, reason)
        if exc.errno == errno.EIO:
            return KGCError(f"{path}: cannot be written ({reason}): the disk or its filesystem reported an I/O error. "
                            f"Nothing was changed. Check the disk that holds {path.parent} (e.g. `dmesg`), or move "
                            "the run to another disk, and run this again.")
        if exc.errno is not None:
            return None
        # an OSError without errno ("4320 requested and 2144 written": numpy) is read as the libraries' errors are
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: never a disk's
        return None
    text = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    code = re.search(r"\(os error (\d+)\)", str(exc))  # a Rust library's io::Error (tokenizers, safetensors)
    if code is not None and not isinstance(exc, OSError):
        return write_error(path, OSError(int(code.group(1)), text), needed, written=written)
    free, limit = free_bytes(path.parent), _fsize_limit()
    at_limit = limit is not None and written is not None and written >= limit
    if "No space left" in str(exc) or (free is not None and free < LOW_SPACE) or at_limit:
        return _full_message(path, needed, text)
    return None


def ensure_space(path: str | os.PathLike, needed: int | None, what: str = "") -> None:
    """Refuse (:class:`DiskFull`) before writing ``needed`` bytes to ``path`` when the disk that holds it has less
    free (plus :data:`SPACE_MARGIN`): a known-size write fails before its first byte, not half-way."""
    if not needed:
        return
    path = Path(path)
    free = free_bytes(path.parent)
    if free is not None and free < needed + SPACE_MARGIN:
        reserve = "" if free < needed else (f" and kgc keeps {human_bytes(SPACE_MARGIN)} free beside it (the disk "
                                            "would be full before the rest of the run's writes)")
        raise _full_message(path, needed + SPACE_MARGIN,
                            f"{what or path.name} needs {human_bytes(needed)}{reserve}, {human_bytes(free)} free")


# ---------------------------------------------------------------- fault injection (tests)

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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make the renames and removals in ``folder`` durable (a no-op where a folder cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- what a killed writer leaves

_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.(tmp|tx|partial|old)$")


STAGED_NAME_MOST = 160  # bytes of a target's name kept in its staged name (a file system allows 255 in all)


def _staged_name(name: str) -> str:
    """The target's name as its staged files carry it: whole when short; a long one (a recipe copied to a
    250-character name) cut, with a digest of the whole, so ``.NAME.PID.XXXXXXXX.replace.json`` fits in 255 bytes."""
    if len(name.encode("utf-8", "surrogateescape")) <= STAGED_NAME_MOST:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    cut = name.encode("utf-8", "surrogateescape")[:STAGED_NAME_MOST - 13].decode("utf-8", "ignore")
    return f"{cut}~{digest}"


def _prefix(path: Path) -> str:
    """A staged file's or folder's name starts with its target's and this process's id: ``.NAME.PID.``, so the
    next process can tell a dead writer's leftovers from a live one's (:func:`sweep_leftovers`)."""
    return f".{_staged_name(path.name)}.{os.getpid()}."


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (this one: yes; another user's: yes)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def sweep_leftovers(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove what writers that are no longer alive left staged in ``folder`` (a killed process's ``.tmp``,
    ``.tx``, ``.partial`` and ``.old``: their names carry their pid); ``name``: only those of that target. A live
    writer's (this process's too) are never touched; a folder that cannot be read or written is left as it is.
    Returns what was removed. The first staged write of a process into a folder sweeps it
    (:func:`sweep_before_writing`), and opening a run sweeps the run."""
    folder = Path(folder)
    gone: list[Path] = []
    if (folder / JOURNAL).exists():  # a commit to complete first: its staged files are the new state
        with contextlib.suppress(OSError, KGCError):
            recover(folder)
        if (folder / JOURNAL).exists():
            return gone
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return gone
    replaces = [Path(e.path) for e in entries if (m := _REPLACING.match(e.name)) and not pid_alive(int(m["pid"]))]
    for journal in replaces:  # a folder replace a killed process left half-done: completed first
        try:
            if journal.exists():
                _finish_replace(folder, journal)
        except (OSError, ValueError, KeyError, TypeError):
            return gone  # its folders are evidence: nothing here is swept until it can be completed
    if replaces:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return gone
    for entry in entries:
        m = _LEFTOVER.match(entry.name)
        if m is None or (name is not None and m.group("name") != _staged_name(name)) or pid_alive(int(m.group("pid"))):
            continue
        path = Path(entry.path)
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if entry.is_dir(follow_symlinks=False) else path.unlink()
            gone.append(path)
    return gone


_SWEPT: set[tuple[int, str]] = set()  # (pid, folder) of the folders this process has swept already


def sweep_before_writing(folder: Path) -> None:
    """What a staged write into ``folder`` does first: complete a commit left pending there (every time: a cheap
    check), and sweep the leftovers of dead writers once per folder and process — not before every write, which
    would scan a folder of many files once per file written."""
    key = (os.getpid(), os.path.abspath(folder))
    if key in _SWEPT and not (folder / JOURNAL).exists():
        return
    sweep_leftovers(folder)
    if not (folder / JOURNAL).exists():
        _SWEPT.add(key)


@contextlib.contextmanager
def staged_path(path: str | os.PathLike, *, needed: int | None = None, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path next to ``path`` to write; when the block succeeds its bytes are fsynced and it is
    left in place (the caller renames it); when it fails it is removed, and a full disk, a quota or a folder that
    refuses writes is one KGCError (:func:`write_error`). ``needed``: the bytes it will take, checked first."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ensure_space(path, needed)
        sweep_before_writing(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=_prefix(path), suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise (write_error(path, exc, needed) or exc) from None
    os.close(fd)
    tmp_path = Path(tmp)
    done = False
    try:
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it private; the published file gets open()'s mode
        fault("write")
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # make the bytes durable before a rename publishes them
            os.fsync(fh.fileno())
        done = True
    except Exception as exc:  # a full disk while writing (any library's way of saying so), a read-only folder
        written = tmp_path.stat().st_size if tmp_path.exists() else None
        error = write_error(path, exc, needed, written=written)
        if error is None or error is exc:
            raise
        raise error from None
    finally:
        if not done and tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds (a failed or
    interrupted write leaves the previous file as it was). ``needed``: the bytes it will take, checked first."""
    path = Path(path)
    with staged_path(path, needed=needed) as tmp:
        yield tmp
    try:
        fault("rename")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise (write_error(path, exc, needed) or exc) from None


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield a new empty folder beside ``path``; when the block succeeds it is renamed onto ``path``, so the
    folder appears complete or not at all (on failure it is removed). ``path`` may exist as an empty folder;
    with ``replace`` a non-empty one is moved aside first and removed after the rename. The folder gets the
    permissions of a plain ``mkdir`` (``mkdtemp`` makes it private).

    A replace is two renames (the old folder aside, the new one in): before them a small journal beside ``path``
    (``.NAME.PID.replace.json``) names both folders, so a process killed between them leaves a state the next one
    that sweeps the parent folder completes — the new folder put in place, the old one removed
    (:func:`_finish_replace`) — never two hidden folders for a sweep to delete."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_before_writing(path.parent)
        tmp = Path(tempfile.mkdtemp(prefix=_prefix(path), suffix=".partial", dir=path.parent))
    except OSError as exc:
        raise (write_error(path, exc) or exc) from None
    old = journal = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        try:
            fault("write")
            yield tmp
        except OSError as exc:  # a full or read-only disk under the block's writes: one message (a library's own
            error = write_error(path, exc) if exc.errno is not None else None  # error for it: the caller names
            if error is None:                                                  # the file it was writing)
                raise
            raise error from None
        try:
            if path.exists():
                if replace and (not path.is_dir() or any(path.iterdir())):
                    old = Path(tempfile.mkdtemp(prefix=_prefix(path), suffix=".old", dir=path.parent))
                    journal = path.parent / f"{_prefix(path)}replace.json"
                    write_json(journal, {"target": path.name, "new": tmp.name, "old": old.name})
                    fault("rename")
                    path.rename(old / path.name)
                else:
                    path.rmdir()  # an empty folder; anything else is the caller's error, raised here
            fault("rename")
            os.replace(tmp, path)
        except BaseException as exc:
            if old is not None and (old / path.name).exists() and not path.exists():  # the previous folder back
                (old / path.name).rename(path)
            if isinstance(exc, OSError) and exc.errno is not None and (error := write_error(path, exc)) is not None:
                raise error from None
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if journal is not None:
            journal.unlink(missing_ok=True)


_REPLACING = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.replace\.json$")


def _finish_replace(folder: Path, journal: Path) -> None:
    """Complete the folder replace a killed process's ``journal`` describes (:func:`atomic_dir`): the new folder,
    whole when the journal was written, is put in place (the old one moved aside if still there), the old one
    removed, then the journal. Raises OSError or ValueError when it cannot (the journal and folders are kept)."""
    plan = json.loads(journal.read_text(encoding="utf-8"))
    target, new, old = folder / plan["target"], folder / plan["new"], folder / plan["old"]
    if new.is_dir():  # not yet in place
        if target.exists():
            old.mkdir(exist_ok=True)
            target.rename(old / target.name)
        os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)
    journal.unlink()
    fsync_dir(folder)


def write_text(path: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    with atomic_path(path, needed=len(data)) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_with(path: str | os.PathLike, writer: Callable[[Path], None], *, needed: int | None = None) -> None:
    """Atomically write ``path`` with ``writer(tmp_path)`` (for torch.save, np.save, faiss, savefig); ``needed``:
    the bytes it will take when known (checked against the free space first)."""
    with atomic_path(path, needed=needed) as tmp:
        writer(tmp)


def _npy_writer(array) -> Callable[[Path], None]:
    import numpy as np

    def save(tmp: Path) -> None:  # through a file object: np.save would append ".npy" to the temp file's name
        with open(tmp, "wb") as fh:
            np.save(fh, array)

    return save


def write_npy(path: str | os.PathLike, array) -> None:
    """Atomically ``np.save`` ``array`` to ``path``."""
    write_with(path, _npy_writer(array), needed=int(array.nbytes))


# ---------------------------------------------------------------- several files as one transaction

JOURNAL = ".commit.json"  # a folder's pending commit: the renames that publish its staged files


class Transaction:
    """Several files of one folder replaced (or removed) together: after a failure, a kill or a power loss the
    folder holds all of the new files or none of them, never some.

    Each file is written beside its final name (``.NAME.XXXX.tx``) and fsynced (:meth:`write_with`); a failed
    write (a full disk: one :class:`DiskFull` naming the folder and the bytes) removes what was staged and leaves
    the folder as it was. :meth:`commit` then writes the journal ``.commit.json`` (atomically: it is the commit
    point, as SQLite's journal or PostgreSQL's WAL record), renames every staged file onto its name, removes what
    was to go, and deletes the journal. A process killed between the journal and its deletion leaves a journal
    that :func:`recover` (called by every reader of such a folder) completes: renames need no space, so rolling
    forward cannot fail for lack of it. Staged files without a journal are an uncommitted transaction's: the next
    writer (:func:`sweep`, under the run's lock) removes them.

    Use as a context manager: leaving the block by an exception aborts (removes the staged files)::

        with Transaction(run.index) as tx:
            tx.write_npy("entities.npy", table)
            tx.write_json("meta.json", meta)
            tx.commit()
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.staged: dict[str, Path] = {}
        self.removed: list[str] = []
        self.committed = False

    def __enter__(self) -> "Transaction":
        recover(self.folder)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()

    def write_with(self, name: str, writer: Callable[[Path], None], *, needed: int | None = None) -> Path:
        """Stage ``name``, written by ``writer(tmp_path)``; returns the staged path (readable until the commit)."""
        if name in self.staged:
            self.staged.pop(name).unlink(missing_ok=True)
        with staged_path(self.folder / name, needed=needed, suffix=".tx") as tmp:
            writer(tmp)
        self.staged[name] = tmp
        return tmp

    def write_text(self, name: str, text: str) -> Path:
        data = text.encode("utf-8")
        return self.write_with(name, lambda tmp: tmp.write_bytes(data), needed=len(data))

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(obj, indent=2, sort_keys=False) + "\n")

    def write_npy(self, name: str, array) -> Path:
        return self.write_with(name, _npy_writer(array), needed=int(array.nbytes))

    def remove(self, name: str) -> None:
        """Remove ``name`` (if it exists) when the transaction commits."""
        self.removed.append(name)

    def path(self, name: str) -> Path:
        """Where ``name`` is now: its staged copy, else the folder's."""
        return self.staged.get(name, self.folder / name)

    def commit(self) -> None:
        """Publish every staged file and removal at once (see the class)."""
        plan = {"replace": [[tmp.name, name] for name, tmp in self.staged.items()],
                "remove": [n for n in self.removed if n not in self.staged]}
        journal = self.folder / JOURNAL
        try:
            fault("commit")
            write_json(journal, plan)  # the commit point
            fsync_dir(self.folder)
        except BaseException:
            self.abort()
            raise
        self.committed = True
        try:
            _apply(self.folder, plan)
        except OSError as exc:  # past the commit point: the journal holds the change, a later process completes it
            raise KGCError(f"{self.folder}: the update was committed ({JOURNAL} names every file) but a rename in it "
                           f"failed ({exc.strerror or exc}). The next kgc command that opens {self.folder} completes "
                           "it; check the disk (e.g. `dmesg`) and run this again.") from None

    def abort(self) -> None:
        for tmp in self.staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self.staged = {}


def _apply(folder: Path, plan: dict) -> None:
    for tmp, name in plan.get("replace", []):
        fault("commit")
        with contextlib.suppress(FileNotFoundError):  # renamed already (a commit completed after a kill)
            if (folder / tmp).exists():
                fault("rename")
            os.replace(folder / tmp, folder / name)
    for name in plan.get("remove", []):
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    fsync_dir(folder)
    fault("commit")
    (folder / JOURNAL).unlink(missing_ok=True)
    fsync_dir(folder)


def recover(folder: str | os.PathLike) -> bool:
    """Complete the commit a killed process left in ``folder`` (its journal names every rename), if any; True when
    there was one. Idempotent, and safe beside a writer finishing the same commit."""
    folder = Path(folder)
    journal = folder / JOURNAL
    if not journal.is_file():
        return False
    try:
        plan = json.loads(journal.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False  # its writer finished it just now
    except (OSError, ValueError):  # written atomically, so never partial; unreadable: leave it for a writer
        return False
    try:
        _apply(folder, plan if isinstance(plan, dict) else {})
    except OSError as exc:
        raise KGCError(f"{folder}: an update was interrupted ({JOURNAL}) and cannot be completed here "
                       f"({exc.strerror or exc}). Run the command again with write access to {folder}.") from None
    return True


def sweep(folder: str | os.PathLike) -> None:
    """Remove the staged files of transactions that never committed (call holding the folder's writer lock)."""
    folder = Path(folder)
    recover(folder)
    if folder.is_dir():
        for f in folder.glob(".*.tx"):
            with contextlib.suppress(OSError):
                f.unlink()


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
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")
            fh.flush()
    except OSError as exc:  # a full disk: one message (a partial line is skipped by readers)
        raise (write_error(path, exc, len(line) + 1) or exc) from None


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
