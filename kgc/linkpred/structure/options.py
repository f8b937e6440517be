"""The structural side's options: what every member shares (how its score is fused with the text's, α chosen on
dev) and each member's own — a PyKEEN model (:class:`PykeenOptions`, trained by :mod:`kgc.linkpred.structure.pykeen`)
or mined rules (:class:`RulesOptions`, :mod:`kgc.linkpred.structure.rules`); ``kgc.linkpred.recipe`` joins them into one
union. Options only (pydantic, no torch): reading a recipe imports nothing heavier."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

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


class PykeenOptions(FusionOptions):
    """``structure.model``: a PyKEEN model trained beside the text model on the same train triples (its own
    pipeline: ``pipeline_kwargs``); checked against PyKEEN's resolvers when a recipe is made."""
    dim: int = Field(200, ge=1, description="embedding_dim")
    epochs: int = Field(100, ge=1, description="the structural model's training epochs")
    batch_size: int = Field(256, ge=1, description="its training batch")
    lr: float = Field(1e-3, gt=0, description="Adam's learning rate")
    loss: Optional[str] = Field(None, description="a PyKEEN loss name (e.g. NSSALoss); default: the model's own")
    loss_kwargs: dict[str, Any] = Field(default_factory=dict, description="e.g. {margin: 9, adversarial_temperature: 1}")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="further model options besides dim")
    training_loop: Literal["lcwa", "slcwa"] = Field(
        "lcwa", description="lcwa: every (h, r) scored against all entities (fast on small graphs); slcwa: "
                            "sampled negatives (structure.negatives)")
    negatives: int = Field(32, ge=1, description="slcwa: negatives per positive (basic sampler)")
    seed: Optional[int] = Field(None, description="default: train.seed")
    device: Optional[str] = Field(None, description="default: train.device")

    @classmethod
    def selected_by(cls, tree: dict) -> bool:
        return str(tree.get("model", "RotatE")).lower() != "rules"

    @model_validator(mode="after")
    def _known_to_pykeen(self, info: ValidationInfo) -> "PykeenOptions":
        if (info.context or {}).get("saved"):  # a run's own recipe: checked when it was made (and pykeen is slow to
            return self                          # import; `kgc predict` on a fused run does not need it)
        from pykeen.losses import loss_resolver
        from pykeen.models import model_resolver

        for kind, resolver, name in (("model", model_resolver, self.model), ("loss", loss_resolver, self.loss)):
            if name is None:
                continue
            try:
                resolver.lookup(name)
            except (KeyError, ValueError):
                raise ValueError(f"structure.{kind}={name!r} is not a PyKEEN {kind}. Choose one of: "
                                 f"{', '.join(sorted(c.__name__ for c in resolver))}"
                                 + (" (or rules: mined from the train graph)" if kind == "model" else "")) from None
        return self


class RulesOptions(FusionOptions):
    """``structure.model: rules``: closed path rules counted from the train graph (no training), fused as any
    structural model is."""
    model: Literal["rules"] = Field("rules", description="rules: closed path rules counted from the train graph "
                                                         "(AnyBURL's form), no training")
    rule_length: int = Field(2, ge=1, le=3, description="the longest rule body (1: r(x,y) ⇐ b(x,y); 2: also "
                                                        "r(x,y) ⇐ b1(x,z) ∧ b2(z,y); 3: also "
                                                        "r(x,y) ⇐ b1(x,z1) ∧ b2(z1,z2) ∧ b3(z2,y))")
    rule_min_support: int = Field(2, ge=1, description="a rule is kept when its body and head hold together on at "
                                                       "least this many train pairs")
    rule_unseen: float = Field(5.0, ge=0, description="confidence = support / (body pairs + this) (AnyBURL's "
                                                      "constant)")
    rule_min_confidence: float = Field(0.01, ge=0, le=1, description="rules below it are dropped")
    rule_max_per_relation: Optional[int] = Field(50, ge=1, description="the most confident rules kept per relation "
                                                                       "(unset: all)")
    rule_aggregation: Literal["noisy_or", "max"] = Field(
        "noisy_or", description="an entity's score from the rules that reach it: 1 − Π(1 − conf) (noisy_or) or the "
                                "highest conf (max)")

    @classmethod
    def selected_by(cls, tree: dict) -> bool:
        return str(tree.get("model", "")).lower() == "rules"

    @field_validator("model", mode="before")
    @classmethod
    def _any_case(cls, value):
        return value.lower() if isinstance(value, str) else value

    @property
    def is_rules(self) -> bool:
        return True
