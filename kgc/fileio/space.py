"""A write the folder refuses — no permission, a read-only or full disk, a file-size limit — as one
:class:`~kgc.errors.KGCError` naming the file and the fix, and the free space a write checks first; where kgc
keeps its caches."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from kgc.errors import DiskFull, KGCError

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
