"""One file from its public home into a folder being built (the catalog's fetches; GraIL's splits)."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

from kgc.errors import KGCError


def download(url: str, path: Path, offline: str) -> None:
    """``url``'s bytes into ``path`` (a file of a staged folder: :func:`kgc.fileio.atomic_dir`); a network error is
    one KGCError naming the URL, then ``offline`` (what to copy by hand instead)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(path, "wb") as out:
            shutil.copyfileobj(resp, out)
    except OSError as exc:
        raise KGCError(f"could not download {url} ({exc}). Offline? {offline}") from None
