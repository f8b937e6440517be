"""import-linter's contracts over the graph kgc runs: the imports, plus an edge for every ``lazy("module:attr")``
reference (:mod:`kgc.lazy`), which grimp cannot see. pyproject.toml names these types (``lazy_layers``,
``lazy_acyclic_siblings``, ``lazy_forbidden``); each adds the edges to its copy of the graph, then checks as the
built-in contract does."""

from __future__ import annotations

import functools
from pathlib import Path

from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

PACKAGE = Path(__file__).resolve().parents[1] / "kgc"


@functools.cache
def kgc_references() -> tuple:
    """kgc's lazy references, read from its source once per process (import-linter checks each contract on its own
    copy of the graph)."""
    from kgc.lazy import references

    return tuple(references(PACKAGE))


def add_lazy_edges(graph, references=None) -> int:
    """Add each lazy reference of kgc (or ``references``) to ``graph`` as an import; returns how many."""
    refs = kgc_references() if references is None else references
    for ref in refs:
        for module in (ref.importer, ref.imported):
            if module not in graph.modules:
                graph.add_module(module)
        graph.add_import(importer=ref.importer, imported=ref.imported, line_number=ref.line,
                         line_contents=f"{ref.text}  (a lazy reference)")
    return len(refs)


class _LazyEdges:
    def check(self, graph, verbose):
        add_lazy_edges(graph)
        return super().check(graph, verbose)


class LazyLayers(_LazyEdges, LayersContract):
    """The layers contract, lazy references included."""


class LazyAcyclicSiblings(_LazyEdges, AcyclicSiblingsContract):
    """No import circle between siblings, lazy references included."""


class LazyForbidden(_LazyEdges, ForbiddenContract):
    """Forbidden imports, lazy references included."""
