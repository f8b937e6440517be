"""Atomic writes: every file the toolkit writes goes to a staged file in the same folder, then ``os.replace``, and
a folder is staged whole and renamed into place (:func:`atomic_dir`, its replace journalled); what a killed writer
leaves is swept by the next process (:func:`sweep_leftovers`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from kgc.fileio.faults import fault
from kgc.fileio.space import ensure_space, write_error
from kgc.fileio.staging import staged_prefix, sweep_before_writing, umask



# ---------------------------------------------------------------- what a killed writer leaves


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
        fd, tmp = tempfile.mkstemp(prefix=staged_prefix(path), suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise (write_error(path, exc, needed) or exc) from None
    os.close(fd)
    tmp_path = Path(tmp)
    done = False
    try:
        os.chmod(tmp_path, 0o666 & ~umask())  # mkstemp makes it private; the published file gets open()'s mode
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
        tmp = Path(tempfile.mkdtemp(prefix=staged_prefix(path), suffix=".partial", dir=path.parent))
    except OSError as exc:
        raise (write_error(path, exc) or exc) from None
    old = journal = None
    try:
        os.chmod(tmp, 0o777 & ~umask())
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
                    old = Path(tempfile.mkdtemp(prefix=staged_prefix(path), suffix=".old", dir=path.parent))
                    journal = path.parent / f"{staged_prefix(path)}replace.json"
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


def npy_writer(array) -> Callable[[Path], None]:
    import numpy as np

    def save(tmp: Path) -> None:  # through a file object: np.save would append ".npy" to the temp file's name
        with open(tmp, "wb") as fh:
            np.save(fh, array)

    return save


def write_npy(path: str | os.PathLike, array) -> None:
    """Atomically ``np.save`` ``array`` to ``path``."""
    write_with(path, npy_writer(array), needed=int(array.nbytes))


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
