"""Registries: name → member, one per family (conditioners, tasks), kept in the bottom layer.

A registry sits below everything that registers into it, so a lower layer can look a member up without
importing the layer that defines it: the recipe checks ``model.conditioner`` options and ``task`` keys here,
the data catalog asks a task to check a fetched folder. Members register themselves when their module is
imported (``@CONDITIONERS.register``); the built-in members are imported on the first lookup, from the
module names given here — the one place that lists them, as a plugin list would (no import statement, so
the layer contract in pyproject.toml sees no upward import).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Callable, Generic, TypeVar

from kgc.errors import KGCError

T = TypeVar("T")


class Registry(Mapping, Generic[T]):
    """A read-only mapping name → member that loads its built-in members on first use.

    ``registry[name]`` raises ``KeyError`` like a dict; :meth:`lookup` raises a :class:`KGCError` that names
    the recipe key and lists what is registered."""

    def __init__(self, kind: str, key: str, builtins: tuple[str, ...], default: str | None = None) -> None:
        self.kind, self.key, self._builtins = kind, key, builtins
        self.default = default  # the member a recipe gets when it names none (the plugin list's one choice)
        self._members: dict[str, T] = {}
        self._loaded = False

    def register(self, member: T, name: str | None = None) -> T:
        """Add ``member`` under ``name`` (default: its ``name`` attribute); usable as a class decorator."""
        name = name or getattr(member, "name")
        if name in self._members and self._members[name] is not member:
            raise KGCError(f"{self.kind} {name!r} is registered twice ({self._members[name]!r} and {member!r})")
        self._members[name] = member
        return member

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a built-in module that looks itself up while importing does not recurse
            for module in self._builtins:
                importlib.import_module(module)

    def __getitem__(self, name: str) -> T:
        self._load()
        return self._members[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(sorted(self._members))

    def __len__(self) -> int:
        self._load()
        return len(self._members)

    def lookup(self, name: str) -> T:
        """The member called ``name``; an unknown name is a KGCError listing the registered ones."""
        self._load()
        if name not in self._members:
            raise KGCError(f"{self.key} {name!r}: unknown {self.kind}. Available: {', '.join(sorted(self._members))}")
        return self._members[name]

    def where(self, has: Callable[[T], bool]) -> list[str]:
        """Names of the members for which ``has(member)`` is true."""
        return [name for name in self if has(self[name])]


# conditioners: kgc.conditioning.base.Conditioner subclasses (kgc/conditioning/<name>.py)
CONDITIONERS: Registry = Registry("conditioner", "model.conditioner", ("kgc.conditioning",), default="biencoder")
# tasks: kgc.training.task.Task subclasses, one package each (kgc/linkpred, kgc/csts)
TASKS: Registry = Registry("task", "task", ("kgc.linkpred", "kgc.csts"), default="linkpred")
