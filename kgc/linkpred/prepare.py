"""Get a run ready to answer queries: find it (the newest under ./runs when none is named), make sure its
index is there and fresh (build or rebuild it, saying why), and attach the entities added to it.

This is what lets ``kgc predict --head … --relation …`` (``kgc.load()`` / ``kgc.Run.predict``) work straight
after ``kgc train RECIPE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import yaml

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.linkpred.model import LinkPredictor, Run

WEIGHTS = ("best.pt", "checkpoints/last.pt")


def _weights_mtime(folder: Path) -> float | None:
    times = [(folder / w).stat().st_mtime for w in WEIGHTS if (folder / w).is_file()]
    return max(times) if times else None


def _is_linkpred(recipe: Path) -> bool:
    try:
        tree = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(tree, dict) and tree.get("task", "linkpred") == "linkpred"


def find_latest_run(root: str | Path = "runs") -> Path:
    """The link-prediction run under ``root`` (searched recursively) whose weights were written last.

    A run directory holds ``recipe.yaml`` and ``best.pt`` or ``checkpoints/last.pt``; C-STS runs are skipped, and
    a run still training (``checkpoints/last.pt`` only, no ``best.pt`` yet) counts only when no other has weights."""
    root = Path(root)
    found = []
    if root.is_dir():
        for recipe in root.rglob("recipe.yaml"):
            folder = recipe.parent
            mtime = _weights_mtime(folder)
            if mtime is not None and _is_linkpred(recipe):
                found.append(((folder / "best.pt").is_file(), mtime, str(folder), folder))
    if not found:
        raise KGCError(f"no trained link-prediction run under {root.resolve()} (a folder with recipe.yaml and "
                       "best.pt or checkpoints/last.pt). Train one with `kgc train RECIPE` (e.g. "
                       "`kgc train recipes/umls_biencoder.yaml`), or name the run: `kgc predict RUN_DIR …`.")
    return max(found)[3]


def ensure_index(run: Run, model: LinkPredictor, graph: KnowledgeGraph, *, progress: bool = True,
                 echo: Callable[[str], None] = print) -> None:
    """Build the run's index when it has none, and rebuild it when it is stale (added entities are kept)."""
    from kgc.linkpred.index import NO_INDEX, stale_reason, stored_config
    from kgc.linkpred.inductive import rebuild_index

    reason = stale_reason(run, model)
    if reason is None:
        return
    if reason == NO_INDEX:
        echo(f"{run.path} has no index yet: building it (every entity embedded once)")
    else:
        echo(f"rebuilding the index of {run.path}: {reason}")
    # a stale index keeps its type and parameters (an ivf index built with `kgc index --type ivf` stays ivf)
    config = None if reason == NO_INDEX else stored_config(run)
    meta = rebuild_index(run, model, graph, progress=progress, config=config)
    echo(f"indexed {meta['entities']} entities in {meta.get('seconds', '?')}s → {run.path / 'index'}")
