"""What the layer contract cannot see (docs/architecture.md): a generic module — anything outside the package of a
family's members — never names a member. It asks the registry and the member's hooks instead, so adding a task
(or, later, a conditioner or an index type) is one package, and no `if name == …` hides in another layer.

The check reads the code, not the prose: every module under ``kgc/`` is parsed, and a string constant (f-string
parts included) or an import that names a member fails the test. Docstrings and comments are not code and do not
count. The names are data: extend :data:`GENERIC_MUST_NOT_NAME` with a family to hold it to the same rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kgc"
ROOT = PACKAGE.parent

# family -> what generic code must not name, and where its members live (the only places that may name them).
# ``names``: exact strings; a string or module path that starts with one of them and a dot names it too
# ("kgc.linkpred.answer.run").
GENERIC_MUST_NOT_NAME: dict[str, dict[str, list[str]]] = {
    "task": {"names": ["linkpred", "csts", "kgc.linkpred", "kgc.csts"],
             "homes": ["kgc/linkpred/", "kgc/csts/"]},
    "conditioner": {"names": ["biencoder", "router", "hypernet", "hadamard", "concat", "case",
                              "kgc.conditioning.biencoder", "kgc.conditioning.router", "kgc.conditioning.pooled",
                              "kgc.conditioning.case"],
                    "homes": ["kgc/conditioning/"]},
    "index type": {"names": ["flat", "ivf", "hnsw", "ivfpq", "sq", "kgc.linkpred.index.types"],
                   "homes": ["kgc/linkpred/"]},
}

# modules that list members by design, for every family
EXEMPT = {"kgc/registry.py": "its built-in module lists are the plugin lists",
          "kgc/migrations.py": "history: how members' saved recipes looked before (frozen, never extended)"}

# (module, name) still to move, each with its reason and owner; the test fails once one no longer occurs (drop it)
PENDING: dict[tuple[str, str], str] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _names_in(text: str, names: list[str]) -> list[str]:
    return [n for n in names if text == n or text.startswith(n + ".")]


def namings(source: str, names: list[str]) -> list[tuple[int, str, str]]:
    """(line, name, what) for each string constant and import in ``source`` that names one of ``names``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out += [(node.lineno, n, f"string {node.value!r}") for n in _names_in(node.value, names)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out += [(node.lineno, n, f"import {alias.name}") for n in _names_in(alias.name, names)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            hits = dict.fromkeys(n for m in modules for n in _names_in(m, names))
            out += [(node.lineno, n, f"from {node.module} import {', '.join(a.name for a in node.names)}")
                    for n in hits]
    return sorted(out)


def generic_modules(homes: list[str]) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if (rel := p.relative_to(ROOT).as_posix()) not in EXEMPT
                  and not any(rel.startswith(h) for h in homes))


@pytest.mark.parametrize("family", sorted(GENERIC_MUST_NOT_NAME))
def test_generic_modules_do_not_name_a_member(family):
    spec = GENERIC_MUST_NOT_NAME[family]
    found, pending_seen = [], set()
    for path in generic_modules(spec["homes"]):
        rel = path.relative_to(ROOT).as_posix()
        for line, name, what in namings(path.read_text(encoding="utf-8"), spec["names"]):
            if (rel, name) in PENDING:
                pending_seen.add((rel, name))
                continue
            found.append(f"{rel}:{line}: {what} names {family} {name!r}")
    assert not found, (f"generic code names a {family} (ask the registry or a hook on the {family}'s class; "
                       "docs/architecture.md):\n" + "\n".join(found))
    stale = [f"{rel}: {name}" for rel, name in PENDING
             if (rel, name) not in pending_seen and name in spec["names"]]
    assert not stale, "PENDING entries that no longer occur (remove them): " + ", ".join(stale)


def test_every_registered_member_is_in_the_list():
    from kgc.linkpred.index.types import TYPES
    from kgc.registry import CONDITIONERS, TASKS

    names = GENERIC_MUST_NOT_NAME["task"]["names"]
    missing = [t for t in TASKS if t not in names or f"kgc.{t}" not in names]
    missing += [c for c in CONDITIONERS if c not in GENERIC_MUST_NOT_NAME["conditioner"]["names"]]
    missing += [CONDITIONERS[c].__module__ for c in CONDITIONERS
                if CONDITIONERS[c].__module__ not in GENERIC_MUST_NOT_NAME["conditioner"]["names"]]
    missing += [t for t in TYPES if t not in GENERIC_MUST_NOT_NAME["index type"]["names"]]
    assert not missing, f"registered members missing from GENERIC_MUST_NOT_NAME: {missing}"


def test_the_check_sees_code_and_not_prose():
    source = '''"""A module about linkpred."""
import kgc.csts.model
from kgc import linkpred
from kgc.training import task  # linkpred in a comment


def f(x):
    """csts, in a docstring."""
    if x == "csts":
        return f"kgc.linkpred.{x}"
    return "link prediction"
'''
    got = [(line, name) for line, name, _ in namings(source, GENERIC_MUST_NOT_NAME["task"]["names"])]
    assert got == [(2, "kgc.csts"), (3, "kgc.linkpred"), (9, "csts"), (10, "kgc.linkpred")]


# What generic code must not sniff: a member's field read by name (``getattr(task, "graph")``,
# ``hasattr(recipe, "loss")``, ``getattr(recipe.model, "router_layers")``) is task or conditioner knowledge hidden
# from the name check above; the member answers a hook instead (``Task.workload``, ``Conditioner.plain_layers``).
# The receivers that hold a member: the object a getattr/hasattr with a literal name reads, by its root name (or the
# attribute after ``self.``).
MEMBER_HOLDERS = {"task", "training", "about", "recipe", "rec", "model", "criterion", "loss", "lo", "objective",
                  "report", "run", "cond", "conditioner", "options", "evaluation", "results", "summary", "counts"}


def _root_name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return node.attr
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def sniffings(source: str) -> list[tuple[int, str]]:
    """(line, call) for each ``getattr``/``hasattr`` of a literal name on an object that holds a member."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _root_name(node.args[0]) in MEMBER_HOLDERS):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_generic_modules_do_not_sniff_a_members_fields():
    homes = GENERIC_MUST_NOT_NAME["task"]["homes"] + [
        f"kgc/conditioning/{Path(m.replace('.', '/')).name}.py" for m in GENERIC_MUST_NOT_NAME["conditioner"]["names"]
        if m.startswith("kgc.")]
    found = [f"{path.relative_to(ROOT).as_posix()}:{line}: {call}"
             for path in generic_modules(homes) for line, call in sniffings(path.read_text(encoding="utf-8"))]
    assert not found, ("generic code reads a member's field by name (give the member a hook: Task.workload, "
                       "Conditioner.plain_layers …; docs/architecture.md):\n" + "\n".join(found))


def test_the_sniffing_check_sees_what_it_should():
    source = """
def f(task, recipe, device, self=None):
    a = getattr(task, "b", 1)
    b = hasattr(recipe, "loss")
    c = getattr(recipe.model, "router_layers", None)
    d = getattr(self.task, "graph", None)
    e = getattr(device, "type", "cpu")
    f = getattr(recipe, name)
    g = hasattr(os, "getloadavg")
"""
    assert [line for line, _ in sniffings(source)] == [3, 4, 5, 6]


def test_the_training_loop_asks_a_task_eight_things():
    """What the loop calls (kgc.training.task.Training) is a small protocol; what a task offers the tools is its
    description (Task), and each task's training adds no public method the loop would not call."""
    import inspect

    from kgc.registry import TASKS
    from kgc.training.task import Task, Training

    def public(cls) -> set[str]:
        return {n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(
            v, (property, classmethod, staticmethod)))}

    protocol = public(Training)
    assert len(protocol) <= 8, sorted(protocol)
    assert not protocol & public(Task), "a method both in the protocol and the description"
    for name in TASKS:
        training = TASKS[name].training
        assert issubclass(training, Training) and not inspect.isabstract(training), name
        extra = {n for klass in training.__mro__[:training.__mro__.index(Training)] for n in public(klass)} - protocol
        assert not extra, f"{name}'s training adds {sorted(extra)}: the loop never calls them"


