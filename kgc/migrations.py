"""Recipe versions and the steps that upgrade an older recipe (or a saved run's ``recipe.yaml``) to the current one.

A recipe names its schema in ``version:``; a file without one is version 1 (everything before versions existed).
:func:`upgrade` applies the steps in order, each a pure function of the raw mapping, so a recipe written by any
earlier kgc loads, and a saved run trains, evaluates and answers as it did. Only this module knows history: the
schema (kgc/recipe/ and the option models of the members) describes the present.

Version 1 → 2 (2026-11-26): the flat ``model:``, ``index:`` and ``structure:`` sections became discriminated unions
(on ``model.conditioner``, ``index.type``, ``structure.model``): each member declares only the keys it reads. A
version-1 file lists keys its member never read — a saved run lists every key with its default, and version 1
ignored another index type's or structural model's keys — so this step drops them: under ``model:`` only at their
version-1 default (a changed value there was refused by version 1 too, and still is, with the member that reads
it named); under ``index:`` and ``structure:`` whatever their value (version 1 never read them).

Version 2 → 3 (2026-11-29): ``model.shared_towers`` and ``model.tail_map_rank`` became link prediction's own model
keys (``LinkPredModelKeys``), no longer in every task's ``model:``. Version 2 accepted them in a C-STS recipe at
their defaults (and ignored them), so this step drops them at those defaults where the task's model does not read
them; another value was refused by version 2 too, and still is, with the task that reads them named.

Saved runs of version 1 also carry the vintages before it, told apart by which keys they list (each described at
:func:`_saved_v1`).
"""

from __future__ import annotations

import typing
from typing import Any, Callable

from kgc.errors import KGCError

CURRENT = 3

# version 1's defaults of the model keys that became one conditioner's own (the flat ModelConfig, 2026-11-25)
V1_MODEL_DEFAULTS: dict[str, Any] = {
    "rank": None, "hypernet_form": "lowrank", "dropout": 0.1, "router_layers": None, "weighting": None,
    "scorer": "paper", "route_over": "words", "route_scales": None, "route_temperature": 1.0, "cross_attend": "none",
    "renormalise": True, "case_projection": "linear", "case_head": "paper", "case_dim": None}

# version 1's keys of the flat index and structure sections (a key not among them is a typo, and stays one)
V1_SECTION_KEYS: dict[str, frozenset[str]] = {
    "index": frozenset({"type", "nlist", "nprobe", "hnsw_m", "ef_search", "ef_construction", "pq_bytes",
                        "train_size"}),
    "structure": frozenset({"model", "dim", "epochs", "batch_size", "lr", "loss", "loss_kwargs", "model_kwargs",
                            "training_loop", "negatives", "seed", "device", "alphas", "alpha_per", "alpha_min_queries",
                            "rule_length", "rule_min_support", "rule_unseen", "rule_min_confidence",
                            "rule_max_per_relation", "rule_aggregation"})}

# version 2's defaults of the model keys that became link prediction's own (LinkPredModelKeys, 2026-11-29)
V2_MODEL_DEFAULTS: dict[str, Any] = {"shared_towers": False, "tail_map_rank": None}

# which keys a member of a union section reads: (recipe type, section, that section's mapping) -> field names,
# or None when the tag names no member (validation then says so, listing the members)
MemberKeys = Callable[[type, str, dict], "set[str] | None"]


def member_keys(recipe_type: type, section: str, tree: dict) -> set[str] | None:
    """The fields of the member of ``recipe_type``'s union section ``section`` that ``tree`` selects (its
    discriminator read as pydantic reads it); None when ``section`` is not a union or the tag selects nothing."""
    field = recipe_type.model_fields.get(section)
    if field is None:
        return None
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Annotated:  # Optional[Annotated[Union, ...]]
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a  # Annotated[M, Tag(..)]
               for a in typing.get_args(annotation)]
    members = [m for m in members if isinstance(m, type)]
    if len(members) < 2:
        return None
    for member in members:
        choose = getattr(member, "selected_by", None)
        if choose is not None and choose(tree):
            return set(member.model_fields)
    return None


