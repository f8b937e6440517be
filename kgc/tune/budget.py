"""A trial's budget (``tune.budget``: N of the task's unit, steps or minutes) as training keys, and the steps it
reports at (``tune.reports``)."""

from __future__ import annotations

import math
import re
from typing import Any

from kgc.errors import KGCError
from kgc.recipe import Recipe


def parse_budget(text: str | None, unit: str) -> tuple[str, float] | None:
    """"20000 triples" → ("examples", 20000); "200 steps"; "5 minutes"; None: the recipe's own training."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", text)
    kinds = {unit: "examples", "examples": "examples", "steps": "steps", "minutes": "minutes"}
    if not m or m.group(2) not in kinds or float(m.group(1)) <= 0:
        raise KGCError(f"tune.budget {text!r}: write 'N {unit}', 'N steps' or 'N minutes' (e.g. '20000 {unit}')")
    return kinds[m.group(2)], float(m.group(1))


def budget_overrides(recipe: Recipe, budget: tuple[str, float] | None, reports: int) -> dict[str, Any]:
    """The training keys that make a trial of ``recipe`` (its values already set) spend the budget, validating
    ``reports`` times on the way."""
    # validate_every_epoch: also at the last step (the loop ends its epoch there) and at each epoch's end
    out: dict[str, Any] = {"eval.validate_every_epoch": True}
    if budget is None:
        steps = recipe.train.max_steps
    elif budget[0] == "minutes":
        out.update({"train.max_minutes": budget[1], "train.schedule": "minutes"})
        steps = None
    else:
        steps = int(budget[1]) if budget[0] == "steps" else math.ceil(budget[1] / recipe.train.batch_size)
        out.update({"train.max_steps": max(steps, 1), "train.epochs": max(recipe.train.epochs, 10_000)})
    if steps and reports > 1:  # reports - 1 on the way, the last at the end
        out["eval.validate_every_steps"] = max(1, steps // reports)
    return out


def report_steps(last: int | None, reports: int) -> list[int] | None:
    """The steps a trial of ``last`` steps validates at: ``reports`` − 1 evenly on the way and the last, exactly
    ``reports`` validations (fewer where the budget has fewer steps); None for a budget in minutes (the steps are not
    known: each epoch's end and ``eval.validate_every_steps`` then)."""
    if not last:
        return None
    every = max(1, last // max(1, reports))
    return sorted({min(last, every * i) for i in range(1, max(1, reports))} | {last})


def _budget_text(budget: tuple[str, float] | None, unit: str) -> str:
    """The budget as the recipe wrote it: "5248 triples a trial" (examples in the task's unit)."""
    if budget is None:
        return "the recipe's own training"
    return f"{budget[1]:g} {unit if budget[0] == 'examples' else budget[0]} a trial"
