"""The one writer: every file the toolkit writes goes through here, so a reader (or a resumed run after SIGKILL)
sees either the old file or the complete new one, never a truncated file, and a write the folder refuses (no
permission, a read-only or full disk) is one :class:`~kgc.errors.KGCError` naming the file and the fix.

A module for each concern, all of it importable from here: :mod:`~kgc.fileio.atomic` (a file staged then renamed,
a folder staged whole), :mod:`~kgc.fileio.transaction` (several files as one commit), :mod:`~kgc.fileio.staging`
(what a killed writer leaves, swept and completed by the next process), :mod:`~kgc.fileio.lock` (one writer per run
directory), :mod:`~kgc.fileio.space` (full disks, free space, the cache home), :mod:`~kgc.fileio.digests` (sha256
once per version of a file) and :mod:`~kgc.fileio.faults` (the fault matrix's injection points).
"""

from kgc.fileio.space import (cache_home, ensure_space, free_bytes, human_bytes, LOW_SPACE, SPACE_MARGIN,
                              write_error, _fsize_limit)
from kgc.fileio.faults import (fault, renames_so_far, writes_so_far, _FAULTS)
from kgc.fileio.staging import (apply_plan, fsync_dir, JOURNAL, pid_alive, recover, STAGED_NAME_MOST, staged_prefix,
                                sweep_before_writing, sweep_leftovers, umask, _staged_name)
from kgc.fileio.atomic import (append_line, atomic_dir, atomic_path, npy_writer, staged_path, tsv_text, write_json,
                               write_npy, write_text, write_tsv, write_with)
from kgc.fileio.transaction import (sweep, Transaction)
from kgc.fileio.digests import (sha256_cached, sha256_file)
from kgc.fileio.lock import (HOLDER_FILE, LOCK_FILE, lock_holder, run_lock)

__all__ = ["cache_home", "ensure_space", "free_bytes", "human_bytes", "LOW_SPACE", "SPACE_MARGIN", "write_error",
           "_fsize_limit", "fault", "renames_so_far", "writes_so_far", "_FAULTS", "apply_plan", "fsync_dir",
           "JOURNAL", "pid_alive", "recover", "STAGED_NAME_MOST", "staged_prefix", "sweep_before_writing",
           "sweep_leftovers", "umask", "_staged_name", "append_line", "atomic_dir", "atomic_path", "npy_writer",
           "staged_path", "tsv_text", "write_json", "write_npy", "write_text", "write_tsv", "write_with", "sweep",
           "Transaction", "sha256_cached", "sha256_file", "HOLDER_FILE", "LOCK_FILE", "lock_holder", "run_lock"]
