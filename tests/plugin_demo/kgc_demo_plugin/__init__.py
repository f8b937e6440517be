"""A package outside kgc that adds a conditioner, an index type and a tracker through kgc's entry points
(the ``[project.entry-points."kgc.…"]`` tables of its pyproject.toml, beside this folder). It is
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
    conditioner: Literal["gated"] = Field("gated", description="gated (a plugin): h_s ⊙ σ(s·(W h_c + b)), after pooling")
    gate_scale: float = Field(1.0, gt=0, description="gated: s, the gate's logits scaled by this")


class Gated(Hadamard):
    """The Hadamard tri-encoder with a sigmoid gate: each dimension of the sentence kept in the share the condition
    gives it. Named by its entry point as the class itself (the registry registers it)."""

    name = "gated"
    Options = GatedOptions

    def __init__(self, *, gate_scale: float = 1.0, **kwargs) -> None:  # the options arrive as keywords
        super().__init__(**kwargs)
        self.gate_scale = gate_scale

    @classmethod
    def describe(cls, options: dict[str, Any]) -> str:  # the recipe's values of cls.options (kgc compare)
        return f"gated (plugin, scale={options.get('gate_scale', 1.0):g})"

    def export_spec(self) -> dict[str, Any]:
        return self._spec(f"normalize(h_s * sigmoid({self.gate_scale:g} * (proj.weight @ h_c + proj.bias)))",
                          gate_scale=self.gate_scale)  # every option it declares, with the value in use

    def combine(self, sentence_state, condition_state, condition_index):
        gate = torch.sigmoid(self.gate_scale * self.proj(condition_state))[condition_index]  # (batch, H)
        return F.normalize(sentence_state * gate, dim=-1)
