"""Atomic writes: every file the toolkit writes goes to a temp file in the same folder, then os.replace.

A reader (or a resumed run after SIGKILL) therefore sees either the old file or the complete new one,
never a truncated file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it private; the published file gets open()'s mode
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # make the bytes durable before the rename publishes them
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
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
