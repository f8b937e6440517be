"""A benchmark as a task contributes it, as data: :class:`BenchCommand` (its name, the function that measures and
returns the figures, named ``"module:function"`` and imported only when it runs, its parameters, how its result is
shown) and :class:`Param` (one parameter as the command line takes it, typer-free). ``kgc bench`` (:mod:`kgc.cli.bench`)
and ``kgc.api.bench`` are generated from them; the tasks list theirs in ``Task.bench_commands``
(:mod:`kgc.linkpred.bench.commands`, :mod:`kgc.bench`'s ``kgc bench serve``). A core module: it imports nothing of
kgc's but the errors and :mod:`kgc.lazy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kgc.errors import KGCError
from kgc.lazy import Lazy

KINDS = ("int", "float", "str", "path", "flag", "ints", "strs", "repeat")


@dataclass(frozen=True)
class Param:
    """One parameter of a benchmark as the command line takes it. ``name``: the keyword it becomes (of the
    benchmark's function, or of its ``adapt``); ``flags``: its options (``("--steps",)``, ``("--full/--no-full",)``
    for a flag pair), none for a positional argument (``required`` unless it has a default); ``kind``: int, float,
    str, path, flag, ints / strs (comma-separated, e.g. ``--clients 1,8,32``: a list; ``min`` bounds each int),
    repeat (a repeatable option: a list of strings)."""
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
