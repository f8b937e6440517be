"""The options every structural side shares: how its score is fused with the text's (α chosen on dev).

The members (``structure.model``: a PyKEEN model, :class:`kgc.linkpred.structure.pykeen.PykeenOptions`; or mined rules,
:class:`kgc.linkpred.structure.rules.RulesOptions`) subclass this; ``kgc.linkpred.recipe`` joins them into one union."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kgc.recipe import Section


class FusionOptions(Section):
    """A structural model beside the text model: evaluation and ``kgc predict`` fuse α·z(text cosine) +
    (1 − α)·z(structural score), α chosen on dev."""
    model: str = Field("RotatE", description="a PyKEEN model name (RotatE, TransE, ComplEx, DistMult, ...), or "
                                             "rules: closed path rules counted from the train graph (AnyBURL's "
                                             "form; kgc.linkpred.structure.rules), no training")
    alphas: list[float] = Field(default_factory=lambda: [round(0.1 * i, 1) for i in range(11)],
                                description="the α grid tried on dev (1: text only, 0: structure only)")
    alpha_per: Literal["all", "relation"] = Field(
        "all", description="one α for every query (all), or one per query relation chosen on dev (relation: "
                           "relations with fewer dev queries than alpha_min_queries keep the one α)")
    alpha_min_queries: int = Field(50, ge=1, description="alpha_per relation: dev queries a relation needs for "
                                                         "an α of its own")

    @property
    def is_rules(self) -> bool:
        """The structural side is mined rules, not a PyKEEN model."""
        return False

    @model_validator(mode="after")
    def _alphas_are_weights(self) -> "FusionOptions":
        if not self.alphas or any(not 0 <= a <= 1 for a in self.alphas):
            raise ValueError(f"structure.alphas={self.alphas}: give weights in [0, 1]")
        return self
