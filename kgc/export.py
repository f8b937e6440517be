"""``kgc export``: a trained run as folders that other tools read, without kgc.

What is written is the run's task's (:meth:`kgc.training.task.Task.export`; link prediction writes its towers as
sentence-transformers / Hugging Face folders, :mod:`kgc.linkpred.export`). Here: the target folder's rules, the same
for every task — a new or empty folder, or with ``force`` an earlier export (it holds a ``kgc.json``), never a
folder kgc did not write — and the question to the task. The task writes the folder atomically: an interrupted
export leaves nothing half-written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kgc.errors import KGCError
from kgc.registry import TASKS


def export_run(run: Any, out: str | Path, *, format: str | None = None, force: bool = False) -> dict[str, Any]:
    """Export ``run`` (a run directory, or a run ``kgc.load`` opened) into the folder ``out`` in ``format`` (None:
    the task's first); returns the ``kgc.json`` it wrote."""
    from kgc.training.task import open_run, task_class

    out = Path(out).resolve()  # the staging folder goes beside it: its parent must be a real folder
    if out.exists() and not out.is_dir():
        raise KGCError(f"{out} is a file; give a folder to export into")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise KGCError(f"{out} is not empty; choose a new folder or pass --force to replace an earlier export")
        if not (out / "kgc.json").is_file():  # --force never deletes a folder kgc did not write (a run, a home)
            raise KGCError(f"{out} is not empty and holds no kgc.json (not an earlier export); --force replaces "
                           "only an earlier export: choose a new or empty folder")
    if isinstance(run, (str, Path)):
        run = open_run(run, device="cpu", echo=None)
    task = task_class(run.task)
    if not task.export_description:
        writes = "; ".join(TASKS[name].export_description for name in TASKS.where(lambda t: t.export_description))
        raise KGCError(f"{run.path} is a {run.task} run; kgc export writes {writes or 'nothing for it'}")
    return task.export(run, out, format=format)
