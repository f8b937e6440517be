"""References by name (kgc.lazy): every "module:attr" string of kgc is a lazy(...) the import graph sees, and the
layer contract fails on one that runs up, as on an import."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from kgc.errors import KGCError
from kgc.lazy import Lazy, lazy, references, references_in

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kgc"


def _contract(name: str):
    """The contract of pyproject.toml named ``name`` as lint-imports builds it (lazy edges included)."""
    from tests import lint_contracts

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    options = next(c for c in config["contracts"] if c["name"].startswith(name))
    kinds = dict(t.split(": ") for t in config["contract_types"])
    cls = getattr(lint_contracts, kinds[options["type"]].rsplit(".", 1)[1])
    return cls(name=options["name"], session_options={"root_packages": ["kgc"]}, contract_options=options)


def test_an_upward_lazy_reference_breaks_the_layer_contract():
    """A lazy reference planted in kgc.data to the CLI fails the layers contract naming its line, as an import
    would; the same graph without it keeps the contract."""
    import grimp

    from tests.lint_contracts import add_lazy_edges

    contract = _contract("kgc layers")
    graph = grimp.build_graph("kgc", cache_dir=None)
    assert contract.check(graph, verbose=False).kept  # the house as it is (its own lazy edges added by check)
    planted = references_in('ENTRY = lazy("kgc.cli.answer:app")\n', "kgc.data.planted")
    assert [(r.importer, r.imported, r.line) for r in planted] == [("kgc.data.planted", "kgc.cli.answer", 1)]
    graph = grimp.build_graph("kgc", cache_dir=None)
    add_lazy_edges(graph, planted)
    check = contract.check(graph, verbose=False)
    assert not check.kept
    assert "kgc.data.planted" in repr(check.metadata) and "kgc.cli.answer" in repr(check.metadata)


def test_the_graph_sees_what_kgc_api_hands_out():
    """kgc.api.QueryOptions is kgc.linkpred.answer.query's: the edge is kgc.linkpred.task's reference; the bench
    commands' f-strings of module constants are read too; the registry's are its built-ins."""
    edges = {(r.importer, r.imported) for r in references(PACKAGE)}
    assert ("kgc.linkpred.task", "kgc.linkpred.answer.query") in edges
    assert ("kgc.linkpred.bench.commands", "kgc.linkpred.bench.speed") in edges
    assert ("kgc.linkpred.bench.commands", "kgc.linkpred.bench.commands") in edges  # show=lazy(f"{__name__}:…")
    assert {b for a, b in edges if a == "kgc.registry"} == {
        "kgc.conditioning", "kgc.linkpred", "kgc.csts", "kgc.linkpred.index.types", "kgc.linkpred.structure.kinds",
        "kgc.training.trackers", "kgc.data.formats"}
    from kgc.api import QueryOptions
    from kgc.linkpred.answer.query import QueryOptions as Defined

    assert QueryOptions is Defined


def test_every_reference_by_name_in_kgc_is_lazy():
    """No "kgc.module:attr" string outside a lazy(...) call: each is an edge the import graph sees."""
    pattern = re.compile(r"kgc(\.[a-z_]+)+:[A-Za-z_]+")
    bare = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inside = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "lazy"
                  for a in ast.walk(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.fullmatch(node.value) \
                    and id(node) not in inside:
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not bare, bare


def test_a_lazy_reference_is_checked_and_loads():
    ref = lazy("kgc.linkpred.answer.query:QueryOptions")
    assert isinstance(ref, str) and ref == "kgc.linkpred.answer.query:QueryOptions"
    assert (ref.module, ref.attribute) == ("kgc.linkpred.answer.query", "QueryOptions")
    assert ref.load().__name__ == "QueryOptions" and Lazy("kgc.errors").load().__name__ == "kgc.errors"
    with pytest.raises(KGCError, match="write it as 'package.module:attribute'"):
        lazy("kgc linkpred: no")
    with pytest.raises(KGCError, match=r"kgc.data.x:2: lazy\(name\): its target must be readable"):
        references_in("name = 'kgc.cli'\nX = lazy(name)\n", "kgc.data.x")
