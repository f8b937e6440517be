"""An index type from a plugin: FAISS's 8-bit scalar quantizer (every entity scored, 4× smaller than float32).
Its entry point names the instance :data:`SQ8_TYPE`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kgc.linkpred.index.types import IndexOptions, IndexType


class Sq8Options(IndexOptions):
    type: Literal["sq8"] = Field("sq8", description="sq8 (a plugin): FAISS's 8-bit scalar quantizer, every entity "
                                                    "scored")


class SQ8(IndexType):
    name, gpu, summary = "sq8", False, "8-bit scalar quantizer (FAISS SQ8), every entity scored"
    Options = Sq8Options
    faiss_classes = ("IndexScalarQuantizer",)

    def factory(self, params: dict) -> str:
        return "SQ8"

    def resolve(self, config: IndexOptions, entities: int, dim: int) -> dict:
        return {"type": self.name, "train_size": entities}  # the quantizer's ranges: from every entity


SQ8_TYPE = SQ8()
