"""The conditioning core: how a condition (a relation, a C-STS condition) shapes a sentence embedding.

Every conditioner is defined by the layer where the condition enters the encoder (``../DESIGN.md``).
The interface splits the work accordingly, so callers cache what does not depend on the pair:

* :meth:`Conditioner.encode_conditions` — once per *distinct* condition (row per condition);
* :meth:`Conditioner.encode_sentences` — once per sentence, up to the layer where the condition
  enters (bi-encoder: t = 0, the state is the token ids; router: the states entering layer T − k;
  tri-encoders and Hyper-CL: the pooled sentence embedding);
* :meth:`Conditioner.combine` — per (sentence, condition) pair: ``sentence_state`` row-aligned with
  the batch, ``condition_state`` per distinct condition, ``condition_index`` (batch,) mapping rows to
  it; returns ``(batch, dim)`` unit vectors.

Inputs are token ids without special tokens (``list[list[int]]``); the conditioner adds the special
tokens its backbone expects via the shared :class:`~kgc.data.texts.SpecialTokens` template.

Each conditioner also describes itself, so no tool outside this package branches on its name:

* :meth:`Conditioner.describe` — a one-line description from the recipe's ``model.*`` options (``kgc compare``);
* :meth:`Conditioner.export_spec` — how an exported query is formed from the exported parts (``kgc export``);
* :attr:`Conditioner.explain_kind` and :meth:`Conditioner.explain` — what ``kgc explain`` can show.

A registry maps names to classes; adding a conditioner means adding one module that calls
:func:`register` and one entry in ``tests/test_conditioners.py`` (a meta-test enforces it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, NamedTuple, Sequence

import torch
from pydantic import model_validator
from torch import nn

from kgc.data.texts import SpecialTokens
from kgc.encoding.backbone import TextEncoder, to_device
from kgc.errors import KGCError
from kgc.recipe import ModelConfig
from kgc.registry import CONDITIONERS

TokenLists = Sequence[Sequence[int]]


class Explained(NamedTuple):
    """What a conditioner shows ``kgc explain``, as numbers; :mod:`kgc.explain` names and renders them."""

    kind: str  # "tokens": a weight per token of one sentence; "spectrum": singular values per condition
    values: torch.Tensor  # router: (conditions, tokens) w, rows sum to 1; hypernet: (conditions, H) σ, descending
    token_ids: tuple[int, ...] = ()  # router: the ids of the tokens w covers, special tokens included
    layers: tuple[int, ...] = ()  # router: the layers w was read in (averaged over them)


class ConditionerOptions(ModelConfig):
    """A conditioner's ``model:`` section: the keys every conditioner reads plus its own, declared by a subclass
    beside the conditioner (``conditioner: Literal["name"]`` and its fields) and named by ``Conditioner.Options``.
    The defaults that depend on other options (:meth:`Conditioner.resolved_options`) are written into the
    section, so a saved run's recipe.yaml names what it trained with whatever later defaults become."""

    @model_validator(mode="after")
    def _resolved(self) -> "ConditionerOptions":
        mine = self.options()
        for key, value in CONDITIONERS[self.conditioner].resolved_options(mine).items():
            if value != mine[key]:
                self.__dict__[key] = value  # not setattr: assignment would validate (and resolve) again
        return self


def register(cls: type["Conditioner"]) -> type["Conditioner"]:
    """Class decorator: add a conditioner to the registry (``kgc.registry.CONDITIONERS``) under its ``name``; its
    ``options`` are its Options' own fields."""
    if cls.Options.model_fields["conditioner"].default != cls.name:
        raise KGCError(f"{cls.__name__}.Options declares conditioner {cls.Options.model_fields['conditioner'].default!r}"
                       f", not {cls.name!r}")
    cls.options = tuple(k for k in cls.Options.model_fields if k not in ModelConfig.model_fields)
    return CONDITIONERS.register(cls)


CONDITIONERS.admit = register  # a plugin's class, named by its entry point, registers as a built-in does


