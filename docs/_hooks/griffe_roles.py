"""Griffe extension: the Sphinx roles in kgc's docstrings (``:class:`Run```, ``:meth:`answer_many```) become links
in the API reference, and a role naming nothing that exists fails the build.

kgc's docstrings name other objects the Sphinx way. mkdocstrings does not read those roles, so, once the package
is loaded (statically, by griffe), every role in every docstring under ``kgc`` is resolved the way a reader would:
the name as written, then inside the object's own class, its module and the modules above it, then under ``kgc``.
A role that resolves becomes a cross-reference ``[`name`][kgc.full.path]`` when the API reference renders that
object (mkdocs-autorefs links it), else inline code; a role that resolves to nothing in ``kgc`` is a warning, which
``mkdocs build --strict`` turns into a failure. Roles naming other packages (``torch``, ``pykeen``) are left as
code, unchecked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

logger = griffe.get_logger("kgc_docs.roles")
EXTERNAL = {"torch", "nn", "pykeen", "transformers", "numpy", "np", "pandas", "pd", "faiss", "typer", "fastapi",
            "pydantic", "sentence_transformers", "scipy", "pathlib", "typing", "collections", "threading", "uvicorn"}
ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|mod|exc|data|obj|const):`(~?)([^`]+)`")
API_PAGES = Path(__file__).resolve().parents[1]


def rendered_identifiers() -> set[str]:
    """What the API reference renders: every ``::: identifier`` of the pages, and the members it lists."""
    out: set[str] = set()
    for page in API_PAGES.rglob("*.md"):
        current = None
        for line in page.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^:::\s+(\S+)", line)
            if m:
                current = m.group(1)
                out.add(current)
                continue
            m = re.match(r"^\s+-\s+([A-Za-z_][\w]*)\s*$", line)
            if current and m:
                out.add(f"{current}.{m.group(1)}")
            elif line and not line.startswith(" "):
                current = None
    return out


def _exists(root: griffe.Module, path: str) -> bool:
    if not path.startswith(root.path + ".") and path != root.path:
        return False
    try:
        root[path[len(root.path) + 1:]] if path != root.path else root
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def _scopes(obj: griffe.Object) -> list[str]:
    """Where a name in ``obj``'s docstring is looked up, innermost first."""
    scopes, node = [], obj
    while node is not None:
        if node.is_class or node.is_module:
            scopes.append(node.path)
        node = node.parent
    return scopes


def _resolve(root: griffe.Module, obj: griffe.Object, name: str, by_name: dict[str, list[str]]) -> str | None:
    """The full path ``name`` refers to from ``obj``'s docstring, or None when kgc has no such object. A name
    imported lazily (``kgc.Run``) or inside a function (``search_index``) is found by its own name when exactly
    one class or function of kgc has it; more than one: the first (the role is then shown, not linked)."""
    name = name.strip().lstrip("~").removesuffix("()")
    candidates = [name, *(f"{scope}.{name}" for scope in _scopes(obj)), f"{root.path}.{name}"]
    local = name.removeprefix(f"{root.path}.")
    head, _, rest = local.partition(".")
    candidates += [f"{path}.{rest}" if rest else path for path in by_name.get(head, [])]
    for candidate in candidates:
        if _exists(root, candidate):
            target = root[candidate[len(root.path) + 1:]] if candidate != root.path else root
            return target.path if not target.is_alias else (target.target_path or candidate)
    return None


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "kgc":
            return
        rendered = rendered_identifiers()
        by_name: dict[str, list[str]] = {}

        def index(obj: griffe.Object) -> None:
            for member in obj.members.values():
                if member.is_alias:
                    continue
                if member.is_class or member.is_function or member.is_module:
                    by_name.setdefault(member.name, []).append(member.path)
                index(member)

        index(pkg)

        def walk(obj: griffe.Object) -> None:
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda m: self._replace(pkg, obj, m, rendered, by_name),
                                               obj.docstring.value)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)

        walk(pkg)

    @staticmethod
    def _replace(pkg: griffe.Module, obj: griffe.Object, m: re.Match, rendered: set[str],
                 by_name: dict[str, list[str]]) -> str:
        _, short, name = m.groups()
        shown = name.strip().split(".")[-1] if short else name.strip()
        top = name.strip().lstrip(".").split(".")[0]
        target = _resolve(pkg, obj, name, by_name)
        if target is None:
            if top in EXTERNAL:
                return f"`{shown}`"  # another package's object: shown, not checked
            logger.warning(f"{obj.path}: the docstring names {m.group(0)}, which is not an object of kgc")
            return f"`{shown}`"
        if target in rendered:
            return f"[`{shown}`][{target}]"
        return f"`{shown}`"

