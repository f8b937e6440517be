"""How a link-prediction question is answered — ``top_k``, ``inverse``, ``filter_known``, ``include_head``,
``free_text`` — stated once, here: defaults, descriptions and validation.

Every way of asking takes them from :class:`QueryOptions`: ``run.predict(head, relation, **options)`` (and
``answer`` / ``resolve``), the JSONL lines of ``kgc predict --input`` and its defaults, ``POST /predict`` (its request
model extends this one) and ``kgc predict``'s options (their defaults and help are these fields'). A bad value is
the same sentence everywhere: a KGCError from Python and the CLI, in the 422 of the server.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kgc.errors import validated


class QueryOptions(BaseModel):
    """The options of one question (head, relation, ?)."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(10, json_schema_extra={"minimum": 1}, description="how many answers, best first")
    inverse: bool = Field(False, description="ask (?, relation, head) instead")
    filter_known: bool = Field(False, description="drop answers already in the graph")
    include_head: bool = Field(False, description="keep the head itself among the answers (left out by default, "
                                                  "unless the graph has it as an answer: a self-loop is shown, "
                                                  "marked known)")
    free_text: bool = Field(False, description="embed a head that names no entity as text even when it is spelt "
                                               "like one (else: did you mean)")

    @field_validator("top_k")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"top_k={v!r}: ask for at least 1 answer")
        return v

    @classmethod
    def of(cls, options: "Mapping[str, Any] | QueryOptions | None" = None, /, **more: Any) -> "QueryOptions":
        """Options from Python values — keyword arguments, a mapping (a query file's line), or options to change —
        checked strictly (``top_k`` an int, the others bools); a bad or unknown one is one KGCError."""
        base = options.model_dump() if isinstance(options, QueryOptions) else dict(options or {})
        return validated(cls, {**base, **more}, strict=True, what="a query")
