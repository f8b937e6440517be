"""``kgc recipes``: the shipped recipes by family, whole copies, every key, and a recipe checked without
training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from kgc.cli.common import _echo, app, recipe_app, recipes_app
from kgc.errors import KGCError


@recipes_app.command("keys")
def recipe_keys(task: Optional[str] = typer.Option(None, "--task", help="only the keys this task reads "
                                                                         "(linkpred, csts)"),
                grep: Optional[str] = typer.Argument(None, help="only keys containing this text, e.g. train.")) -> None:
    """Every recipe key with its type, default and what it does (from the recipe schema)."""
    from kgc import api

    rows = [r for r in api.recipe_keys(task) if grep is None or grep in r["key"]]
    if not rows:
        raise KGCError(f"no recipe key contains {grep!r}; `kgc recipes keys` lists them all")
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        whose = f"[{r['for']}] " if r.get("for") else ""
        _echo(f"{r['key']:<{width}}  {r['type']:<18} default {r['default']:<10}  {whose}{r['description']}".rstrip())


recipe_app.command("keys")(recipe_keys)  # `kgc recipe keys`, the earlier name

@recipes_app.command("list")
def recipes_list(as_json: bool = typer.Option(False, "--json", help="print one JSON list: each family's root with "
                                                                    "its variants")) -> None:
    """Every shipped recipe by family: a root (every setting written out) with its about line and what was
    measured with it (its measured: figures), then the recipes that extend it, indented under the one they start from (each writes only the keys it changes). The folder is
    the recipes/ beside kgc, or $KGC_RECIPES."""
    from kgc import api

    families = api.recipe_families()
    if as_json:
        typer.echo(json.dumps(families, indent=2, ensure_ascii=False))
        return
    rows = [(f["name"], f["summary"]) for f in families]
    rows += [("  " * v["depth"] + v["name"], v["summary"]) for f in families for v in f["variants"]]
    width = max(len(name) for name, _ in rows) if rows else 0
    for i, family in enumerate(families):
        if i:
            _echo("")
        _echo(f"{family['name']:<{width}}  {family['summary']}".rstrip())
        for v in family["variants"]:
            _echo(f"{'  ' * v['depth'] + v['name']:<{width}}  {v['summary']}".rstrip())

@recipes_app.command("copy")
def recipes_copy(name: str = typer.Argument(..., help="a recipe: its name (wn18rr_csr), file name or path"),
                 dest: Path = typer.Argument(..., help="the file to write, or a folder (DEST/NAME.yaml); -: print "
                                                       "it"),
                 force: bool = typer.Option(False, "--force", help="replace DEST when it exists"),
                 full: bool = typer.Option(False, "--full", help="every key the recipe reads, defaults included "
                                                                "(as kgc train resolves it)")) -> None:
    """Write a recipe whole, its `extends` chain merged in, to DEST: a file to edit and `kgc train DEST`."""
    from kgc import api

    if str(dest) == "-":
        typer.echo(api.recipe_text(name, full=full), nl=False)
        return
    written = api.copy_recipe(name, dest, force=force, full=full)
    what = ("every key it reads, defaults included" if full else
            "the keys that family sets, the others at their defaults (--full writes every key)")
    _echo(f"wrote {written} (recipe {name} with its `extends` chain merged in: {what}; a relative data.path made "
          f"absolute); train it: kgc train {written}")


@recipes_app.command("check")
def recipes_check(recipe: str = typer.Argument(..., help="a recipe file, or a shipped recipe's name"),
                  set_: List[str] = typer.Option([], "--set", help="override a recipe key, e.g. --set train.lr=3e-5"),
                  data: bool = typer.Option(True, "--data/--no-data", help="read the dataset as training would (its "
                                                                          "counts make the memory estimate exact)"),
                  quiet: bool = typer.Option(False, "--quiet", "-q", help="only the findings, not the recipe")
                  ) -> None:
    """Check a recipe as `kgc train` reads it (its `extends` chain, every key, the dataset, what a step needs in
    memory here) and print it resolved, without training. Exit 2 when the recipe is wrong; a dataset not found
    here, or a step that would not fit here, is a warning: the recipe may be meant for another machine."""
    from kgc import api

    report = api.check_recipe(recipe, set_, data=data)
    if not quiet:
        typer.echo(report["text"], nl=False)
    for line in report["lines"]:
        _echo(line)


@app.command("plugins")
def plugins(as_json: bool = typer.Option(False, "--json", help="one JSON list of {family, key, name, source}")) -> None:
    """Every installed member of every family (tasks, conditioners, index types, structural models, trackers,
    datasets), with the package and version each came from (built-in members: kgc)."""
    from kgc import api

    rows = api.plugins()
    if as_json:
        _echo(json.dumps(rows, indent=1))
        return
    width = max(len(r["name"]) for r in rows)
    family = None
    for r in rows:
        if r["family"] != family:
            family = r["family"]
            _echo(f"{family} ({r['key']}; plugins: entry points {r['entry_points']}):")
        _echo(f"  {r['name']:<{width}}  {r['source']}")
