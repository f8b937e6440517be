"""How a link-prediction run is evaluated — the split's protocol beyond the recipe's ``eval:`` — declared once:
:class:`EvalOptions`. ``kgc evaluate``'s flags are its fields (:mod:`kgc.cli.common`'s ``ModelFlags``),
``run.evaluation(split, **options)`` validates its keywords with it, and the rules between options that need no
run (``--top-k`` goes with ``--use-index``, …) are its own; those that read the run (a structural model present or
not) are :func:`kgc.linkpred.answer.results.evaluate_run`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kgc.errors import validated


class EvalOptions(BaseModel):
    """The options of one evaluation of a link-prediction run (``kgc evaluate RUN --use-index …``)."""

    model_config = ConfigDict(extra="forbid")

    rerank: Optional[bool] = Field(None, description="SimKGC graph re-ranking (default: the recipe's eval.rerank)")
    entities_from: Optional[Path] = Field(None, description="inductive: rank the test triples of this KG-BERT "
                                                            "folder over its entities, unseen in training (kgc data "
                                                            "inductive-split makes one)")
    candidates: Optional[Literal["split", "all"]] = Field(
        None, description="with --entities-from: split (the entities of the evaluated split's triples, SimKGC's "
                          "protocol) or all (every entity of the folder)")
    use_index: bool = Field(False, description="rank within the top --top-k of the run's FAISS index (its type, "
                                               "e.g. hnsw), re-scored exactly: what a deployed search returns")
    top_k: Optional[int] = Field(None, ge=1, description="with --use-index: candidates retrieved per query "
                                                         "(default 100)")
    text_only: bool = Field(False, description="a run with a structural model: rank by its text model alone (its "
                                               "re-ranking applies), into results.text.json")
    inductive: bool = Field(False, description="rank the run's dataset's inference graph (a GraIL split's: its "
                                               "entities unseen in training), every entity of it a candidate, "
                                               "into results.inductive.json")
    negatives: Optional[int] = Field(None, ge=2, description="with --inductive or --entities-from: GraIL's "
                                                             "protocol, each triple against N candidates per side "
                                                             "(itself and N-1 sampled corruptions; GraIL: 50), the "
                                                             "draws written in ranks.inductive-N.tsv")
    seed: int = Field(0, description="with --negatives: the draws' seed")

    @model_validator(mode="after")
    def _together(self) -> "EvalOptions":
        """The options that go together, and those that exclude each other."""
        if self.inductive and self.entities_from is not None:
            raise ValueError("--inductive ranks over the run's dataset's inference graph; give it or --entities-from "
                             "FOLDER, not both")
        elsewhere = self.inductive or self.entities_from is not None
        if self.negatives is not None and not elsewhere:
            raise ValueError("--negatives samples corrupted triples of an inference graph (GraIL's protocol): give "
                             "it with --inductive or --entities-from")
        if self.use_index and elsewhere:
            raise ValueError("use_index (--use-index) ranks against the run's own FAISS index; drop it with "
                             "entities_from (--entities-from)")
        if self.candidates is not None and not elsewhere:
            raise ValueError("candidates (--candidates) goes with entities_from (--entities-from)")
        if self.top_k is not None and not self.use_index:
            raise ValueError("top_k (--top-k) goes with use_index (--use-index)")
        if self.rerank and elsewhere:
            raise ValueError("--rerank with --entities-from: graph re-ranking boosts the train-graph neighbours of "
                             "the head, and unseen entities have none (SimKGC turns it off for inductive "
                             "evaluation; with an empty graph it would boost only the head itself). Drop --rerank.")
        return self

    @classmethod
    def of(cls, options: "Mapping[str, Any] | EvalOptions | None" = None) -> "EvalOptions":
        """The options from Python keywords (or as they are); a bad, unknown or ill-matched one is one KGCError."""
        return options if isinstance(options, EvalOptions) else validated(cls, options or {})
