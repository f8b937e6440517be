"""A dataset's text files read line by line: UTF-8 (a byte-order mark skipped), blank lines skipped, tab-separated
fields; anything else — a folder, a binary or unreadable file, bytes that are not UTF-8, a line of the wrong width —
is one KGCError naming the file, the line and the fix. Every graph format reads its text files through these."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from kgc.errors import KGCError


def _bad_utf8(path: Path) -> KGCError:
    """The first line of ``path`` that is not UTF-8, as one KGCError with the line, the byte and the fix."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return KGCError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1}). Save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 "
                                f"{path.name} > {path.stem}.utf8{path.suffix}` and rename it back.")
    return KGCError(f"{path}: not UTF-8 text. Save it as UTF-8.")  # pragma: no cover - decode failed above


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of each non-blank line of a UTF-8 text file (a byte-order mark is skipped), streamed.

    Anything that is not such a file — a folder, an unreadable or binary file, bytes that are not UTF-8 — ends in
    one KGCError naming the file (and the line) and the fix."""
    path = Path(path)
    if path.is_dir():
        raise KGCError(f"{path}: a folder where a text file belongs. Put the {path.name} file there instead "
                       "(docs/own-graph.md).")
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, 1):
                if "\x00" in line:
                    raise KGCError(f"{path}:{lineno}: a NUL byte: this is a binary file, not tab-separated UTF-8 "
                                   "text. Point the dataset at its text files (docs/own-graph.md).")
                line = line.rstrip("\n").rstrip("\r")
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError:
        raise _bad_utf8(path) from None
    except OSError as exc:
        raise KGCError(f"{path}: cannot be read ({exc.strerror or exc}). Check that it exists and is readable.") from None


def iter_rows(path: Path, width: int) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line, streamed (Wikidata5M: 20M triples, 4.6M texts)."""
    for lineno, line in text_lines(path):
        parts = line.split("\t")
        if width == 2 and len(parts) > 2:  # a text may itself contain tabs: keep them
            parts = [parts[0], " ".join(parts[1:])]
        if len(parts) != width:
            what = "head<TAB>relation<TAB>tail" if width == 3 else "id<TAB>text"
            raise KGCError(f"{path}:{lineno}: expected {width} tab-separated fields ({what}), "
                           f"got {len(parts)}: {line[:80]!r}. Fix or delete that line.")
        yield lineno, [p.strip() for p in parts]


def read_texts(path: Path) -> dict[str, str]:
    """id → text, read in one pass straight into the dict (no intermediate list of rows); an empty file or an
    empty id is an error."""
    out: dict[str, str] = {}
    for lineno, (key, text) in iter_rows(path, 2):
        if not key:
            raise KGCError(f"{path}:{lineno}: empty id. Every line is id<TAB>text.")
        if key in out:
            raise KGCError(f"{path}:{lineno}: id {key!r} appears twice. Keep one line per id.")
        out[key] = text
    if not out:
        raise KGCError(f"{path}: empty (no id<TAB>text lines). Fill it, or delete the file.")
    return out
