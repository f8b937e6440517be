"""MkDocs hook: the references that must not drift are generated from the code at build time.

A page asks for one with a line that holds only ``<!-- generated: NAME -->``:

- ``recipe-keys``: every recipe key with its type, default and description, from ``kgc.recipe.key_reference()``
  (what ``kgc recipes keys`` prints), one table per recipe section; a key only one task reads says which.
- ``cli``: every ``kgc`` command with its usage line, its help and each argument and option as ``--help`` shows
  them, from the Typer app of ``kgc/cli/`` (``typer.main.get_command``).

An unknown name is an error, so a typo cannot leave a page silently empty. ``tests/test_docs.py`` calls
:func:`recipe_keys_markdown` and :func:`cli_markdown` directly.
"""

from __future__ import annotations

import re
from typing import Any, Callable

PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, angle brackets as entities, one line."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """An inline code span for a table cell (Python-Markdown's tables leave a pipe inside backticks alone)."""
    return "`" + " ".join(str(text).split()) + "`"


def recipe_keys_markdown() -> str:
    """One table per recipe section (``data``, ``model``, …; the top-level keys first), from the schema."""
    from kgc.recipe import key_reference

    rows = key_reference()
    sections: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        section = r["key"].split(".", 1)[0] if "." in r["key"] else ""
        sections.setdefault(section, []).append(r)
    keys_count = len({r["key"] for r in rows})
    out = [f"{keys_count} keys. A key marked with a task is read only by that task's recipes (`task: …`); one marked "
           "with a member (`model.conditioner router`, `index.type hnsw`, `structure.model rules`) exists only "
           "under it, and a key two members define differently has a row for each. A recipe that sets a key its "
           "task or member does not read is refused, with the ones that do read it named.", ""]
    for section, keys in sections.items():
        out += [f"### `{section}`" if section else "### Top level", "",
                "| key | type | default | what it does |", "|---|---|---|---|"]
        for r in keys:
            task = f" *({r['for']})*" if r["for"] else ""
            out.append(f"| {_code(r['key'])}{task} | {_code(r['type'])} | {_code(r['default'])} | "
                       f"{_cell(r['description'])} |")
        out.append("")
    return "\n".join(out)


def _commands(group: Any, path: list[str]):
    """(path, command) for every command under ``group``, depth first, in the order the CLI lists them."""
    for name, cmd in group.commands.items():
        if getattr(cmd, "hidden", False):
            continue
        if hasattr(cmd, "commands"):
            yield path + [name], cmd
            yield from _commands(cmd, path + [name])
        else:
            yield path + [name], cmd


def cli_markdown() -> str:
    """Every command's usage, help text and options, as ``kgc COMMAND --help`` prints them."""
    import typer.main

    from kgc.cli import app

    root = typer.main.get_command(app)
    ctx_class = root.context_class
    out = [_cell(root.help or ""), ""]
    for path, cmd in _commands(root, []):
        parent = ctx_class(root, info_name="kgc")
        for part in path[:-1]:
            parent = ctx_class(parent.command.commands[part], info_name=part, parent=parent)
        ctx = ctx_class(cmd, info_name=path[-1], parent=parent)
        title = "kgc " + " ".join(path)
        out += [f"## {title}", ""]
        if hasattr(cmd, "commands"):
            out += [(cmd.help or "").strip(), "",
                    "Commands: " + ", ".join(f"[`{title} {n}`](#{'-'.join(['kgc', *path, n])})"
                                              for n in cmd.commands), ""]
            continue
        out += ["```text", cmd.get_usage(ctx).strip(), "```", "", (cmd.help or "").strip(), ""]
        records = [p.get_help_record(ctx) for p in cmd.get_params(ctx)]
        records = [r for r in records if r is not None]
        if records:
            out += ["| argument / option | what it does |", "|---|---|"]
            out += [f"| {_code(name)} | {_cell(help_)} |" for name, help_ in records]
            out.append("")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {"recipe-keys": recipe_keys_markdown, "cli": cli_markdown}


def expand(markdown: str, where: str = "") -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its generated text."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{where}: <!-- generated: {name} -->: unknown; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return PLACEHOLDER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return expand(markdown, page.file.src_path)
