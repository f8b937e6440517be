"""References by name: ``lazy("module:attribute")`` (taken from :mod:`kgc.registry`, the resolver, which re-exports it), the one type for every object kgc names in a string and imports
only when it is used (a task's public names, a benchmark's measuring function, its argument adapter and its table).

A string reference is an import the import graph cannot see: ``from kgc.api import QueryOptions`` is really an
import of ``kgc.linkpred.answer.query``, made through ``kgc.api.__getattr__`` from a string in
``kgc/linkpred/task.py``. So every such string is written as ``lazy(...)`` with its text in the call (a literal, or an
f-string of the module's own string constants and ``__name__``), and :func:`references` reads them from the source
the way the import graph reads ``import`` statements: each is an edge from the module that writes it to the module
it names. ``lint-imports`` (the contracts in pyproject.toml, through ``tests/lint_contracts.py``) and
tests/test_architecture.py add those edges to the graph they check, so a lazy reference that runs up a layer fails
as an import would.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgc.errors import KGCError

_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?")


class Lazy(str):
    """``"module:attribute"`` (or ``"module"``), checked when it is written and imported by :meth:`load`. A ``str``,
    so it is stored, compared and printed as the text it is."""

    __slots__ = ()

    def __new__(cls, target: str) -> "Lazy":
        if not isinstance(target, str) or not _TARGET.fullmatch(target):
            raise KGCError(f"lazy reference {target!r}: write it as 'package.module:attribute' (or 'package.module')")
        return super().__new__(cls, target)

    @property
    def module(self) -> str:
        return self.partition(":")[0]

    @property
    def attribute(self) -> str | None:
        return self.partition(":")[2] or None

    def load(self) -> Any:
        """The module, or its attribute, imported now."""
        import importlib

        module = importlib.import_module(self.module)
        return module if self.attribute is None else getattr(module, self.attribute)


def lazy(target: str) -> Lazy:
    """A reference by name to ``target`` (``"package.module:attribute"``), imported when it is used."""
    return Lazy(target)


@dataclass(frozen=True)
class Reference:
    """One ``lazy(...)`` in the source: ``importer`` (the module that writes it) names ``imported`` at ``line``."""
    importer: str
    imported: str
    line: int
    text: str


def _constants(tree: ast.Module, module: str) -> dict[str, str]:
    """The module's own string constants (``SPEED = "kgc.linkpred.bench.speed"``) and ``__name__``."""
    out = {"__name__": module}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _text(node: ast.AST, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) \
                    and value.value.id in constants and value.format_spec is None:
                parts.append(constants[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def module_name(path: Path, root: Path) -> str:
    """``kgc/linkpred/task.py`` → ``kgc.linkpred.task`` (``root``: the folder that holds the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def references_in(source: str, module: str, where: str = "") -> list[Reference]:
    """The ``lazy(...)`` references of one module's source; one that cannot be read without running the module is one
    KGCError naming its line (write the text in the call)."""
    tree = ast.parse(source)
    constants = _constants(tree, module)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "lazy":
            text = _text(node.args[0], constants) if len(node.args) == 1 and not node.keywords else None
            if text is None:
                raise KGCError(f"{where or module}:{node.lineno}: lazy({ast.unparse(node)[5:-1]}): its target must be "
                               "readable from the source (a literal, or an f-string of the module's string "
                               "constants and __name__), so the import graph sees the edge")
            out.append(Reference(module, Lazy(text).module, node.lineno, ast.unparse(node)))
    return out


def references(package: Path) -> list[Reference]:
    """Every ``lazy(...)`` reference in the modules of ``package`` (a folder, e.g. ``kgc/``)."""
    package = Path(package)
    out = []
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        out += references_in(path.read_text(encoding="utf-8"), module_name(path, package.parent), str(path))
    return out
