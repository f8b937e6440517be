"""What every command group shares: the Typer apps, how a line is printed, how a read-only command ends."""

from __future__ import annotations

import os
import sys

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
