"""The recipe: the single home of every hyperparameter (pydantic schema, YAML + dotted overrides).

This package holds what every recipe has (data, model, encoder, train, eval: :mod:`kgc.recipe.sections`) and, here,
how a recipe is read, upgraded (:mod:`kgc.migrations`), validated and described. The members own the rest, beside their code: each conditioner
its ``model:`` options (``Conditioner.Options``, a :class:`ModelConfig` subclass; ``model`` is a discriminated
union on ``conditioner``), each task its sections (``Task.recipe_class``: the loss, link prediction's index and
structure, themselves unions on ``index.type`` and ``structure.model``). Nothing here names a member: they are
looked up in the registries. Defaults are the SimKGC paper's (batch 1024, lr 5e-5, γ = 0.02, τ₀ = 0.05 learnable,
mean pooling, 50 tokens). Unknown keys are errors that list the valid ones, and a key another member reads says
which.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence, Union

import yaml
from pydantic import BaseModel, Discriminator, Field, Tag, ValidationError, create_model

from kgc.errors import KGCError
from kgc.migrations import upgrade
from kgc.families import MISSING_DATA_PATH, find_recipe, load_tree  # noqa: F401 — find_recipe: for the layers above
from kgc.registry import CONDITIONERS, TASKS, TRACKERS
from kgc.recipe.sections import (DEFAULT_BACKBONE, DataConfig, EncoderConfig, EvalConfig,  # noqa: F401 — importable
                                 ModelConfig, ParamRange, Recipe, Section, TaskModelKeys, TrainConfig,  # from here
                                 TuneConfig)

_TYPES: dict[tuple[str, tuple[str, ...]], type[Recipe]] = {}


def recipe_type(task: str | None = None) -> type[Recipe]:
    """The concrete recipe class of ``task`` (default: the registry's): the task's registered class with ``model``
    the discriminated union (on ``conditioner``) of every registered conditioner's options, each with the keys the
    task adds to ``model:`` (``model_keys``)."""
    task_class = TASKS.lookup(task or TASKS.default)
    base = task_class.recipe_class
    extra = base.member_unions()  # the task's own unions over registries (link prediction's index types)
    names = tuple(CONDITIONERS)
    key = (task_class.name, names, tuple((f, tuple((_union(a) or ("", {}))[1])) for f, (a, _) in sorted(extra.items())))
    if key not in _TYPES:
        members = tuple(_with_task_keys(CONDITIONERS[n].Options, base.model_keys) for n in names)
        union = Annotated[Union[members], Field(discriminator="conditioner")]  # type: ignore[valid-type]
        default = members[names.index(CONDITIONERS.default)]
        _TYPES[key] = create_model(base.__name__, __base__=base, __module__=base.__module__,
                                   model=(union, Field(default_factory=default, description=Recipe.model_fields[
                                       "model"].description)), **extra)
    return _TYPES[key]


def _with_task_keys(options: type[ModelConfig], keys: Optional[type[TaskModelKeys]]) -> type[ModelConfig]:
    """A conditioner's options with a task's own model keys (their fields after the conditioner's)."""
    if keys is None:
        return options
    return create_model(options.__name__, __base__=(keys, options), __module__=options.__module__,
                        __doc__=options.__doc__)


def _union(field: Any) -> tuple[str, dict[str, type[BaseModel]]] | None:
    """``(discriminating key, {tag: member})`` when ``field`` (a FieldInfo, or an annotation; Optional or not) is a
    discriminated union of sections; None otherwise."""
    annotation, disc = (field.annotation, field.discriminator) if hasattr(field, "annotation") else (field, None)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (Union, types.UnionType) and len(args) == 1:
        annotation = args[0]  # Optional[...]
    if typing.get_origin(annotation) is Annotated:
        annotation, *meta = typing.get_args(annotation)
        disc = next((m.discriminator for m in meta if getattr(m, "discriminator", None) is not None), disc)
        disc = next((m for m in meta if isinstance(m, Discriminator)), disc)
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else ()
    if disc is None or not members:
        return None
    out: dict[str, type[BaseModel]] = {}
    key = disc if isinstance(disc, str) else getattr(disc.discriminator, "key", "")  # a callable names its key
    for member in members:
        if typing.get_origin(member) is Annotated:  # Annotated[Member, Tag("x")]
            cls, *tags = typing.get_args(member)
            out[next(t.tag for t in tags if isinstance(t, Tag))] = cls
        else:
            out[str(member.model_fields[key].default)] = member
    return key, out


def _section(annotation: Any) -> type[BaseModel] | None:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _walk(model: type[BaseModel], prefix: str, owners: tuple[str, ...], out: list) -> None:
    """``(dotted key, FieldInfo, owners)`` of every value ``model`` holds into ``out``; owners: the union members
    (``model.conditioner=router``) on the way."""
    for name, field in model.model_fields.items():
        union = _union(field)
        if union is not None:
            disc, members = union
            for tag, member in members.items():
                _walk(member, f"{prefix}{name}.", owners + (f"{prefix}{name}.{disc}={tag}",), out)
            continue
        section = _section(field.annotation)
        if section is not None:
            _walk(section, f"{prefix}{name}.", owners, out)
        else:
            out.append((f"{prefix}{name}", field, owners))


def _reference() -> list[dict[str, Any]]:
    """Every (key, field) of every task's recipe and every union member, the same definition merged: ``tasks``
    and ``members`` say who reads it (empty: every one)."""
    every_task = list(TASKS)
    merged: dict[tuple, dict[str, Any]] = {}
    union_members: dict[str, set[str]] = {}  # "model.conditioner" -> every "model.conditioner=x"
    for task in every_task:
        rows: list = []
        _walk(recipe_type(task), "", (), rows)
        for key, field, owners in rows:
            for owner in owners:
                union_members.setdefault(owner.split("=")[0], set()).add(owner)
            default = field.get_default(call_default_factory=True)
            shown = "unset" if default is None else yaml.safe_dump(default, default_flow_style=True).strip() \
                .removesuffix("...").strip()
            sig = (key, _type_name(field.annotation), shown, field.description or "")
            row = merged.setdefault(sig, {"key": key, "type": sig[1], "default": shown, "description": sig[3],
                                          "tasks": set(), "members": set()})
            row["tasks"].add(task)
            row["members"].update(owners)
    out = []
    for row in merged.values():
        members = row["members"]
        for union, every in union_members.items():
            if every <= members:  # read by every member of that union
                members -= every
        tasks = [] if set(every_task) <= row["tasks"] else sorted(row["tasks"])
        out.append({**row, "tasks": tasks, "members": sorted(members)})
    order = {k: i for i, k in enumerate(dict.fromkeys(r["key"] for r in out))}
    return sorted(out, key=lambda r: order[r["key"]])


def valid_keys() -> list[str]:
    """Every dotted key some recipe accepts (some task, some member), e.g. ``train.lr``, in schema order."""
    return list(dict.fromkeys(r["key"] for r in _reference()))


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + (
            " (optional)" if type(None) in args else "")
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def key_reference(task: str | None = None) -> list[dict[str, str]]:
    """``{key, type, default, description, for}`` for every dotted recipe key, from the schema (``kgc recipe
    keys``); ``for`` says which tasks or members read it ("" when every recipe does: ``task csts``,
    ``model.conditioner=router``). ``task``: only the keys that task reads. One key can have a row per
    definition (``model.router_layers`` means one thing to the bi-encoder and another to the router)."""
    if task is not None:
        TASKS.lookup(task)  # an unknown name: one message listing the registered ones
    # train.trackers says which trackers are installed here, and where each came from (the unions' members have a
    # row each; `kgc plugins` lists every family)
    families = {TRACKERS.key: TRACKERS}
    rows = []
    for r in _reference():
        if task is not None and r["tasks"] and task not in r["tasks"]:
            continue
        unions: dict[str, list[str]] = {}
        for member in r["members"]:
            union, _, tag = member.partition("=")
            unions.setdefault(union, []).append(tag)
        whom = ([f"task {', '.join(r['tasks'])}"] if r["tasks"] and task is None else []) + [
            f"{union} {', '.join(tags)}" for union, tags in unions.items()]
        description = r["description"]
        if r["key"] in families:
            reg = families[r["key"]]
            description += f" (installed: {', '.join(f'{n} ({reg.source(n)})' for n in reg)})"
        rows.append({"key": r["key"], "type": r["type"], "default": r["default"], "description": description,
                     "for": "; ".join(whom)})
    return rows


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise KGCError(f"--set {key}: '{part}' is not a section")
    node[parts[-1]] = value


def did_you_mean(key: str, known: Sequence[str] | set[str]) -> str:
    """"Did you mean …?" with the closest known keys (difflib), or the keys of the section the key names; the whole
    list (thousands of characters) only when neither finds any."""
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    if close:
        return f"Did you mean {' or '.join(close)}? (`kgc recipes keys` lists them all)"
    section = key.split(".", 1)[0] + "."
    same = sorted(k for k in known if k.startswith(section))
    if same:
        return f"Keys under {section}: {', '.join(same)}"
    sections = sorted({k.split(".", 1)[0] for k in known})
    return f"Recipe sections: {', '.join(sections)} (`kgc recipes keys` lists every key)"


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    known = set(valid_keys())
    for item in items:
        if "=" not in item:
            raise KGCError(f"--set {item!r}: expected key=value, e.g. --set train.lr=3e-5")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in known:
            raise KGCError(f"--set {key}: unknown recipe key. {did_you_mean(key, known)}")
        out[key] = yaml.safe_load(raw) if raw.strip() else None
    return out


def _locate(recipe_cls: type[BaseModel], loc: tuple) -> tuple[list[str], type[BaseModel] | None, str | None]:
    """``loc`` of a validation error walked through ``recipe_cls``: (the dotted key's parts without union tags, the
    section class the last part sits in, the union member's label there such as ``model.conditioner=router``)."""
    parts: list[str] = []
    cls: type[BaseModel] | None = recipe_cls
    label = None
    items = list(loc)
    while items:
        item = str(items.pop(0))
        parts.append(item)
        field = cls.model_fields.get(item) if cls is not None else None
        if field is None:
            break
        union = _union(field)
        if union is not None and items and str(items[0]) in union[1]:
            tag = str(items.pop(0))
            cls, label = union[1][tag], f"{'.'.join(parts)}.{union[0]}={tag}"
        else:
            cls = _section(field.annotation)
    parent = cls if len(parts) > 1 or cls is None else recipe_cls
    return parts, parent, label


def _explain(err: ValidationError, source: str, recipe_cls: type[BaseModel]) -> KGCError:
    lines = []
    reference = None
    for e in err.errors():
        parts, parent, label = _locate(recipe_cls, e["loc"])
        loc = ".".join(parts)
        if e["type"] == "extra_forbidden":
            prefix = ".".join(parts[:-1])
            reference = reference or _reference()
            readers = sorted({m.split("=", 1)[1] for r in reference if r["key"] == loc for m in r["members"]
                              if label and m.startswith(label.split("=")[0] + "=")})
            tasks = sorted({t for r in reference if r["key"] == loc or r["key"].startswith(loc + ".")
                            for t in r["tasks"]})
            if readers:
                lines.append(f"{loc}: not read by {label} (only by {', '.join(readers)}). Remove it, or choose "
                             f"that {label.split('=')[0].rsplit('.', 1)[-1]}.")
            elif tasks and recipe_cls.model_fields["task"].default not in tasks:
                lines.append(f"{loc}: read only by task {', '.join(tasks)}, and this recipe has task "
                             f"{recipe_cls.model_fields['task'].default}. Remove it (or set task).")
            else:
                here = list((parent.model_fields if parent is not None and prefix else recipe_cls.model_fields))
                choices = [f"{prefix}.{k}" if prefix else k for k in here]
                import difflib

                close = difflib.get_close_matches(loc, choices, n=3, cutoff=0.6)
                lines.append(f"unknown key '{loc}'." + (f" Did you mean {' or '.join(close)}?" if close else "")
                             + f" Valid keys here{f' ({label})' if label else ''}: {', '.join(choices)}")
        elif e["type"] == "union_tag_invalid":  # a member nobody registered (index.type=annoy)
            ctx = e.get("ctx", {})
            lines.append(f"'{loc}.{ctx.get('discriminator', '').strip(chr(39))}': unknown ({ctx.get('tag')!r}). "
                         f"Choose one of {ctx.get('expected_tags')}")
        elif not loc:  # a check across sections
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"'{loc}': {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})")
    return KGCError(f"{source}: bad recipe:\n  " + "\n  ".join(lines))


def read_recipe_tree(path: str | Path, *, saved: bool = False) -> dict[str, Any]:
    """The raw mapping of a YAML recipe file (``name`` defaults to the file's stem; ``extends:`` resolved by
    :func:`kgc.families.load_tree`), not yet validated nor upgraded. ``saved``: the ``recipe.yaml`` of a run
    directory (upgraded as a saved run on validation, :mod:`kgc.migrations`); a run's own recipe.yaml given as a
    recipe (`kgc train RUN/recipe.yaml --out NEW`) is read as the run was trained. A bare name that is no file here
    but a shipped recipe's (``capitals``, ``umls_biencoder.yaml``) is that recipe (``kgc train capitals``, as
    ``tune run`` takes a config's name; from an installed wheel too)."""
    from kgc.families import recipe_folder

    path = Path(path)
    if not path.exists() and path.parent == Path("."):
        shipped = recipe_folder() / f"{path.name.removesuffix('.yaml')}.yaml"
        if shipped.is_file():
            path = shipped
    if path.name == "recipe.yaml" and any((path.parent / f).exists() for f in ("metrics.jsonl", "best.pt")):
        saved = True
    tree = load_tree(path)
    if saved:
        tree[_SAVED] = True
    return tree


_SAVED = "__saved_run__"  # a marker read_recipe_tree leaves for validate_recipe (removed there)


def full_tree(path: str | Path) -> dict[str, Any]:
    """The recipe file ``path`` as a tree of every key its task and members read, with the value ``kgc train``
    resolves (defaults included): what ``kgc recipes copy --full`` writes. Its ``name`` is left out where it is
    the file's stem (a copy is named by its own file)."""
    import copy

    path = Path(path)
    tree = yaml.safe_load(validate_recipe(copy.deepcopy(load_tree(path)), source=str(path)).to_yaml())
    if tree.get("name") == path.stem:
        tree.pop("name")
    return tree


def validate_recipe(tree: dict[str, Any], overrides: dict[str, Any] | None = None, *, source: str = "recipe",
                    saved: bool = False) -> Recipe:
    """``tree`` upgraded to the current version (:func:`kgc.migrations.upgrade`), with dotted ``overrides``
    (``{"train.lr": 3e-5}``, keys already checked) applied, validated by its task's recipe class as a whole; a bad
    value or key ends in one message naming ``source``. ``saved``: a run's own recipe (already validated when the
    run was made; names of PyKEEN models are not looked up again; its vintage read from the keys it lists)."""
    saved = bool(tree.pop(_SAVED, False)) or saved
    missing = tree.pop(MISSING_DATA_PATH, None)  # the file's data.path, found nowhere: unless overridden below
    if missing and "data.path" not in (overrides or {}):
        raise KGCError(missing)
    task = tree.get("task", TASKS.default)
    for key, value in (overrides or {}).items():
        if key == "task":
            task = value
    if not isinstance(task, str) or task not in TASKS:
        raise KGCError(f"{source}: task {task!r}: unknown. Registered tasks: {', '.join(TASKS)}")
    cls = recipe_type(task)
    upgrade(tree, source=source, saved=saved, recipe_type=cls)
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    tree.setdefault("task", task)
    try:
        return cls.model_validate(tree, context={"saved": saved})
    except ValidationError as err:
        raise _explain(err, source, cls) from None


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None, *, saved: bool = False) -> Recipe:
    """Read a YAML recipe (or defaults when ``path`` is None) and apply ``key=value`` overrides (``--set``)."""
    tree = read_recipe_tree(path, saved=saved) if path is not None else {}
    return validate_recipe(tree, parse_overrides(overrides or []), source=str(path) if path is not None else "recipe",
                           saved=saved)


