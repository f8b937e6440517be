"""``kgc serve`` for a C-STS run: ``POST /similarity`` (one pair or a list, dynamically batched) and the page at
``/``. Scores are :meth:`CSTSRun.score`'s — the same as ``kgc similarity``."""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, List, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kgc.training.routes import BatcherFactory, Serving

if TYPE_CHECKING:
    from fastapi import APIRouter

MAX_PAIRS = 1024  # per request
MAX_TEXT = 10_000  # characters of a sentence or condition


class Pair(BaseModel):
    """Two sentences and the condition under which their similarity is asked."""
    model_config = ConfigDict(extra="forbid")
    sentence1: str = Field(..., min_length=1, max_length=MAX_TEXT)
    sentence2: str = Field(..., min_length=1, max_length=MAX_TEXT)
    condition: str = Field(..., min_length=1, max_length=MAX_TEXT)

    @field_validator("sentence1", "sentence2", "condition")
    @classmethod
    def not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class CSTSServing(Serving):
    def load(self) -> None:
        with self.lock:
            self.run.model()

    def info(self) -> dict[str, Any]:
        model, _ = self.run.model()
        return {"explainable": model.conditioner.explain_kind is not None,
                "precision": model.precision_choice.record()}

    def sample_requests(self, n: int, seed: int = 0) -> list[tuple[str, Any]]:
        """Test pairs, shuffled: ``POST /similarity``."""
        import numpy as np

        data = self.run.data()
        split = next(data.splits[s] for s in ("test", "validation", "train") if s in data.splits
                     and len(data.splits[s]))
        order = np.random.default_rng(seed).permutation(len(split))
        return [("/similarity", {"sentence1": data.sentences[int(split.s1[i])],
                                 "sentence2": data.sentences[int(split.s2[i])],
                                 "condition": data.conditions[int(split.cond[i])]})
                for i in (int(order[j % len(order)]) for j in range(n))]

    def _score(self, rows: list[dict]) -> list:
        """One batch in one pass; a batch that fails is scored row by row, so one bad row cannot fail the others."""
        with self.lock:
            try:
                return self.run.score(rows)
            except Exception:  # noqa: BLE001
                if len(rows) == 1:
                    raise
            out: list = []
            for row in rows:
                try:
                    out.append(self.run.score([row])[0])
                except Exception as exc:  # noqa: BLE001 — that row's own error, reported to it alone
                    out.append(exc)
            return out

    def routes(self, batcher: BatcherFactory) -> "APIRouter":
        from fastapi import APIRouter, Body

        pairs = batcher(self._score)

        router = APIRouter(tags=["C-STS"])

        @router.post("/similarity", summary="cos(g(s1 | c), g(s2 | c)) and the 1-5 label, for one pair or a list")
        async def similarity(body: Union[Pair, Annotated[List[Pair], Field(max_length=MAX_PAIRS)]] = Body(...)) -> Any:
            many = isinstance(body, list)
            items = body if many else [body]
            scored = await asyncio.gather(*(asyncio.wrap_future(f)
                                            for f in pairs.submit_many([p.model_dump() for p in items])))
            return scored if many else scored[0]

        return router

    def page(self) -> str:
        return resources.files("kgc.csts").joinpath("page.html").read_text(encoding="utf-8")