def rooms_and_arrows() -> tuple[set[str], set[tuple[str, str]]]:
    """The house drawn from the imports: a room is a top-level module or sub-package of kgc; an arrow is a room
    importing another (any import in any of its modules, function-level ones included, and any lazy reference)."""
    import grimp

    from tests.lint_contracts import add_lazy_edges, kgc_references

    graph = grimp.build_graph("kgc", cache_dir=None)
    # and every lazy("module:attr") reference, but the resolver's own (kgc.registry loading each family's built-ins,
    # the edges pyproject.toml's contracts allow by name)
    add_lazy_edges(graph, [r for r in kgc_references() if r.importer != "kgc.registry"])

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    arrows = {(room(m), room(d)) for m in graph.modules for d in graph.find_modules_directly_imported_by(m)}
    return {room(m) for m in graph.modules}, {(a, b) for a, b in arrows if a != b}


def test_the_house_has_no_circle_and_fewer_arrows_per_room():
    """Issue 39 started from 78 arrows over 21 rooms (3.71 per room); a change that adds arrows faster than rooms
    makes the house harder to hold in one's head. (No arrow back up: the layer contract, pyproject.toml.)"""
    rooms, arrows = rooms_and_arrows()
    out: dict[str, set[str]] = {}
    for a, b in arrows:
        out.setdefault(a, set()).add(b)

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in out.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted((a, b) for a, b in arrows if a in reaches(b))
    assert not circles, f"rooms importing each other: {circles}"
    assert len(arrows) / len(rooms) < 78 / 21, f"{len(arrows)} arrows over {len(rooms)} rooms"


