"""Registries: name → member, one per pluggable family — tasks, conditioners, index types, structural models,
trackers, datasets, graph formats — kept in the bottom layer: the one resolver every family is looked up through.

A registry sits below everything that registers into it, so a lower layer can look a member up without
importing the layer that defines it: the recipe builds its unions (``model`` on ``conditioner``, a task's own,
such as link prediction's ``index`` on ``type``) and checks ``train.trackers`` here, the data catalog asks a task to
check a fetched folder. Members register themselves when their module is imported (``@CONDITIONERS.register``);
on the first lookup a registry imports its built-in modules, named here as ``lazy(...)`` references — the one
place that lists them; the layer contract in pyproject.toml sees each as an edge from here and allows exactly
these (a resolver loads its members, as entry points load plugins) — and then every entry point of
its group (``kgc.conditioners``, ``kgc.index_types``, ``kgc.structures``, ``kgc.trackers``, ``kgc.tasks``,
``kgc.datasets``, ``kgc.graph_formats``): another package adds a
member by naming, in its own ``pyproject.toml``, a module that registers it or the member itself::

    [project.entry-points."kgc.conditioners"]
    scaled = "my_package.conditioners"        # a module whose import registers it
    [project.entry-points."kgc.trackers"]
    jsonl = "my_package.trackers:JsonlTracker"   # or the member (a class with a ``name``)

(docs/architecture.md, "Write a plugin").
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Callable, Generic, TypeVar

from kgc.errors import KGCError
from kgc.lazy import Lazy, lazy  # re-exported: kgc's modules take references by name from the resolver

T = TypeVar("T")


class Registry(Mapping, Generic[T]):
    """A read-only mapping name → member that loads its built-in members on first use.

    ``registry[name]`` raises ``KeyError`` like a dict; :meth:`lookup` raises a :class:`KGCError` that names
    the recipe key and lists what is registered."""

    def __init__(self, kind: str, key: str, builtins: tuple[str, ...], default: str | None = None,
                 group: str | None = None) -> None:
        self.kind, self.key, self._builtins, self.group = kind, key, builtins, group
        self.default = default  # the member a recipe gets when it names none (the plugin list's one choice)
        self._members: dict[str, T] = {}
        self._loaded = False
        self.failures: list[KGCError] = []  # plugins that failed to load: said on every use but lenient()
        # the family's own registration, which a member named by its entry point goes through as a built-in does
        # (a conditioner's: its Options' name checked, its options recorded); set by the family's base module
        self.admit: Callable[[T], T] | None = None
        self.sources: dict[str, tuple[str, str]] = {}  # a plugin member's name → (its package, the version)

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
                Lazy(module).load()
            for point in plugins(self.group):
                try:
                    self._plugin(point)
                except KGCError as exc:  # the others still load; the failure is said on every use
                    self.failures.append(exc)
        if self.failures:
            raise self.failures[0]

    def lenient(self) -> dict[str, T]:
        """The members that loaded, without raising for a plugin that failed (``kgc --help`` lists the commands of
        every task it can; a command that uses the family says the failure)."""
        try:
            self._load()
        except KGCError:
            pass
        return dict(sorted(self._members.items()))

    def _plugin(self, point) -> None:
        """Load one entry point of this family: a module registers its members as it is imported; a member (a
        class or an instance with a ``name``) is registered here — through the family's own registration
        (:attr:`admit`) where it has one, as a built-in is —, under the entry point's name when it has none. A
        plugin that fails to load or to register is one KGCError naming the package and the entry point. Each
        member it adds is recorded with its package and version (:attr:`sources`, ``kgc plugins``)."""
        dist = getattr(point, "dist", None)
        package, version = getattr(dist, "name", None) or "?", getattr(dist, "version", None) or "?"
        before = set(self._members)
        try:
            loaded = point.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001  (any error of another package's import; an exit too)
            raise KGCError(f"the {self.kind} plugin {point.name!r} ({point.value}, from the package {package}, entry "
                           f"point group {self.group}) failed to load: {type(exc).__name__}: {exc}. Fix or uninstall "
                           "that package") from exc
        if not isinstance(loaded, types.ModuleType) and loaded not in self._members.values():
            try:
                if self.admit is not None:
                    if not getattr(loaded, "name", None):
                        raise KGCError(f"{loaded!r} has no name (a {self.kind} class sets `name`)")
                    self.admit(loaded)
                else:
                    self.register(loaded, getattr(loaded, "name", None) or point.name)
            except KGCError as exc:
                raise KGCError(f"the {self.kind} plugin {point.name!r} ({point.value}, from the package {package} "
                               f"{version}) cannot be registered: {exc}. Fix that package, or uninstall it") from None
        for name in set(self._members) - before:
            self.sources[name] = (package, version)

    def source(self, name: str) -> str:
        """Where member ``name`` comes from: ``package version`` for a plugin's, ``kgc`` for a built-in."""
        self._load()
        return " ".join(self.sources[name]) if name in self.sources else "kgc"

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


def plugins(group: str | None) -> list:
    """The entry points of ``group`` in the installed distributions (and any ``*.dist-info`` on ``sys.path``), by
    name; none for None."""
    if group is None:
        return []
    from importlib.metadata import entry_points

    return sorted(entry_points(group=group), key=lambda point: point.name)


# conditioners: kgc.conditioning.base.Conditioner subclasses (kgc/conditioning/<name>.py)
CONDITIONERS: Registry = Registry("conditioner", "model.conditioner", (lazy("kgc.conditioning"),), default="biencoder",
                                  group="kgc.conditioners")
# tasks: kgc.training.task.Task subclasses, one package each (kgc/linkpred, kgc/csts)
TASKS: Registry = Registry("task", "task", (lazy("kgc.linkpred"), lazy("kgc.csts")), default="linkpred", group="kgc.tasks")
# index types: kgc.linkpred.index.types.IndexType instances (flat, ivf, hnsw, ivfpq, sq), each with its Options
INDEX_TYPES: Registry = Registry("index type", "index.type", (lazy("kgc.linkpred.index.types"),), default="flat",
                                 group="kgc.index_types")
# trackers: kgc.training.trackers.Tracker subclasses (tensorboard, mlflow, csv, wandb)
TRACKERS: Registry = Registry("tracker", "train.trackers", (lazy("kgc.training.trackers"),), group="kgc.trackers")
# datasets another package adds to the catalog: kgc.data.catalog.CatalogEntry instances (the built-in entries are
# kgc.data.catalog.CATALOG, a task's own its Task.datasets(); all three are what `kgc data list` and fetch read)
DATASETS: Registry = Registry("dataset", "data.dataset", (), group="kgc.datasets")
# structural models beside the text model: kgc.linkpred.structure.kinds.StructureKind instances (pykeen, rules)
# graph formats: kgc.data.formats.base.GraphFormat instances (kgbert, label_tsv), each reading one folder layout
GRAPH_FORMATS: Registry = Registry("graph format", "data.format", (lazy("kgc.data.formats"),),
                                   group="kgc.graph_formats")
STRUCTURES: Registry = Registry("structural model", "structure.model", (lazy("kgc.linkpred.structure.kinds"),),
                                default="pykeen", group="kgc.structures")
