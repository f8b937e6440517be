"""Several files as one transaction (:class:`Transaction`): staged, then published by the renames a journal
(``.commit.json``) lists, so a kill at any point leaves the old files or the new ones — the next reader completes
or rolls back a pending commit (:func:`recover`)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from kgc.errors import KGCError
from kgc.fileio.atomic import npy_writer, staged_path, write_json
from kgc.fileio.faults import fault
from kgc.fileio.staging import JOURNAL, apply_plan, fsync_dir, recover


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
        return self.write_with(name, npy_writer(array), needed=int(array.nbytes))

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
            apply_plan(self.folder, plan)
        except OSError as exc:  # past the commit point: the journal holds the change, a later process completes it
            raise KGCError(f"{self.folder}: the update was committed ({JOURNAL} names every file) but a rename in it "
                           f"failed ({exc.strerror or exc}). The next kgc command that opens {self.folder} completes "
                           "it; check the disk (e.g. `dmesg`) and run this again.") from None

    def abort(self) -> None:
        for tmp in self.staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self.staged = {}


def sweep(folder: str | os.PathLike) -> None:
    """Remove the staged files of transactions that never committed (call holding the folder's writer lock)."""
    folder = Path(folder)
    recover(folder)
    if folder.is_dir():
        for f in folder.glob(".*.tx"):
            with contextlib.suppress(OSError):
                f.unlink()
