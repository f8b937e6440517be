"""One exception type for bad input: the CLI prints its message and exits 2, no traceback."""

from __future__ import annotations


class KGCError(Exception):
    """User-facing error: the message names the file/line/key at fault and the fix."""