def override_keys(overrides: Mapping[str, Any] | Sequence[str] | None, kwargs: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Dotted key → value from ``overrides`` (a mapping, or ``key=value`` strings: the ``--set`` syntax, values as
    YAML) and ``section__key`` keyword arguments (Python names cannot hold dots). Unknown keys fail as --set does."""
    known = set(valid_keys())
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        items = list(parse_overrides(list(overrides or [])).items())
    items += [(k.replace("__", "."), v) for k, v in (kwargs or {}).items()]
    out: dict[str, Any] = {}
    for key, value in items:
        if key not in known:
            parse_overrides([f"{key}="])  # raises the same KGCError as an unknown --set key
        out[key] = value
    return out


def resolve_recipe(recipe: "str | Path | Recipe | Mapping[str, Any]",
                   overrides: Mapping[str, Any] | Sequence[str] | None = None, **kwargs: Any) -> Recipe:
    """A validated :class:`Recipe` from a path, a Recipe or a dict, with overrides applied (``kgc.resolve_recipe``)."""
    import copy

    if isinstance(recipe, (str, Path)):
        tree, source = read_recipe_tree(recipe), str(recipe)
    elif isinstance(recipe, Recipe):
        tree, source = {**recipe.model_dump(mode="json", exclude_unset=True), "version": recipe.version}, "recipe"
    elif isinstance(recipe, Mapping):
        tree, source = copy.deepcopy(dict(recipe)), "recipe"
    else:
        raise KGCError(f"recipe: expected a path to a YAML recipe, a kgc.recipe.Recipe or a dict, got "
                       f"{type(recipe).__name__}")
    return validate_recipe(tree, override_keys(overrides, kwargs), source=source)
