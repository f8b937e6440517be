"""What makes a study's trials comparable (its identity, hashed into the study's name) and the metric it
optimises."""

from __future__ import annotations

from typing import Any

from kgc.errors import KGCError
from kgc.recipe import Recipe


# --set keys that change no trial's figures (where its metrics also go, what it keeps, how often it logs or saves):
# a study continued with them changed is the same study
NOT_A_TRIALS = ("train.trackers", "train.keep", "train.log_every", "train.checkpoint_every", "train.num_threads",
                "train.check_memory", "train.profile_steps", "tune.trials", "tune.timeout", "name")


def study_identity(recipe: Recipe, space: dict, fixed: dict, metric: str) -> dict[str, Any]:
    """What makes a study's trials comparable — the space, the budget and reports, the pruner, the sampler, the
    metric, the --set values — with a short digest of it (the default study name's suffix)."""
    import hashlib
    import json

    tc = recipe.tune
    identity = {"space": {k: {f: v for f, v in space[k].model_dump().items() if v is not None and v is not False}
                          for k in sorted(space)},
                "budget": tc.budget, "reports": tc.reports, "pruner": tc.pruner, "sampler": tc.sampler,
                "metric": metric, "fixed": {k: fixed[k] for k in sorted(fixed) if not k.startswith(NOT_A_TRIALS)}}
    identity["digest"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return identity


def _identity_text(a: dict, other: dict | None = None) -> str:
    """What ``a`` says (only where it differs from ``other``, when given): 'budget "4 steps", space train.lr
    {...}' — within the space and the --set values, only the keys that differ."""
    keys = [k for k in ("budget", "reports", "pruner", "sampler", "metric", "space", "fixed")
            if other is None or a.get(k) != other.get(k)] or ["space"]
    parts = []
    for k in keys:
        mine, theirs = a.get(k), (other or {}).get(k)
        if other is not None and isinstance(mine, dict) and isinstance(theirs, dict):
            inner = sorted(set(mine) | set(theirs))
            shown = {key: mine.get(key, "(unset)") for key in inner if mine.get(key) != theirs.get(key)}
            parts.append(f"{k} " + ", ".join(f"{key}={value!r}" for key, value in shown.items()))
        else:
            parts.append(f"{k} {mine!r}")
    return ", ".join(parts)


def resolve_metric(task, name: str | None) -> tuple[str, str]:
    """(the dev figure a study optimises, "maximize" or "minimize"): ``name`` as the task's validation reports it
    (``dev_hits_at_10``), without its ``dev_`` prefix (``hits_at_10``) or as PyKEEN writes it (``hits@10``);
    None: the task's metric (the one that picks best.pt)."""
    if name is None:
        return task.metric, task.dev_metrics.get(task.metric, "maximize")
    key = name.strip().lower().replace("@", "_at_")
    key = key if key.startswith("dev_") else f"dev_{key}"
    if key not in task.dev_metrics:
        raise KGCError(f"tune.metric {name!r}: not a dev figure of {task.title}; it reports "
                       + ", ".join(f"{k} ({'higher' if d == 'maximize' else 'lower'} is better)"
                                   for k, d in task.dev_metrics.items()))
    return key, task.dev_metrics[key]