class Conditioner(nn.Module, ABC):
    """Base class. Subclasses set ``name``, ``enters_at`` and ``Options`` and implement the three stages."""

    name: ClassVar[str]
    enters_at: ClassVar[Literal["input", "layer", "pooled"]]
    Options: ClassVar[type[ConditionerOptions]]  # its ``model:`` section (the recipe keys it reads)
    options: ClassVar[tuple[str, ...]] = ()  # its own fields of Options (set by :func:`register`)
    encodes_conditions: ClassVar[bool] = True  # False where a condition's state is just its token ids
    # what ``kgc explain`` shows for this class (None: nothing), listed when another conditioner refuses
    explains: ClassVar[str | None] = None
    # what kgc tune searches for it besides the task's space (a recipe's empty tune.space): the lr of the parameters
    # it adds (generators, routers, projections); a conditioner that adds none sets {}
    tune_space: ClassVar[dict[str, dict]] = {"train.conditioner_lr": {"low": 1e-5, "high": 1e-2, "log": True}}

    def __init__(self, *, encoder: TextEncoder, special: SpecialTokens, max_tokens: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.special = special
        self.max_tokens = max_tokens

    @property
    def entry_layer(self) -> int:
        """The layer t where the condition first touches the sentence (0 = input, T = after pooling)."""
        return {"input": 0, "pooled": self.encoder.num_layers}[self.enters_at]

    @property
    def plain_below(self) -> int:
        """Layers below this run unchanged, once per input text, so a layer cache may serve them: the entry
        layer for layer-level conditioners, every layer for the others (CSR inside the bi-encoder lowers it)."""
        return self.entry_layer if self.enters_at == "layer" else self.encoder.num_layers

    @property
    def out_dim(self) -> int:
        """Width of the embeddings :meth:`combine` returns."""
        return self.encoder.dim

    @classmethod
    def resolved_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` (this conditioner's ``model.*`` values) with the defaults that depend on other options filled
        in where they are None; the recipe writes the result, so a saved run names what it trained with."""
        return dict(options)

    # describing itself: compare, export and explain ask these instead of branching on ``name``
    @classmethod
    @abstractmethod
    def describe(cls, options: dict[str, Any]) -> str:
        """One line for tables (``kgc compare``) from the recipe's values of :attr:`options` (a missing key
        means the default), e.g. ``"router (k=1, query_key, one_plus_w)"``."""

    @classmethod
    def plain_layers(cls, options: dict[str, Any], layers: int) -> int:
        """Of an encoder of ``layers`` layers, how many run below the condition's entry, the same for every
        condition (what a layer cache can hold), from the recipe's values of :attr:`options`: every layer for a
        condition that enters with the input or after pooling, all but the top one for one that enters at a layer;
        a conditioner whose option moves the entry says so."""
        return layers - (1 if cls.enters_at == "layer" else 0)

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters ``train.conditioner_lr`` applies to: the conditioner's own, not its encoder's."""
        return [p for n, p in self.named_parameters() if not n.startswith("encoder.")]

    @abstractmethod
    def export_spec(self) -> dict[str, Any]:
        """How a query is formed from the exported towers (``kgc.json``'s ``conditioner`` part, less ``name`` and
        ``enters_at``): ``reproducible_outside_kgc`` (bool), ``query`` (the formula, or why kgc is needed), optional
        ``input`` / ``note`` / ``h_s`` / ``h_c``, and ``options``: every name in :attr:`options` with the value this
        instance uses (a default the recipe left unset resolved). Abstract so that a new conditioner cannot
        export silently without saying how."""

    @property
    def explain_kind(self) -> str | None:
        """What :meth:`explain` returns here: ``"tokens"`` (a weight per token of a sentence under each condition,
        needs a sentence: CSR's routing), ``"spectrum"`` (each condition's singular values: Hyper-CL's W_c) or None
        (nothing to show)."""
        return None

    def explain(self, conditions: TokenLists, sentence: Sequence[int] | None = None) -> Explained:
        """What the ``conditions`` select (of ``sentence``'s tokens, for the router kind); the default refuses."""
        raise self.not_explainable()

    def not_explainable(self, what: str | None = None) -> KGCError:
        """The error for a conditioner :meth:`explain` has nothing to show for: what it is (``what``, default its
        name) and which conditioners can be explained."""
        shown = [cls.explains for cls in CONDITIONERS.values() if cls.explains] or ["nothing yet"]
        listed = " and ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
        return KGCError(f"kgc explain shows {listed}; this run's conditioner is {what or self.name}")

    @abstractmethod
    def encode_conditions(self, conditions: TokenLists) -> Any:
        """Per-condition state, one row per condition."""

    @abstractmethod
    def encode_sentences(self, sentences: TokenLists) -> Any:
        """Per-sentence state up to the layer where the condition enters, one row per sentence."""

    @abstractmethod
    def combine(self, sentence_state: Any, condition_state: Any, condition_index: torch.Tensor) -> torch.Tensor:
        """Row i embeds sentence i under condition ``condition_index[i]``: ``(batch, dim)``, L2-normalised."""

    def forward(self, sentences: TokenLists, conditions: TokenLists) -> torch.Tensor:
        """Each distinct condition is encoded once, then gathered."""
        keys = [tuple(c) for c in conditions]
        distinct = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(distinct)}
        index = torch.tensor([where[k] for k in keys], device=self.device)
        return self.combine(self.encode_sentences(sentences), self.encode_conditions([list(k) for k in distinct]),
                            index)

    def prepare(self, sentences: TokenLists, conditions: TokenLists) -> Any:
        """What :meth:`forward_prepared` needs, built on the host ahead of a training step (the prefetch thread,
        :mod:`kgc.training.prefetch`): nothing here may wait for the device. ``sentences`` and ``conditions`` are
        row-aligned token ids (:class:`~kgc.data.ragged.Ragged` or lists). Default: the rows as Python lists, for
        :meth:`forward`; a conditioner that can build its device inputs here (the bi-encoder's padded pairs)
        overrides both."""
        return [list(t) for t in sentences], [list(t) for t in conditions]

    def forward_prepared(self, prepared: Any) -> torch.Tensor:
        """``forward`` of what :meth:`prepare` built: (batch, dim), L2-normalised."""
        return self(*prepared)

    # state tables for evaluation (conditioners entering after the input): the states of every entity,
    # concatenated from chunks, then gathered per query chunk. Override for states that are not one tensor.
    def take(self, state: Any, index: torch.Tensor) -> Any:
        return state[index.to(state.device)]

    def cat_states(self, states: list[Any]) -> Any:
        return torch.cat(states)

    # helpers
    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def padded(self, texts: TokenLists) -> dict[str, torch.Tensor]:
        """The texts wrapped in the special tokens and padded: a batch on the CPU."""
        return self.special.pad([self.special.wrap(t, self.max_tokens) for t in texts])

    def single_batch(self, texts: TokenLists) -> dict[str, torch.Tensor]:
        """:meth:`padded` on the encoder's device."""
        return to_device(self.padded(texts), self.device)


def conditioner_class(name: str) -> type[Conditioner]:
    """The registered conditioner class ``name`` (an unknown name lists the registered ones)."""
    return CONDITIONERS.lookup(name)


def build_conditioner(name: str, **kwargs: Any) -> Conditioner:
    return conditioner_class(name)(**kwargs)
