"""A run directory: the resolved recipe, backbone files, checkpoints and results of one training run.

``open_run`` returns the task's own run class (link prediction or C-STS), read off ``recipe.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from kgc.errors import KGCError
from kgc.fileio import sha256_file
from kgc.recipe import load_recipe


class RunDir:
    """Paths and weights of a run; subclasses add ``load()`` for their task."""

    task: ClassVar[str | None] = None

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / "recipe.yaml").is_file():
            raise KGCError(f"{self.path}: not a run directory (no recipe.yaml). Train one with `kgc train RECIPE`.")
        self.recipe = load_recipe(self.path / "recipe.yaml", saved=True)
        self._weights_hash: tuple | None = None  # ((file, mtime, size), sha256): see weights_fingerprint
        if self.task is not None and self.recipe.task != self.task:
            hint = "kgc similarity RUN --s1 … --s2 … --condition …" if self.recipe.task == "csts" else \
                "kgc predict RUN --head … --relation …"
            raise KGCError(f"{self.path} is a {self.recipe.task} run, not {self.task}; use `{hint}`.")

    backbone = property(lambda self: self.path / "backbone")
    best = property(lambda self: self.path / "best.pt")
    last = property(lambda self: self.path / "checkpoints" / "last.pt")

    def weights_file(self) -> Path:
        for f in (self.best, self.last):
            if f.is_file():
                return f
        raise KGCError(f"{self.path}: no weights yet (best.pt or checkpoints/last.pt). "
                       f"Finish training or resume it: `kgc train --resume {self.path}`.")

    def model_state(self) -> dict:
        return torch.load(self.weights_file(), map_location="cpu", weights_only=False)["model"]

    def weights_fingerprint(self) -> str:
        """sha256 of the weights file, hashed once per version of it (one command checks an index's freshness
        several times; a long-lived Run that retrains sees the new file's size or time)."""
        f = self.weights_file()
        st = f.stat()
        key = (f, st.st_mtime_ns, st.st_size)
        if self._weights_hash is None or self._weights_hash[0] != key:
            self._weights_hash = (key, sha256_file(f))
        return self._weights_hash[1]


def open_run(path: str | Path) -> RunDir:
    """The run at ``path`` as its task's run class (``kgc.linkpred.model.Run`` or ``kgc.csts.model.CSTSRun``)."""
    task = RunDir(path).recipe.task
    if task == "csts":
        from kgc.csts.model import CSTSRun

        return CSTSRun(path)
    from kgc.linkpred.model import Run

    return Run(path)
