"""The kinds of structural model a recipe's ``structure:`` names, each a member of :data:`kgc.registry.STRUCTURES`:
a PyKEEN model (``structure.model: RotatE``, any model PyKEEN's resolver knows: the default kind) or mined rules
(``structure.model: rules``); another package adds one through the ``kgc.structures`` entry point group.

A kind gives its options (``Options``, a :class:`~kgc.linkpred.structure.options.FusionOptions` subclass: the
recipe's ``structure:`` union is built from them), which ``structure.model`` values name it (:meth:`selects`), how
to train it into a run's ``structure/`` folder (:meth:`train`, returning the ``meta.json`` it wrote, whose
``model`` names the kind again) and how to load it (:meth:`load`: a :class:`~kgc.linkpred.structure.pykeen.Structure`,
whose ``scores(heads, relations)`` are fused with the text's). Importing this module imports no torch: the recipe
reads the options of every kind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kgc.errors import KGCError
from kgc.linkpred.structure.options import FusionOptions, PykeenOptions, RulesOptions
from kgc.registry import STRUCTURES

if TYPE_CHECKING:
    from kgc.data.graph import KnowledgeGraph
    from kgc.linkpred.structure.pykeen import Structure


class StructureKind:
    """One kind of structural model (subclass it, set ``name`` and ``Options``, register an instance)."""

    name: str
    Options: type[FusionOptions]

    def selects(self, model: str) -> bool:
        """Whether ``structure.model: MODEL`` (or a saved ``meta.json``'s ``model``) is this kind's."""
        return str(model).lower() == self.name

    def train(self, config: FusionOptions, graph: "KnowledgeGraph", folder: Path, *, seed: int, device: str,
              progress: bool, echo) -> dict[str, Any]:
        """Fit ``config`` on ``graph``'s train triples into ``folder``, a new empty folder that becomes the run's
        ``structure/`` when this returns (every file through :mod:`kgc.fileio`; a ``meta.json`` with ``model``,
        ``entities``, ``relations`` and ``params``); return that meta."""
        raise NotImplementedError

    def load(self, folder: Path, meta: dict, device: Any, fix: str) -> "Structure":
        """The trained model in ``folder`` (``meta``: its meta.json); an unreadable file is one KGCError ending
        in ``fix``."""
        raise NotImplementedError


class PykeenKind(StructureKind):
    """A PyKEEN model trained by its own pipeline beside the text model (the default kind: any ``structure.model``
    no other kind selects)."""

    name = "pykeen"
    Options = PykeenOptions

    def selects(self, model: str) -> bool:
        return kind_named(model) is self

    def train(self, config, graph, folder, *, seed, device, progress, echo):
        from kgc.linkpred.structure.pykeen import train_pykeen

        return train_pykeen(config, graph, folder, seed=seed, device=device, progress=progress, echo=echo)

    def load(self, folder, meta, device, fix):
        from kgc.linkpred.structure.pykeen import load_pykeen

        return load_pykeen(folder, meta, device, fix)


class RulesKind(StructureKind):
    """Closed path rules counted from the train graph (AnyBURL's form), no training."""

    name = "rules"
    Options = RulesOptions

    def train(self, config, graph, folder, *, seed, device, progress, echo):
        from kgc.linkpred.structure.pykeen import train_rules

        return train_rules(config, graph, folder, echo=echo)

    def load(self, folder, meta, device, fix):
        from kgc.linkpred.structure.pykeen import RuleStructure
        from kgc.linkpred.structure.rules import RuleModel

        return RuleStructure(model=RuleModel.load(folder, meta, fix), meta=meta)


STRUCTURES.register(PykeenKind())
STRUCTURES.register(RulesKind())


def kind_named(model: str) -> StructureKind:
    """The kind ``structure.model: MODEL`` (or a meta.json's ``model``) names: the first other kind that selects it,
    else the default (a PyKEEN model)."""
    found = [STRUCTURES[k] for k in STRUCTURES if k != STRUCTURES.default and STRUCTURES[k].selects(model)]
    return found[0] if found else STRUCTURES[STRUCTURES.default]


def kind_of(config: FusionOptions) -> StructureKind:
    """The kind whose options ``config`` is (the most derived match)."""
    matches = [STRUCTURES[k] for k in STRUCTURES if isinstance(config, STRUCTURES[k].Options)]
    if not matches:
        return kind_named(config.model)
    return max(matches, key=lambda kind: len(type(config).__mro__) - type(config).__mro__.index(kind.Options))


def structure_tag(value: Any) -> str:
    """The discriminator of the recipe's ``structure:`` union: the name of the kind its ``model`` selects."""
    model = value.get("model", "RotatE") if isinstance(value, dict) else getattr(value, "model", "RotatE")
    return kind_named(str(model)).name


structure_tag.key = "model"  # type: ignore[attr-defined]  # the key it reads (kgc.recipe's key reference)


def structure_union() -> Any:
    """The recipe's ``structure:`` section: one member per registered kind (its ``Options``), chosen by ``model``."""
    from typing import Annotated, Union

    from pydantic import Discriminator, Tag

    members = tuple(Annotated[STRUCTURES[k].Options, Tag(k)] for k in STRUCTURES)
    return Annotated[Union[members], Discriminator(structure_tag)]  # type: ignore[valid-type]


def train_structure(config: FusionOptions, graph: "KnowledgeGraph", folder: str | Path, *, seed: int = 0,
                    device: str = "auto", progress: bool = False, echo=print) -> dict:
    """Train the structural model ``config`` describes — its kind's (:mod:`kgc.linkpred.structure.kinds`: a PyKEEN
    model, mined rules, or a plugin's) — on ``graph``'s train triples into ``folder`` (the run's ``structure/``);
    return the ``meta.json`` it wrote. The kind writes into a new, empty folder that replaces ``folder`` whole once
    it is done (:func:`kgc.fileio.atomic_dir`): nothing of the previous model (another kind's files, its chosen α)
    is left beside the new one, and a training that fails leaves the previous model as it was."""
    from kgc.fileio import atomic_dir

    folder = Path(folder)  # the run's structure/ folder (RunDir.structure)
    with atomic_dir(folder, replace=True) as fresh:
        meta = kind_of(config).train(config, graph, fresh, seed=seed, device=device, progress=progress, echo=echo)
    echo(f"structural model saved in {folder}")
    return meta


def load_structure(folder: Path, device: Any = "cpu") -> "Structure":
    """The structural model in a run's ``structure/`` folder; a missing or unreadable file is one KGCError."""
    from kgc.linkpred.structure.pykeen import has_structure
    from kgc.training.run import read_json

    folder = Path(folder)
    run = folder.parent
    if not has_structure(folder):
        raise KGCError(f"{run} has no structural model; train one with `kgc structure {run}`")
    fix = f"Retrain the structural model with `kgc structure {run}`."
    meta = read_json(folder / "meta.json", fix)
    if not isinstance(meta, dict) or any(k not in meta for k in ("model", "entities", "relations", "params")):
        raise KGCError(f"{folder / 'meta.json'}: not the description kgc writes of a structural model. {fix}")
    return kind_named(str(meta["model"])).load(folder, meta, device, fix)
