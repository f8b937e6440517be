"""An index type from a plugin: FAISS's scalar quantizer (every entity scored; 8 bits a dimension, 4× smaller than
float32, or 6 or 4). Its entry point names the instance :data:`SQ8_TYPE`; its option ``bits`` is a recipe key
(``index: {type: sq8, bits: 4}``) and a flag of ``kgc index`` (``--bits 4``), as a built-in type's are."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from kgc.linkpred.index.types import IndexOptions, IndexType


class Sq8Options(IndexOptions):
    type: Literal["sq8"] = Field("sq8", description="sq8 (a plugin): FAISS's 8-bit scalar quantizer, every entity "
                                                    "scored")
    bits: int = Field(8, ge=4, le=8, description="bits a dimension: 8, 6 or 4 (FAISS's SQ8, SQ6, SQ4)")

    @field_validator("bits")
    @classmethod
    def _a_faiss_width(cls, v: int) -> int:
        if v not in (4, 6, 8):
            raise ValueError(f"bits={v}: FAISS's scalar quantizers have 8, 6 or 4 bits")
        return v


class SQ8(IndexType):
    name, gpu, summary = "sq8", False, "8-bit scalar quantizer (FAISS SQ8), every entity scored"
    Options = Sq8Options
    faiss_classes = ("IndexScalarQuantizer",)
    build = ("bits",)

    def factory(self, params: dict) -> str:
        return f"SQ{params.get('bits', 8)}"

    def resolve(self, config: IndexOptions, entities: int, dim: int) -> dict:
        return {"type": self.name, "bits": config.bits, "train_size": entities}  # ranges: from every entity


SQ8_TYPE = SQ8()
