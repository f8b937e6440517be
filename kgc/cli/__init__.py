"""The ``kgc`` command line: parse, call the library, print. Bad input exits 2 with one clear message.

One module per command group: :mod:`~kgc.cli.train` (train, compare, tune, curves), :mod:`~kgc.cli.evaluate`
(evaluate, similarity, structure, export, explain), :mod:`~kgc.cli.answer` (index, predict, serve),
:mod:`~kgc.cli.recipes`, :mod:`~kgc.cli.data` and :mod:`~kgc.cli.bench` (``kgc bench``, generated from the tasks' benchmarks);
:mod:`~kgc.cli.common` holds the Typer apps they register on."""

from __future__ import annotations

import sys

import typer

# each module registers its commands, in this order in `kgc --help`
from kgc.cli import train  # noqa: F401, I001
from kgc.cli import evaluate  # noqa: F401
from kgc.cli import answer  # noqa: F401
from kgc.cli import recipes, data, bench  # noqa: F401
from kgc.cli.common import ENTRY, app
from kgc.errors import KGCError

__all__ = ["app", "main"]


def main() -> None:
    """Entry point: typer handles usage errors (exit 2); bad input (KGCError) exits 2 with one message."""
    ENTRY["main"] = True
    try:
        app()
    except KGCError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
