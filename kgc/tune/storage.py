"""A study's storage: ``STUDY/study.db`` (or ``--storage``), checked before Optuna opens it, and the one message
for a database that cannot be written."""

from __future__ import annotations

import contextlib
from pathlib import Path

from kgc.errors import KGCError

STUDY_DB = "study.db"
STUDY_JSON = "study.json"  # the study this folder holds: its name and what makes its trials comparable


def trial_folders(folder: Path) -> list[str]:
    """The trial folders a study's folder holds (``trials/0000`` …), by name."""
    trials = Path(folder) / "trials"
    return sorted(p.name for p in trials.iterdir() if p.is_dir()) if trials.is_dir() else []


def check_sqlite_storage(url: str, folder: Path) -> None:
    """A study's SQLite storage, checked before Optuna opens it: a file that is not a readable SQLite database, fails
    SQLite's integrity check or holds no Optuna tables is one message naming it (not a SQLAlchemy traceback); an empty
    or missing one is a new study's — unless trial folders beside it say a study was there, when it is refused
    rather than started over (a new study would write its trials into those folders)."""
    import sqlite3

    if not url.startswith("sqlite:///"):
        return
    path = Path(url[len("sqlite:///"):])
    trials = trial_folders(folder)
    fix = ("Restore it from a copy, or give another --out for a new study (the trial folders stay as they are); "
           "nothing was started over.")
    if not path.is_file() or path.stat().st_size == 0:
        if trials:
            raise KGCError(f"{path}: the study's storage is {'missing' if not path.exists() else 'empty (0 bytes)'}, "
                           f"but {Path(folder) / 'trials'} holds {len(trials)} trial folder(s) "
                           f"({', '.join(trials[:3])}{', …' if len(trials) > 3 else ''}): the study's record is lost. "
                           + fix)
        return
    problem = None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            verdict = con.execute("PRAGMA quick_check").fetchone()[0]
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if verdict != "ok":
            problem = f"damaged (SQLite's integrity check: {verdict[:200]})"
        elif "studies" not in tables:
            problem = "a SQLite database without Optuna's tables (no studies table)"
    except sqlite3.DatabaseError as exc:
        problem = f"not a readable SQLite database ({exc})"
    if problem:
        raise KGCError(f"{path}: the study's storage is {problem}." + (
            f" {Path(folder) / 'trials'} holds {len(trials)} trial folder(s)." if trials else "") + " " + fix)


# what SQLite says when it cannot write the study (a full disk, `ulimit -f`, a read-only folder)
_SQLITE_WRITE = ("disk I/O error", "database or disk is full", "unable to open database file",
                 "attempt to write a readonly database")


def storage_error(exc: BaseException, folder: Path, storage: str | None) -> KGCError | None:
    """One KGCError for a study database that cannot be written (anywhere in ``exc``'s chain: Optuna wraps
    SQLAlchemy, which wraps sqlite3), naming the database and the fix; None for any other error."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        reason = next((w for w in _SQLITE_WRITE if w in str(e)), None)
        if reason is not None:
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    where = storage or str(folder / STUDY_DB)
    db = Path(where[len("sqlite:///"):]) if where.startswith("sqlite:///") else Path(where)
    disk = db.parent if where.startswith("sqlite:///") or not storage else folder  # the disk SQLite writes to
    if "readonly" in reason or "unable to open" in reason:
        fix = f"make {disk} writable (or pick another --out)"
    else:
        from kgc.fileio import _fsize_limit, free_bytes, human_bytes

        free, limit = free_bytes(disk), _fsize_limit()
        fix = (f"free space on the disk that holds {disk} ({human_bytes(free) if free is not None else '?'} free"
               f"{f'; this process may write files of at most {human_bytes(limit)}: `ulimit -f`' if limit else ''})")
    return KGCError(f"{where}: the study cannot be written ({reason}). It keeps every trial it recorded before "
                    f"(SQLite undid the write that failed). {fix[0].upper() + fix[1:]}, then run the same command "
                    "again to continue the study.")
