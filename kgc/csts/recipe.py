"""C-STS's part of a recipe: the generated set's options and Hyper-CL's objective (MSE + a contrastive term).

The task registers :class:`CSTSRecipe` (``CSTSTask.recipe_class``). It adds no keys to ``model:`` (link
prediction's ``shared_towers`` and ``tail_map_rank`` are link prediction's own: a C-STS recipe that sets them is
refused, naming the task that reads them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kgc.recipe import DataConfig, Recipe, Section


class SynthConfig(Section):
    """The generated conditional-similarity set (``data.dataset: synth-csts``); deterministic from the seed."""
    seed: int = Field(0, description="synth-csts: the generator's seed")
    train_pairs: int = Field(2000, ge=1, description="sentence pairs in csts_train.csv (two rows each)")
    validation_pairs: int = Field(300, ge=1, description="sentence pairs in csts_validation.csv")
    test_pairs: int = Field(500, ge=1, description="sentence pairs in csts_test.csv")


class CSTSData(DataConfig):
    synth: SynthConfig = SynthConfig()


class CSTSLoss(Section):
    """Hyper-CL's objective (kgc/csts/loss.py)."""
    mse_weight: float = Field(1.0, ge=0, description="weight of MSE(cos, (label - 1) / 4)")
    contrastive: bool = Field(True, description="Hyper-CL's c_high vs c_low term per sentence pair")
    contrastive_weight: float = Field(1.0, ge=0, description="weight of the contrastive term")
    contrastive_temperature: float = Field(1.9, gt=0, description="τ of the contrastive term (Hyper-CL: 1.5-1.9)")


class CSTSRecipe(Recipe):
    """A conditional-STS recipe (``task: csts``)."""
    task: Literal["csts"] = Field("csts", description="a registered task: linkpred (link prediction) or csts "
                                                      "(conditional STS)")
    data: CSTSData = CSTSData()
    loss: CSTSLoss = CSTSLoss()
