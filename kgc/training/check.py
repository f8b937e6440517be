"""``kgc recipes check RECIPE``: a recipe read as ``kgc train`` reads it — its ``extends`` chain, every key, its
dataset, what one training step needs in memory here — said without training and without writing anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kgc.errors import KGCError
from kgc.recipe import find_recipe, load_recipe


def check_recipe(name: str | Path, overrides: list[str] | None = None, *, data: bool = True) -> dict[str, Any]:
    """``{"path", "recipe", "text", "lines"}``: the recipe file ``name`` names (a file, or a shipped recipe's
    name), validated with ``overrides`` (a wrong key or value raises its one KGCError), its resolved text, and a
    line each for what was found: the recipe, the dataset (``data``: read as training reads it; not found here: a
    warning), the memory estimate of a step on this machine (not fitting here: a warning with the fixes)."""
    import torch

    from kgc.training import estimate
    from kgc.training.task import make_training, task_class

    path = find_recipe(name)
    recipe = load_recipe(path, list(overrides or []))
    model = recipe.model
    lines = [f"{path}: a valid recipe (version {recipe.version}, task {recipe.task}, conditioner {model.conditioner}, "
             f"backbone {model.backbone})"]
    task = None  # its Training: the data as read
    if data:
        try:
            task = make_training(recipe)
            lines.append(f"data: {recipe.data.dataset} read as training reads it: {task.steps_per_epoch:,} steps "
                         f"of {recipe.train.batch_size} {task_class(recipe.task).unit} an epoch")
        except KGCError as exc:
            lines.append(f"warning: data: {exc}")
    else:
        lines.append(f"data: {recipe.data.dataset} not read (--no-data): the estimate counts no entities")
    device = "cuda" if torch.cuda.is_available() and recipe.train.device != "cpu" else "cpu"
    try:
        est = estimate.estimate(recipe, task and task.counts, device=device)
    except Exception as exc:  # noqa: BLE001  (a backbone without a readable config: training says why)
        lines.append(f"warning: memory: no estimate ({type(exc).__name__}: {exc})")
    else:
        lines.append(est.line())
        if not est.fits:
            lines.append(f"warning: {estimate.refusal(est, recipe, task and task.counts)}")
    return {"path": path, "recipe": recipe, "text": f"# {path}, resolved\n{recipe.to_yaml()}", "lines": lines}