def _saved_v1(tree: dict) -> None:
    """Saved runs written before the routing options settled, told apart by the keys they list.

    Runs written before ``model.cross_attend`` existed list ``router_layers: 1`` whatever their conditioner (only
    the router read it then); the bi-encoder reads it now (CSR inside the bi-encoder), so it is dropped unless the
    run is a router run. Router runs written before ``model.route_over`` existed routed over every token and scaled
    the context vectors, and keep doing so. CASE runs written before ``model.case_head`` existed trained the legacy
    heads, and keep them."""
    model = tree.get("model")
    if not isinstance(model, dict):
        return
    cond = model.get("conditioner")
    if "cross_attend" not in model and cond != "router":
        model.pop("router_layers", None)
    if cond == "router" and "route_over" not in model:
        model.update(route_over="all", route_scales="context", scorer=model.get("scorer", "query_key"),
                     weighting=model.get("weighting", "one_plus_w"))
    if "route_over" not in model and cond != "router":
        # every run saved before lists the router's keys with their defaults then, which were not today's
        if model.get("scorer") == "query_key":
            model.pop("scorer")
        if model.get("weighting") == "one_plus_w" and cond != "biencoder":
            model.pop("weighting")
    if cond == "case" and "case_head" not in model:
        model["case_head"] = "legacy"  # a CASE run from before the paper's heads: its weights are the old heads'


def _drop_unread_defaults(tree: dict, recipe_type: type, keys_of: MemberKeys, defaults: dict[str, Any]) -> None:
    """Under ``model:``, the keys of ``defaults`` that the selected member does not read, where they hold that
    default (another value stays, and validation refuses it naming who reads it)."""
    model = tree.get("model")
    if isinstance(model, dict):
        mine = keys_of(recipe_type, "model", model)
        if mine is not None:
            for key in [k for k in model if k not in mine and k in defaults]:
                if model[key] == defaults[key]:
                    del model[key]


def _v1_to_v2(tree: dict, recipe_type: type, keys_of: MemberKeys) -> None:
    """The union sections keep only their member's keys (see the module docstring)."""
    _drop_unread_defaults(tree, recipe_type, keys_of, V1_MODEL_DEFAULTS)
    for section in ("index", "structure"):
        sub = tree.get(section)
        if isinstance(sub, dict):
            mine = keys_of(recipe_type, section, sub)
            if mine is not None:
                for key in [k for k in sub if k not in mine and k in V1_SECTION_KEYS[section]]:
                    del sub[key]


def _v2_to_v3(tree: dict, recipe_type: type, keys_of: MemberKeys) -> None:
    """Link prediction's model keys at their version-2 defaults dropped where the task's model does not read them."""
    _drop_unread_defaults(tree, recipe_type, keys_of, V2_MODEL_DEFAULTS)


def version_of(tree: dict, source: str) -> int:
    version = tree.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise KGCError(f"{source}: version: {version!r} is not a recipe version; give a whole number 1..{CURRENT} "
                       f"(or leave it out: version 1)")
    if version > CURRENT:
        raise KGCError(f"{source}: a version {version} recipe, newer than this kgc reads ({CURRENT}): upgrade kgc "
                       "(pip install -U kgc), or write the recipe for version "
                       f"{CURRENT} (`kgc recipes keys` lists the keys)")
    return version


def upgrade(tree: dict, *, source: str, saved: bool, recipe_type: type, keys_of: MemberKeys = member_keys) -> dict:
    """``tree`` (a raw recipe mapping, changed in place and returned) brought to :data:`CURRENT`, step by step.
    ``saved``: a run's own ``recipe.yaml`` (its vintage read from the keys it lists); ``recipe_type``: the
    concrete recipe class of its task, whose union sections say which keys each member reads."""
    version = version_of(tree, source)
    if version == 1:
        if saved:
            _saved_v1(tree)
        _v1_to_v2(tree, recipe_type, keys_of)
    if version <= 2:
        _v2_to_v3(tree, recipe_type, keys_of)
    tree["version"] = CURRENT
    return tree
