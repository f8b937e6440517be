"""Files' sha256, computed once per version of a file in a process (:func:`sha256_cached`)."""

from __future__ import annotations

import hashlib
import os


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
