"""The conditioning core: how a condition (a relation, a C-STS condition) shapes a sentence embedding.

Every conditioner is defined by where the condition enters the encoder (``../DESIGN.md``). The
interface splits the work accordingly, so callers can cache what does not depend on the pair:

* :meth:`Conditioner.encode_conditions` — once per distinct condition;
* :meth:`Conditioner.encode_sentences` — once per distinct sentence, up to the layer where the
  condition enters (for the bi-encoder, t = 0: nothing is computed, the state is the token ids);
* :meth:`Conditioner.combine` — per (sentence, condition) pair; returns ``(batch, dim)`` unit vectors.

Inputs are token ids without special tokens (``list[list[int]]``); the conditioner adds the special
tokens its backbone expects via the shared :class:`~kgc.data.texts.SpecialTokens` template.

A registry maps names to classes; adding a conditioner means adding one module that calls
:func:`register` and one test case.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, Sequence

import torch
from torch import nn

from kgc.data.texts import SpecialTokens
from kgc.encoding.backbone import TextEncoder
from kgc.errors import KGCError

TokenLists = Sequence[Sequence[int]]

CONDITIONERS: dict[str, type["Conditioner"]] = {}


def register(cls: type["Conditioner"]) -> type["Conditioner"]:
    CONDITIONERS[cls.name] = cls
    return cls


class Conditioner(nn.Module, ABC):
    """Base class. Subclasses set ``name`` and ``enters_at`` and implement the three stages."""

    name: ClassVar[str]
    enters_at: ClassVar[Literal["input", "layer", "pooled"]]

    def __init__(self, *, encoder: TextEncoder, special: SpecialTokens, max_tokens: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.special = special
        self.max_tokens = max_tokens

    @abstractmethod
    def encode_conditions(self, conditions: TokenLists) -> Any:
        """Per-condition state (computed once per distinct condition)."""

    @abstractmethod
    def encode_sentences(self, sentences: TokenLists) -> Any:
        """Per-sentence state up to the layer where the condition enters."""

    @abstractmethod
    def combine(self, sentence_state: Any, condition_state: Any) -> torch.Tensor:
        """Row i of the output embeds sentence i under condition i: ``(batch, dim)``, L2-normalised."""

    def forward(self, sentences: TokenLists, conditions: TokenLists) -> torch.Tensor:
        return self.combine(self.encode_sentences(sentences), self.encode_conditions(conditions))

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device


def build_conditioner(name: str, **kwargs: Any) -> Conditioner:
    import kgc.conditioning  # noqa: F401  (registers the built-in conditioners)

    if name not in CONDITIONERS:
        raise KGCError(f"model.conditioner {name!r}: unknown. Available: {', '.join(sorted(CONDITIONERS))}")
    return CONDITIONERS[name](**kwargs)
