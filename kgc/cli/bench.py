"""``kgc bench …``: one command per benchmark, generated from the descriptions the tasks contribute
(:class:`kgc.harness.BenchCommand`, ``Task.bench_commands``; ``kgc bench serve`` is every task's). A benchmark's
parameters become typer options and arguments here; its function runs, its result is shown, ``--out FILE`` writes
the figures as JSON."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, List, Optional

import typer

from kgc.cli.common import _echo, _int_list, bench_app

TYPES = {"int": int, "float": float, "str": str, "path": Path, "flag": bool, "ints": str, "strs": str,
         "repeat": List[str]}
OUT = inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                        default=typer.Option(None, "--out", help="write the figures as JSON"))


def _parameter(p: Any) -> inspect.Parameter:
    """A typer parameter (annotation and default) for the benchmark parameter ``p``."""
    annotation = TYPES[p.kind]
    optional = p.default is None and p.kind not in ("flag", "repeat")
    if optional:
        annotation = Optional[annotation]
    bounds = {"min": p.min} if p.min is not None and p.kind in ("int", "float") else {}
    if p.flags:
        default = list(p.default) if p.kind == "repeat" else p.default
        info = typer.Option(default, *p.flags, help=p.help or None, **bounds)
    else:
        info = typer.Argument(... if p.required else p.default, help=p.help or None, metavar=p.name.upper(), **bounds)
    return inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def _parsed(params: tuple, values: dict[str, Any]) -> dict[str, Any]:
    """Comma-separated values as lists (``--clients 1,8,32``), each checked."""
    out = dict(values)
    for p in params:
        text = values.get(p.name)
        if p.kind == "ints" and text is not None:
            out[p.name] = _int_list(p.flags[0], text, minimum=int(p.min) if p.min is not None else 1)
        elif p.kind == "strs" and text is not None:
            out[p.name] = [t.strip() for t in text.split(",") if t.strip()]
    return out


def _command(spec: Any) -> None:
    """Register ``kgc bench NAME`` for the :class:`kgc.harness.BenchCommand` ``spec``."""
    params = spec.params

    def command(**values: Any) -> None:
        from kgc import api

        result = spec.call(_parsed(params, values), _echo)
        if values.get("out"):
            api.write_json(values["out"], result)

    ordered = [_parameter(p) for p in params if not p.flags] + [_parameter(p) for p in params if p.flags]
    if not any(p.name == "out" for p in params):
        ordered.append(OUT)
    command.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in ordered}
    command.__doc__ = spec.help
    command.__name__ = f"bench_{spec.name}"
    bench_app.command(spec.name)(command)


def register() -> None:
    """Every task's benchmarks as ``kgc bench`` commands."""
    from kgc.api import bench_commands

    for spec in bench_commands(lenient=True).values():  # a broken task plugin: kgc --help still answers
        _command(spec)


register()
