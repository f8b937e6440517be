"""A benchmark as a task contributes it, as data: :class:`BenchCommand` (its name, the function that measures and
returns the figures, named ``"module:function"`` and imported only when it runs, its parameters, how its result is
shown) and :class:`Param` (one parameter as the command line takes it, typer-free). ``kgc bench`` (:mod:`kgc.cli.bench`)
and ``kgc.api.bench`` are generated from them; the tasks list theirs in ``Task.bench_commands``
(:mod:`kgc.linkpred.bench.commands`, :mod:`kgc.bench`'s ``kgc bench serve``). A core module: it imports nothing of
kgc's but the errors and :mod:`kgc.lazy`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kgc.errors import KGCError
from kgc.lazy import Lazy

KINDS = ("int", "float", "str", "path", "flag", "ints", "strs", "repeat")


class _Signature:
    def __repr__(self) -> str:
        return "SIGNATURE"


SIGNATURE: Any = _Signature()  # a Param's default: the measuring function's own, read from its signature


def signature_defaults(target: "Lazy") -> dict[str, Any]:
    """The literal defaults of the parameters of ``target`` (``"module:function"``), read from the module's source
    with ``ast`` — the module is not imported (a benchmark's imports torch; ``kgc --help`` must not). A default
    that is not a literal (``Path("runs")``) is left out: its Param writes it."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(target.module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise KGCError(f"{target}: no Python source to read its defaults from")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == target.attribute), None)
    if fn is None:
        raise KGCError(f"{target}: no function {target.attribute} at the top of {spec.origin}")
    a = fn.args
    pairs = list(zip((a.posonlyargs + a.args)[len(a.posonlyargs + a.args) - len(a.defaults):], a.defaults))
    pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    out = {}
    for arg, node in pairs:
        try:
            out[arg.arg] = ast.literal_eval(node)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Param:
    """One parameter of a benchmark as the command line takes it. ``name``: the keyword it becomes (of the
    benchmark's function, or of its ``adapt``); ``flags``: its options (``("--steps",)``, ``("--full/--no-full",)``
    for a flag pair), none for a positional argument (``required`` unless it has a default); ``kind``: int, float,
    str, path, flag, ints / strs (comma-separated, e.g. ``--clients 1,8,32``: a list; ``min`` bounds each int),
    repeat (a repeatable option: a list of strings). ``default``: :data:`SIGNATURE` takes the measuring function's
    own (:func:`signature_defaults`), so a default is written once, in the function."""
    name: str
    kind: str = "str"
    default: Any = None
    flags: tuple[str, ...] = ()
    help: str = ""
    min: float | None = None
    required: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise KGCError(f"bench parameter {self.name}: kind {self.kind!r}, not one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class BenchCommand:
    """``kgc bench NAME``: ``target`` (``"module:function"``) measures and returns the figures (a JSON-able dict;
    it says its progress through an ``echo`` keyword); ``params`` are what the command line takes (``--out FILE``,
    the figures as JSON, is added to every command that declares no ``out``); ``adapt`` (``"module:function"``,
    optional) turns the parsed values into the target's ``(args, kwargs)`` where they differ (default: the
    positional arguments in order, the options as keywords); ``show`` (optional) prints the result after the
    target's own lines: ``show(result, values, echo)``."""
    name: str
    target: Lazy  # each given as a Lazy or its text (a plugin's "module:function"), kept as a Lazy
    help: str
    params: tuple[Param, ...] = ()
    adapt: Lazy | None = None
    show: Lazy | None = None

    def __post_init__(self) -> None:
        for key in ("target", "adapt", "show"):  # each a reference by name, checked now (kgc's own: lazy(...))
            value = getattr(self, key)
            if value is not None and not isinstance(value, Lazy):
                object.__setattr__(self, key, Lazy(value))
        if any(p.default is SIGNATURE for p in self.params):  # written once: in the measuring function's signature
            defaults = signature_defaults(self.target)
            params = []
            for p in self.params:
                if p.default is SIGNATURE:
                    if p.name not in defaults:
                        raise KGCError(f"kgc bench {self.name}: --{p.name.replace('_', '-')}'s default is the "
                                       f"signature's, but {self.target} has no literal default for {p.name}")
                    value = defaults[p.name]
                    if p.kind in ("ints", "strs") and isinstance(value, (tuple, list)):
                        value = ",".join(map(str, value))  # as the command line writes it: comma-separated
                    p = dataclasses.replace(p, default=value)
                params.append(p)
            object.__setattr__(self, "params", tuple(params))

    def run(self, *args: Any, **options: Any) -> dict:
        """The figures: the target called with ``args`` and ``options`` as they are (the API's way in)."""
        return self.target.load()(*args, **options)

    def call(self, values: dict[str, Any], echo: Callable[[str], None]) -> dict:
        """The figures for the command line's parsed ``values`` (``out`` aside), shown with ``echo``."""
        values = {k: v for k, v in values.items() if k != "out"}
        if self.adapt:
            args, kwargs = self.adapt.load()(values)
        else:
            positional = [p.name for p in self.params if not p.flags]
            args = [values[n] for n in positional]
            kwargs = {k: v for k, v in values.items() if k not in positional}
        result = self.run(*args, **kwargs, echo=echo)
        if self.show:
            self.show.load()(result, values, echo)
        return result
