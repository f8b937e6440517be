"""A package outside kgc that adds a conditioner, an index type and a tracker through kgc's entry points
(``entry_points.txt`` beside it: the ``[project.entry-points."kgc.…"]`` tables of its pyproject.toml). It is
what docs/architecture.md's "Write a plugin" shows; tests/test_plugins.py installs it into a temporary folder and
trains a recipe that names all three."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from kgc.conditioning.base import ConditionerOptions
from kgc.conditioning.pooled import Hadamard


class GatedOptions(ConditionerOptions):
    conditioner: Literal["gated"] = Field("gated", description="gated (a plugin): h_s ⊙ σ(W h_c + b), after pooling")


class Gated(Hadamard):
    """The Hadamard tri-encoder with a sigmoid gate: each dimension of the sentence kept in the share the condition
    gives it. Named by its entry point as the class itself (the registry registers it)."""

    name = "gated"
    Options = GatedOptions

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:
        return "gated (plugin)"

    def export_spec(self) -> dict[str, Any]:
        return self._spec("normalize(h_s * sigmoid(proj.weight @ h_c + proj.bias))")

    def combine(self, sentence_state, condition_state, condition_index):
        gate = torch.sigmoid(self.proj(condition_state))[condition_index]  # (batch, H)
        return F.normalize(sentence_state * gate, dim=-1)