def name_problems(package: Path) -> list[str]:
    """Files (and sub-packages) of one package whose names start alike — the first five letters — as
    ``predict.py`` / ``predictor.py`` or ``service.py`` / ``serving.py`` did: one idea split by accident or two ideas
    named too alike. ``X_cache`` beside ``X`` is a cache of its subject, and fine."""
    names = sorted(p.stem for p in package.iterdir()
                   if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists()))
    problems = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a[:5] == b[:5] and b != f"{a}_cache" and a != f"{b}_cache":
                problems.append(f"{package.relative_to(ROOT)}: {a} and {b} start alike")
    return problems


def test_names_say_what_a_file_holds():
    """No two files of one package start alike; one word (``serve``) names the serving of runs, once: the other
    places are a run's ``routes``; link prediction keeps at most eight files at its top, the rest in sub-packages
    by concern (docs/architecture.md)."""
    packages = sorted({p.parent for p in PACKAGE.rglob("*.py")})
    problems = [x for pkg in packages for x in name_problems(pkg)]
    assert not problems, "\n".join(problems)
    serving = sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*")
                     if p.stem.startswith(("serve", "servi")) and "__pycache__" not in p.parts)
    assert serving == ["kgc/serve"], serving  # the package; its files say what part of serving they hold
    top = sorted(p.name for p in (PACKAGE / "linkpred").glob("*.py"))
    assert len(top) <= 8, top
    assert name_problems(Path(__file__).parent / "plugin_demo" / "kgc_demo_plugin") == []
    assert name_problems_of(["predict", "predictor", "graph", "graph_cache"]) == ["predict and predictor start alike"]


def name_problems_of(names: list[str]) -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        for n in names:
            (Path(tmp) / f"{n}.py").write_text("")
        return [p.split(": ", 1)[1] for p in name_problems(Path(tmp))]


def test_a_command_that_needs_no_model_imports_no_torch():
    """``kgc --help``, a command's ``--help`` and ``kgc recipes list`` start in about a second: nothing on their way
    imports torch, transformers or pykeen (a task's recipe options are pydantic alone; its public names and the
    flat index import torch when used). Reading a whole recipe still does: the conditioners' options live beside
    their modules."""
    import subprocess
    import sys

    probe = ("import sys\nfrom kgc.cli import app\nimport typer.testing\nrunner = typer.testing.CliRunner()\n"
             "for args in (['--help'], ['recipes', 'list'], ['predict', '--help'], ['train', '--help']):\n"
             "    assert runner.invoke(app, args).exit_code == 0, args\n"
             "print(sorted(m for m in ('torch', 'transformers', 'pykeen', 'faiss') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_kgc_bench_is_generated_from_what_the_tasks_contribute():
    """Every benchmark a task describes (BenchCommand) is a `kgc bench` command whose options reach its function:
    each command's defaults, parsed and adapted as the command line does, bind to the measuring function's own
    signature; every flag is in the command's --help; `kgc.api.bench_NAME` is `bench("NAME", …)`."""
    import inspect
    from pathlib import Path

    from typer.testing import CliRunner

    import kgc.api
    from kgc.cli import app
    from kgc.cli.bench import _parsed

    specs = kgc.api.bench_commands()
    assert {"serve", "inference", "train", "loss", "inputs", "rules", "structure", "index", "scale"} <= set(specs)
    listing = CliRunner().invoke(app, ["bench", "--help"], terminal_width=200).stdout
    for name, spec in specs.items():
        assert f" {name} " in listing, name
        values = {p.name: (Path("x") if p.required else p.default) for p in spec.params}
        parsed = _parsed(spec.params, values)
        if spec.adapt:
            args, kwargs = spec.adapt.load()(parsed)
        else:
            positional = [p.name for p in spec.params if not p.flags]
            args, kwargs = [parsed[n] for n in positional], {k: v for k, v in parsed.items() if k not in positional}
        kwargs.pop("out", None)
        inspect.signature(spec.target.load()).bind(*args, **kwargs, echo=print)  # TypeError: a lost option
        helped = CliRunner().invoke(app, ["bench", name, "--help"], terminal_width=400).stdout
        for p in spec.params:
            for flag in p.flags:
                assert flag.split("/")[0] in helped, (name, flag)
        assert kgc.api.bench_train.args == ("train",) or name != "train"
    bad = CliRunner().invoke(app, ["bench", "index", "--entities", "600", "--nprobe", "8,x"])
    assert bad.exit_code != 0
