"""What a killed writer leaves, and its repair: staged files and folders are named ``.NAME.PID.…`` so the next
process tells a dead writer's leftovers from a live one's (:func:`sweep_leftovers`); a folder replace journalled
before its two renames, and a transaction's commit journal (``.commit.json``, :data:`JOURNAL`), are completed by
the next process that opens the folder (:func:`recover`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from kgc.errors import KGCError
from kgc.fileio.faults import fault

def umask() -> int:
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


def staged_prefix(path: Path) -> str:
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


JOURNAL = ".commit.json"  # a folder's pending commit: the renames that publish its staged files


def apply_plan(folder: Path, plan: dict) -> None:
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
        apply_plan(folder, plan if isinstance(plan, dict) else {})
    except OSError as exc:
        raise KGCError(f"{folder}: an update was interrupted ({JOURNAL}) and cannot be completed here "
                       f"({exc.strerror or exc}). Run the command again with write access to {folder}.") from None
    return True
