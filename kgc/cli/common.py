"""What every command group shares: the Typer apps, how a line is printed, how a read-only command ends."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import typer

from kgc.errors import KGCError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Knowledge-graph completion with text encoders (SimKGC pipeline), "
                       "and conditional sentence similarity (C-STS) on the same conditioning core.")
data_app = typer.Typer(no_args_is_help=True, help="Find and fetch datasets.")
app.add_typer(data_app, name="data")
recipes_app = typer.Typer(no_args_is_help=True, help="The recipes: the shipped ones by family, whole copies to edit, "
                                                     "every key a recipe may say, and a recipe checked without "
                                                     "training.")
app.add_typer(recipes_app, name="recipes")
recipe_app = typer.Typer(no_args_is_help=True, help="`kgc recipes keys` under its earlier name.")
app.add_typer(recipe_app, name="recipe", hidden=True)  # `kgc recipe keys`: kept for scripts that say it
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks behind the performance claims (ratios in one process).")
app.add_typer(bench_app, name="bench")


def _echo(msg: str) -> None:
    """A line on stdout; "warning: …" lines in yellow, "error: …" in red (where the terminal shows colour)."""
    colour = {"warning:": typer.colors.YELLOW, "error:": typer.colors.RED}.get(msg.split(" ", 1)[0])
    typer.secho(msg, fg=colour, err=False)


ENTRY = {"main": False}  # set by kgc.cli.main: the process is the `kgc` command itself (not a test calling `app`)


def _quick_exit() -> None:
    """End a finished read-only command now: flush, then leave without the interpreter's teardown of torch and
    transformers (~0.7 s of a `kgc predict` on 2 cores). Nothing is pending: every file kgc writes was written
    atomically and closed, and the run's lock released, before this is called. Only from the real entry point."""
    if ENTRY["main"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _int_list(option: str, text: str, *, minimum: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        kind, example = ("positive integers", "8,16,32") if minimum == 1 else (f"integers >= {minimum}", "0,1,2")
        raise KGCError(f"{option} {text!r}: expected {kind} separated by commas, e.g. {option} {example}")
    return values


# ---------------------------------------------------------------- options from the model that reads them

@dataclass(frozen=True)
class ModelFlags:
    """A command's options taken from the pydantic fields of the part that reads them (names, defaults, help and
    bounds declared once, in the model): ``--max-body-mb``, ``--ef-search`` are :class:`kgc.serve.Limits`' and the
    index types' fields. As a decorator it adds one typer option per field to the command's signature and hands the
    command their values as one dict, keyword ``into``; the model validates them (once, where it is built).

    ``optional``: every option defaults to None, "not given" (``kgc index``: the existing index's value stays). A
    field may say its flag and unit in ``json_schema_extra={"cli": {"flag": "--max-body-mb", "scale": 1 << 20}}``
    (the value given is multiplied by ``scale``)."""
    into: str
    parameters: tuple[inspect.Parameter, ...]
    scales: Mapping[str, tuple[float, bool]]  # field: (scale, the field holds an int)
    defaults: Mapping[str, Any]  # field: its default in the model (the values :meth:`given` leaves out)
    lenient: bool = False  # a field named like one of the command's own options is left out (a plugin's), not an error

    @classmethod
    def of(cls, into: str, fields: Mapping[str, Any], *, optional: bool = False,
           helps: Mapping[str, str] | None = None, lenient: bool = False) -> "ModelFlags":
        """The options of ``fields`` (name → pydantic ``FieldInfo``); ``helps``: a help text to use instead of a
        field's description; ``lenient``: fields from plugins, where one that clashes with the command's own option
        is left out (still a recipe key) rather than breaking every command."""
        import annotated_types

        parameters, scales = [], {}
        for name, field in fields.items():
            cli = (field.json_schema_extra or {}).get("cli", {}) if isinstance(field.json_schema_extra, dict) else {}
            kind = _plain(field.annotation)
            scale = cli.get("scale")
            default = None if optional else field.get_default(call_default_factory=True)
            bounds: dict[str, Any] = {}
            for m in field.metadata:  # typer checks the bounds as it parses; the model checks them again
                if isinstance(m, (annotated_types.Ge, annotated_types.Gt)):
                    bounds["min"] = m.ge if isinstance(m, annotated_types.Ge) else m.gt
                elif isinstance(m, (annotated_types.Le, annotated_types.Lt)):
                    bounds["max"] = m.le if isinstance(m, annotated_types.Le) else m.lt
            bounds = {k: v / scale for k, v in bounds.items()} if scale else bounds
            if scale:
                scales[name] = (float(scale), kind is int)
                kind = float
                default = None if default is None else default / scale
            if kind not in (int, float, str, bool):
                bounds = {}
            flag = cli.get("flag") or "--" + name.replace("_", "-")
            if kind is bool and default is not False:  # on by default, or None (the part's own default): both ways
                flag = f"{flag}/--no-{flag.removeprefix('--')}"
            help_ = (helps or {}).get(name) or field.description
            annotation = Optional[kind] if optional or default is None else kind
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                                default=typer.Option(default, flag, help=help_, **bounds)))
        defaults = {n: f.get_default(call_default_factory=True) for n, f in fields.items()}
        return cls(into=into, parameters=tuple(parameters), scales=scales, defaults=defaults, lenient=lenient)

    def given(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Only the values that differ from the model's defaults: what the user asked for on the command line."""
        return {k: v for k, v in values.items() if v is not None and v != self.defaults.get(k)}

    def values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The fields' values from the options ``given`` (a scaled one back in the field's unit)."""
        out = {}
        for p in self.parameters:
            if p.name not in given:  # left out (lenient)
                continue
            v = given[p.name]
            if v is not None and p.name in self.scales:
                scale, whole = self.scales[p.name]
                v = int(round(v * scale)) if whole else v * scale
            out[p.name] = v
        return out

    def __call__(self, func: Callable) -> Callable:
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values() if p.name != self.into]
        clash = {p.name for p in own} & {p.name for p in self.parameters}
        if clash and not self.lenient:
            raise KGCError(f"{func.__name__}: option(s) {', '.join(sorted(clash))} are the command's own and a model's")
        mine = [p for p in self.parameters if p.name not in clash]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in mine}
            return func(*args, **kwargs, **{self.into: self.values(given)})

        ordered = own + mine
        command.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in ordered}
        return command


def _plain(annotation: Any) -> Any:
    """``Optional[int]`` → ``int``; other annotations as they are."""
    import types
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation
