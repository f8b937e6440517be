"""Link prediction's part of a recipe: its data extras, the SimKGC loss, re-ranking and score blocks at evaluation,
the entity index (a union on ``index.type``) and the structural side (a union on ``structure.model``).

The task registers :class:`LinkPredRecipe` (``LinkPredTask.recipe_class``); ``kgc.recipe`` validates a recipe
whose ``task`` is ``linkpred`` with it, the ``model:`` union of the registered conditioners added, each with link
prediction's own model keys (:class:`LinkPredModelKeys`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, model_validator

from kgc.linkpred.index.types import IndexOptions, index_options, index_union
from kgc.linkpred.structure.kinds import structure_tag, structure_union
from kgc.linkpred.structure.options import PykeenOptions, RulesOptions
from kgc.recipe import DataConfig, EvalConfig, Recipe, Section, TaskModelKeys


class LinkPredModelKeys(TaskModelKeys):
    """Link prediction's own ``model:`` keys, whatever the conditioner: how the two towers relate."""
    shared_towers: bool = Field(False, description="one encoder for the query and tail towers (SimKGC: separate)")
    tail_map_rank: Optional[int] = Field(
        None, ge=1, description="a trainable low-rank residual map after the tail tower, t' = normalise(t + U Vᵀ t) of "
                                "rank r (U starts at 0: the identity); with a tail tower that does not train "
                                "(loss.table_tails) the one part of the tail side that learns, applied to the whole "
                                "entity table at every step (unset: none)")


class LinkPredData(DataConfig):
    long_text: bool = Field(False, description="use entity2textlong.txt where the dataset has it")
    neighbor_text: bool = Field(True, description="append train-graph neighbour names to short descriptions")
    max_neighbors: int = Field(10, ge=0, description="at most this many neighbour names appended")
    short_description_words: int = Field(20, ge=0, description="descriptions below this many words get neighbours")


class LinkPredLoss(Section):
    """SimKGC's objective (kgc/linkpred/loss.py): InfoNCE with an additive margin and a learnable temperature over
    in-batch, pre-batch and self negatives."""
    in_batch: bool = Field(True, description="the batch's other tails are negatives")
    pre_batch: int = Field(0, ge=0, description="number of previous batches whose tails are negatives")
    pre_batch_weight: float = Field(0.5, description="logit weight of pre-batch negatives (log w added)")
    self_negative: bool = Field(True, description="the head itself is a negative (SimKGC)")
    self_negative_weight: float = Field(1.0, gt=0, description="the head's self-negative counts as w negatives "
                                                                 "(its logit + log w; 1: SimKGC)")
    margin: float = Field(0.02, description="additive margin γ subtracted from the positive cosine")
    temperature: float = Field(0.05, gt=0, description="τ: logits are cosines / τ (the starting value when learnt)")
    learn_temperature: bool = Field(True, description="τ is a parameter (log 1/τ learnt, clamped after each step)")
    min_temperature: float = Field(0.01, gt=0, description="the learnt τ stays at or above this")
    max_temperature: float = Field(1.0, gt=0, description="the learnt τ stays at or below this")
    mask_false_negatives: bool = Field(True, description="negatives that are known answers (train) are masked")
    symmetric: bool = Field(True, description="add SimKGC's tail -> query cross-entropy term")
    table_negatives: Optional[int] = Field(
        None, ge=1, description="every N steps embed every entity with the tail tower (no gradient) and score each "
                                "query against that whole table as extra negatives (ANCE-style; unset: off)")
    table_tails: bool = Field(
        False, description="with table_negatives: read the batch's tails and heads from that table too, so only the "
                           "query tower runs and trains between refreshes (a full softmax over every entity; "
                           "without shared_towers the tail tower stays as loaded and its table is computed once)")
    table_chunk: int = Field(
        65536, ge=1, description="with table_negatives: a table of more entities is scored this many at a time (its "
                                 "logsumexp accumulated by chunk, each chunk recomputed in the backward pass): memory "
                                 "batch × table_chunk instead of batch × entities, the same loss")
    table_sample: Optional[int] = Field(
        None, ge=1, description="with table_negatives: past this many entities, each step scores the queries against "
                                "this many table rows drawn uniformly (without replacement, the sampled-softmax "
                                "correction + log(entities / n) on each) instead of the whole table (unset: the "
                                "whole table)")

    @model_validator(mode="after")
    def _table_tails_need_a_table(self) -> "LinkPredLoss":
        if self.table_tails and not self.table_negatives:
            raise ValueError("loss.table_tails reads the tails from the entity table: set loss.table_negatives=N "
                             "too (N: steps between refreshes of the table)")
        if self.table_sample is not None and not self.table_negatives:
            raise ValueError(f"loss.table_sample={self.table_sample} samples rows of the entity table: set "
                             "loss.table_negatives=N too (N: steps between refreshes of the table), or unset "
                             "loss.table_sample")
        return self


class RerankConfig(Section):
    enabled: bool = Field(False, description="SimKGC's graph re-ranking at evaluation")
    n_hop: int = Field(2, ge=1, description="entities within n hops of the head on the train graph get the bonus")
    weight: float = Field(0.05, description="the bonus added to their cosine")


class LinkPredEval(EvalConfig):
    rerank: RerankConfig = RerankConfig()
    max_score_bytes: int = Field(256 * 2**20, ge=4096, description="largest dense (queries × entities) float32 "
                                 "score block evaluation forms; entity blocks when one row is larger")


# ``structure:``: a PyKEEN model, or mined rules, or a plugin's kind (chosen by ``structure.model``): the union of the
# registered kinds' options (kgc.linkpred.structure.kinds; the built-ins here, a plugin's through member_unions)
StructureConfig = Annotated[Union[Annotated[PykeenOptions, Tag("pykeen")], Annotated[RulesOptions, Tag("rules")]],
                            Discriminator(structure_tag)]


class LinkPredRecipe(Recipe):
    """A link-prediction recipe (``task: linkpred``)."""
    model_keys: ClassVar[Optional[type[TaskModelKeys]]] = LinkPredModelKeys
    task: Literal["linkpred"] = Field("linkpred", description="a registered task: linkpred (link prediction) or "
                                                              "csts (conditional STS)")
    data: LinkPredData = LinkPredData()
    loss: LinkPredLoss = LinkPredLoss()
    eval: LinkPredEval = LinkPredEval()
    # the entity index: a union on type over the registered index types (member_unions; IndexOptions: any of them)
    index: IndexOptions = Field(default_factory=index_options, description="the entity index (a union on type)")
    structure: Optional[StructureConfig] = Field(None, description="a PyKEEN model (or mined rules) beside the "
                                                                   "text model (absent: off)")

    @classmethod
    def member_unions(cls) -> dict[str, tuple[Any, Any]]:
        """``index``: the union of every registered index type's options (plugins' too), on ``type``;
        ``structure``: of every registered kind of structural model's, on ``model``."""
        return {"index": (index_union(), Field(default_factory=index_options,
                                               description=cls.model_fields["index"].description)),
                "structure": (Optional[structure_union()], Field(None, description=cls.model_fields[
                    "structure"].description))}

    @model_validator(mode="before")
    @classmethod
    def _index_type_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("index"), dict) and "type" not in data["index"]:
            data = {**data, "index": {"type": "flat", **data["index"]}}
        return data
