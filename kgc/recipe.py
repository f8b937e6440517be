"""The recipe: the single home of every hyperparameter (pydantic schema, YAML + dotted overrides).

Defaults are the SimKGC paper's (batch 1024, lr 5e-5, γ = 0.02, τ₀ = 0.05 learnable, mean pooling,
50 tokens). Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from kgc.errors import KGCError
from kgc.registry import CONDITIONERS, TASKS

DEFAULT_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class SynthConfig(_Section):
    """The generated conditional-similarity set (``data.dataset: synth-csts``); deterministic from the seed."""
    seed: int = Field(0, description="synth-csts: the generator's seed")
    train_pairs: int = Field(2000, ge=1, description="sentence pairs in csts_train.csv (two rows each)")
    validation_pairs: int = Field(300, ge=1, description="sentence pairs in csts_validation.csv")
    test_pairs: int = Field(500, ge=1, description="sentence pairs in csts_test.csv")


class DataConfig(_Section):
    dataset: str = Field("umls", description="catalog name (wn18rr, fb15k237, umls, nations, kinships; "
                                             "csts, synth-csts for task csts) or a folder")
    path: Optional[str] = Field(None, description="explicit folder; wins over the catalog lookup (the run's dataset "
                                                  "name is then the folder's name)")
    long_text: bool = Field(False, description="use entity2textlong.txt where the dataset has it")
    neighbor_text: bool = Field(True, description="append train-graph neighbour names to short descriptions")
    max_neighbors: int = Field(10, ge=0, description="at most this many neighbour names appended")
    short_description_words: int = Field(20, ge=0, description="descriptions below this many words get neighbours")
    max_tokens: int = Field(50, ge=8, description="texts are cut to this many tokens, special tokens included")
    allow_unseen_relations: bool = Field(False, description="accept relations that occur in dev/test but in no "
                                                            "train triple (ranked from their text alone)")
    synth: SynthConfig = SynthConfig()

    @model_validator(mode="before")
    @classmethod
    def _name_of_the_folder(cls, data: Any) -> Any:
        """With ``path``, the dataset is the folder there: its name is what the run records (not the default)."""
        if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"].strip():
            data = {**data, "dataset": Path(data["path"].rstrip("/\\")).expanduser().name or data["path"]}
        return data


class ModelConfig(_Section):
    backbone: str = Field(DEFAULT_BACKBONE, description="Hugging Face id or local folder")
    conditioner: str = Field("biencoder", description="how the relation conditions the head (registry name)")
    shared_towers: bool = Field(False, description="one encoder for query and tail towers (SimKGC: separate)")
    tail_map_rank: Optional[int] = Field(
        None, ge=1, description="link prediction: a trainable low-rank residual map after the tail tower, "
                                "t' = normalise(t + U Vᵀ t) of rank r (U starts at 0: the identity); with a tail "
                                "tower that does not train (loss.table_tails) the one part of the tail side that "
                                "learns, applied to the whole entity table at every step (unset: none)")
    pooling: Literal["mean", "cls", "s2sent"] = Field("mean", description="token states to one vector: mean, [CLS], "
                                                  "or S²Sent (the last blocks fused, kgc/encoding/pooling.py)")
    s2sent_blocks: int = Field(3, ge=1, description="s2sent: the last n blocks fused")
    s2sent_frequencies: int = Field(4, ge=1, description="s2sent: the lowest m 2-D DCT frequencies (m = 1: average)")
    s2sent_reduction: int = Field(12, ge=1, description="s2sent: excitation W1 maps D to D/r")
    # conditioner options (each conditioner reads the ones it declares)
    rank: Optional[int] = Field(None, ge=1, description="hypernet: rank K of W1 W2ᵀ (default H/12)")
    hypernet_form: Literal["lowrank", "residual", "full"] = Field(
        "lowrank", description="hypernet: W_c = W1 W2ᵀ (Hyper-CL), I + W1 W2ᵀ (residual), or a full H×H matrix")
    dropout: float = Field(0.1, ge=0, lt=1, description="concat: dropout on [h_s ; h_c]")
    router_layers: Optional[int] = Field(None, ge=0, description="router: the condition enters at layer T - k "
                                         "(default 1); biencoder: CSR routing in the top k layers (default 0, off)")
    weighting: Optional[Literal["one_plus_w", "w_only", "centred"]] = Field(
        None, description="router, biencoder with router_layers: the factor is 1 + w (CSR's Eq. 1; the bi-encoder's "
                          "default), w alone, or 1 + w − 1/n over the n tokens w covers (centred: the router's "
                          "default; uniform w leaves the encoder as it is)")
    scorer: Literal["query_key", "paper", "hidden", "heavy", "learned", "cls_attention"] = Field(
        "paper", description="router: how the condition scores the sentence's tokens (paper: the CSR paper's "
                                 "equation; learned: the released code's trained scorer; kgc/conditioning/router.py "
                                 "describes each)")
    route_over: Literal["words", "all"] = Field(
        "words", description="router: w is a softmax over the sentence's word tokens, its [CLS]/[SEP] masked out and "
                             "left unscaled (words), or over every token, special ones included (all: kgc before "
                             "2026-11-24, whose w sat on [CLS])")
    route_scales: Optional[Literal["context", "values"]] = Field(
        None, description="router: the factor multiplies each token's value, so every token attends more to the "
                          "routed ones (values, the default), or its attention context (context: the CSR paper's Eq. "
                          "1; the default for scorer cls_attention, which reads w off that attention)")
    route_temperature: float = Field(1.0, gt=0, description="router: w = softmax(score / τ); τ < 1 concentrates w "
                                                            "(1: the paper)")
    cross_attend: Literal["none", "top", "all"] = Field(
        "none", description="router: the sentence also attends to the condition's tokens in no layer, the "
                            "router layers, or every layer (the released code; nothing cacheable)")
    renormalise: bool = Field(True, description="router, scorer cls_attention: w renormalised over the sentence's "
                                                "tokens (false: the released code's raw [CLS] probabilities)")
    case_projection: Literal["linear", "mlp"] = Field("linear", description="case: W x, or a two-layer MLP")
    case_head: Literal["paper", "legacy"] = Field(
        "paper", description="case: the paper's heads (linear: Dropout(0.2) on W x; mlp: ReLU, Dropout(0.15), twice, "
                             "no biases) or legacy (kgc before 2026-11-24: linear W x; mlp W2 Dropout(0.1)(LeakyReLU(W1 x)))")
    case_dim: Optional[int] = Field(None, ge=1, description="case: projection width k (default H)")


class EncoderConfig(_Section):
    trainable_layers: Union[int, Literal["all"]] = Field(
        "all", description="train the top n layers; the frozen ones below come from a layer cache")
    cache: bool = Field(True, description="cache the frozen layers' outputs on disk ($KGC_CACHE_HOME)")


class LossConfig(_Section):
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
    # task csts
    mse_weight: float = Field(1.0, ge=0, description="csts: weight of MSE(cos, (label - 1) / 4)")
    contrastive: bool = Field(True, description="csts: Hyper-CL's c_high vs c_low term per sentence pair")
    contrastive_weight: float = Field(1.0, ge=0, description="csts: weight of the contrastive term")
    contrastive_temperature: float = Field(1.9, gt=0, description="csts: τ of the contrastive term (Hyper-CL: 1.5-1.9)")


class TrainConfig(_Section):
    epochs: int = Field(50, ge=1, description="passes over the training data (the schedule spans them)")
    max_steps: Optional[int] = Field(None, ge=1, description="stop after this many optimiser steps")
    max_minutes: Optional[float] = Field(None, gt=0, description="stop once training has taken this many minutes of "
                                         "wall time (validation excluded; the schedule still spans the steps "
                                         "unless train.schedule=minutes)")
    schedule: Literal["steps", "minutes"] = Field(
        "steps", description="what the linear decay spans: steps (epochs, or max_steps); minutes (with "
                             "train.max_minutes: the decay ends when the minutes run out, its step count "
                             "re-estimated from the pace at every logged step, warm-up at most a tenth of it)")
    batch_size: int = Field(1024, ge=2, description="training examples per step (the global batch under torchrun)")
    lr: float = Field(5e-5, gt=0, description="AdamW's peak learning rate (linear warm-up, then linear decay)")
    conditioner_lr: Optional[float] = Field(None, gt=0, description="peak lr of the parameters a conditioner adds "
                                            "(Hyper-CL's generators, CSR's heavy W_q/W_k, projections); default lr")
    weight_decay: float = Field(1e-4, description="AdamW's weight decay (not on biases, LayerNorms, τ)")
    warmup_steps: int = Field(400, ge=0, description="steps of linear warm-up")
    grad_clip: float = Field(10.0, gt=0, description="gradients clipped to this global norm")
    seed: int = Field(2022, description="seeds weights, batches and dropout: a run is reproducible")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field("auto", description="auto = bf16 on CUDA, fp32 on CPU")
    num_threads: Union[int, Literal["auto"], None] = Field(
        "auto", description="CPU threads for torch: a number; auto: the cores not already busy (runnable tasks in "
                            "/proc/loadavg), so two runs on one machine do not oversubscribe it; null: torch's "
                            "default (every core)")
    keep: Literal["best", "all"] = Field(
        "best", description="after training, keep best.pt only (best: checkpoints/ is deleted) or also "
                            "checkpoints/last.pt with the optimiser state, to train further (all)")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    log_every: int = Field(10, ge=1, description="steps between rows of metrics.jsonl")
    check_memory: bool = Field(True, description="refuse to start when the estimated memory of a training step "
                               "exceeds what the machine has free (kgc/training/estimate.py); false: warn and go on "
                               "(kgc train --no-memory-check)")

    @model_validator(mode="after")
    def _threads_positive(self) -> "TrainConfig":
        if isinstance(self.num_threads, int) and self.num_threads < 1:
            raise ValueError(f"train.num_threads={self.num_threads}: give a count of at least 1, or auto")
        if self.schedule == "minutes" and not self.max_minutes:
            raise ValueError("train.schedule=minutes fits the decay to train.max_minutes: set train.max_minutes=N, "
                             "or schedule=steps")
        return self


class RerankConfig(_Section):
    enabled: bool = Field(False, description="SimKGC's graph re-ranking at evaluation")
    n_hop: int = Field(2, ge=1, description="entities within n hops of the head on the train graph get the bonus")
    weight: float = Field(0.05, description="the bonus added to their cosine")


class EvalConfig(_Section):
    batch_size: int = Field(256, ge=1, description="queries (and entity texts) encoded per batch at evaluation")
    dev_queries: Optional[int] = Field(None, ge=1, description="validate on a fixed sample of dev triples")
    validate_every_epoch: bool = Field(True, description="validate on dev after each epoch (best.pt: the best)")
    validate_every_steps: Optional[int] = Field(None, ge=1, description="also validate every N steps")
    rerank: RerankConfig = RerankConfig()
    max_score_bytes: int = Field(256 * 2**20, ge=4096, description="largest dense (queries × entities) float32 "
                                 "score block evaluation forms; entity blocks when one row is larger")


class IndexConfig(_Section):
    """The entity index ``kgc index RUN`` builds (options there override these). Inner product on unit vectors
    throughout, so scores are cosines; every type but ``flat`` is approximate (kgc bench index measures it)."""
    type: Literal["flat", "ivf", "hnsw", "ivfpq"] = Field(
        "flat", description="flat: exact; ivf: k-means cells, a query visits nprobe of them; hnsw: a graph with "
                            "hnsw_m links per node; ivfpq: ivf with vectors compressed to pq_bytes bytes")
    nlist: Optional[int] = Field(None, ge=1, description="ivf, ivfpq: number of cells (default 4·√entities, "
                                                         "clamped to 16..65536 and ≤ entities / 39)")
    nprobe: int = Field(32, ge=1, description="ivf, ivfpq: cells visited per query (search time; no rebuild)")
    hnsw_m: int = Field(32, ge=2, le=256, description="hnsw: links per node (memory: 8·M bytes per entity)")
    ef_search: int = Field(64, ge=1, description="hnsw: candidate list per query (search time; no rebuild)")
    ef_construction: int = Field(40, ge=1, description="hnsw: candidate list while inserting (build quality/time)")
    pq_bytes: Optional[int] = Field(None, ge=1, description="ivfpq: bytes per vector (sub-quantisers of 8 bits); "
                                                            "must divide the embedding dim (default ≈ dim / 8)")
    train_size: Optional[int] = Field(None, ge=1, description="ivf, ivfpq: entities sampled to train k-means "
                                                              "(default 64·nlist, at most all of them)")


class StructureConfig(_Section):
    """A PyKEEN model trained beside the text model on the same train triples (``kgc.linkpred.structure``);
    evaluation and ``kgc predict`` fuse α·z(text cosine) + (1 − α)·z(structural score), α chosen on dev."""
    model: str = Field("RotatE", description="a PyKEEN model name (RotatE, TransE, ComplEx, DistMult, ...), or "
                                             "rules: closed path rules counted from the train graph (AnyBURL's "
                                             "form; kgc.linkpred.rules), no training")
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
    alphas: list[float] = Field(default_factory=lambda: [round(0.1 * i, 1) for i in range(11)],
                                description="the α grid tried on dev (1: text only, 0: structure only)")
    alpha_per: Literal["all", "relation"] = Field(
        "all", description="one α for every query (all), or one per query relation chosen on dev (relation: "
                           "relations with fewer dev queries than alpha_min_queries keep the one α)")
    alpha_min_queries: int = Field(50, ge=1, description="alpha_per relation: dev queries a relation needs for "
                                                         "an α of its own")
    rule_length: int = Field(2, ge=1, le=2, description="model rules: the longest rule body (1: r(x,y) ⇐ b(x,y); "
                                                         "2: also r(x,y) ⇐ b1(x,z) ∧ b2(z,y))")
    rule_min_support: int = Field(2, ge=1, description="model rules: a rule is kept when its body and head hold "
                                                        "together on at least this many train pairs")
    rule_unseen: float = Field(5.0, ge=0, description="model rules: confidence = support / (body pairs + this) "
                                                      "(AnyBURL's constant)")
    rule_min_confidence: float = Field(0.01, ge=0, le=1, description="model rules: rules below it are dropped")
    rule_max_per_relation: Optional[int] = Field(50, ge=1, description="model rules: the most confident rules "
                                                                       "kept per relation (unset: all)")
    rule_aggregation: Literal["noisy_or", "max"] = Field(
        "noisy_or", description="model rules: an entity's score from the rules that reach it: 1 − Π(1 − conf) "
                                "(noisy_or) or the highest conf (max)")

    @property
    def is_rules(self) -> bool:
        """The structural side is mined rules, not a PyKEEN model."""
        return self.model.lower() == "rules"

    @model_validator(mode="after")
    def _known_to_pykeen(self, info: ValidationInfo) -> "StructureConfig":
        if not self.alphas or any(not 0 <= a <= 1 for a in self.alphas):
            raise ValueError(f"structure.alphas={self.alphas}: give weights in [0, 1]")
        if self.is_rules:  # nothing of PyKEEN's is used
            return self
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


def _owned(key: str, keys: frozenset[str]) -> bool:
    """``key`` is one of ``keys`` or inside a section among them (``index`` owns ``index.type``)."""
    return key in keys or any(key.startswith(k + ".") for k in keys)


def _explicit_keys(section: BaseModel, prefix: str = "") -> set[str]:
    keys = set()
    for name in section.model_fields_set:
        value = getattr(section, name)
        keys.add(f"{prefix}{name}")
        if isinstance(value, BaseModel):
            keys |= _explicit_keys(value, f"{prefix}{name}.")
    return keys


class Recipe(_Section):
    name: str = Field("run", description="the run's name: runs/<name>-<time> by default (a recipe file: its stem)")
    task: str = Field("linkpred", description="a registered task: linkpred (link prediction) or csts "
                                               "(conditional STS)")
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    encoder: EncoderConfig = EncoderConfig()
    loss: LossConfig = LossConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    index: IndexConfig = IndexConfig()
    structure: Optional[StructureConfig] = Field(None, description="a PyKEEN model beside the text model "
                                                 "(link prediction; absent: off)")

    @model_validator(mode="after")
    def _keys_of_this_task(self) -> "Recipe":
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: unknown. Registered tasks: {', '.join(TASKS)}")
        wrong = {}
        for k in sorted(_explicit_keys(self)):
            owners = [name for name in TASKS if name != self.task and _owned(k, TASKS[name].recipe_keys)]
            if owners and not _owned(k, TASKS[self.task].recipe_keys):
                wrong[k] = owners[0]
        if wrong:
            raise ValueError(f"{', '.join(wrong)}: read only by task {', '.join(sorted(set(wrong.values())))}, and "
                             f"this recipe has task {self.task}. Remove them (or set task).")
        return self

    @model_validator(mode="after")
    def _table_tails_need_a_table(self) -> "Recipe":
        if self.loss.table_tails and not self.loss.table_negatives:
            raise ValueError("loss.table_tails reads the tails from the entity table: set loss.table_negatives=N "
                             "too (N: steps between refreshes of the table)")
        return self

    @model_validator(mode="after")
    def _conditioner_defaults(self) -> "Recipe":
        """The defaults that depend on other options (the conditioner's ``resolved_options``), written into the
        recipe, so a saved run's recipe.yaml names what it trained with whatever later defaults become."""
        if self.model.conditioner in CONDITIONERS:  # an unknown name fails when the model is built
            cls = CONDITIONERS[self.model.conditioner]
            mine = {k: getattr(self.model, k) for k in cls.options}
            for key, value in cls.resolved_options(mine).items():
                if value != mine[key]:
                    setattr(self.model, key, value)
        return self

    @model_validator(mode="after")
    def _options_of_this_conditioner(self) -> "Recipe":
        if self.model.conditioner not in CONDITIONERS:
            return self  # an unknown name fails when the model is built, with the list of registered ones
        mine = set(CONDITIONERS[self.model.conditioner].options)
        others = {k: name for name, cls in CONDITIONERS.items() for k in cls.options if name != self.model.conditioner}
        fields = ModelConfig.model_fields  # a saved recipe.yaml lists every key: only a changed value counts
        wrong = sorted(k for k in self.model.model_fields_set if k in others and k not in mine
                       and getattr(self.model, k) != fields[k].default)
        if wrong:
            raise ValueError(f"{', '.join('model.' + k for k in wrong)}: not read by model.conditioner="
                             f"{self.model.conditioner} (only by {', '.join(sorted({others[k] for k in wrong}))}). "
                             "Remove them, or choose that conditioner.")
        return self

    def to_yaml(self) -> str:
        """The fully resolved recipe, without the keys only other tasks read."""
        tree = self.model_dump(mode="json")
        mine = TASKS[self.task].recipe_keys
        for key in sorted({k for name in TASKS if name != self.task for k in TASKS[name].recipe_keys} - mine):
            section, _, name = key.partition(".")
            if name:
                tree[section].pop(name, None)
            else:  # a whole section (index)
                tree.pop(section, None)
        return yaml.safe_dump(tree, sort_keys=False)


def _leaf_fields(model: type[BaseModel] = Recipe, prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, pydantic FieldInfo)`` of every value a recipe holds, sections (``Optional`` ones too) walked."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]  # Optional[Section]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            ann = args[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_leaf_fields(ann, f"{prefix}{name}."))
        else:
            out.append((f"{prefix}{name}", field))
    return out


def valid_keys() -> list[str]:
    """Every dotted key a recipe accepts, e.g. ``train.lr``."""
    return [key for key, _ in _leaf_fields()]


def _type_name(annotation: Any) -> str:
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is Union or str(origin) == "types.UnionType":
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + (
            " (optional)" if type(None) in args else "")
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def key_reference(task: str | None = None) -> list[dict[str, str]]:
    """``{key, type, default, description}`` for every dotted recipe key, from the schema (``kgc recipe keys``);
    ``task``: leave out the keys only other tasks read."""
    rows = []
    for key, f in _leaf_fields():
        default = f.get_default(call_default_factory=True)
        rows.append({"key": key, "type": _type_name(f.annotation),
                     "default": "unset" if default is None else yaml.safe_dump(default, default_flow_style=True)
                     .strip().removesuffix("...").strip(),
                     "description": f.description or ""})
    if task is not None:
        if task not in TASKS:
            raise KGCError(f"task {task!r}: unknown. Registered tasks: {', '.join(TASKS)}")
        others = {k for name in TASKS if name != task for k in TASKS[name].recipe_keys} - set(TASKS[task].recipe_keys)
        rows = [r for r in rows if not _owned(r["key"], frozenset(others))]
    return rows


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise KGCError(f"--set {key}: '{part}' is not a section")
    node[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    known = set(valid_keys())
    for item in items:
        if "=" not in item:
            raise KGCError(f"--set {item!r}: expected key=value, e.g. --set train.lr=3e-5")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in known:
            raise KGCError(f"--set {key}: unknown recipe key. Valid keys: {', '.join(sorted(known))}")
        out[key] = yaml.safe_load(raw) if raw.strip() else None
    return out


def _explain(err: ValidationError, source: str) -> KGCError:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in e["loc"][:-1])
            choices = [k for k in valid_keys() if k.startswith(parent + ".")] if parent else list(Recipe.model_fields)
            lines.append(f"unknown key '{loc}'. Valid keys here: {', '.join(choices)}")
        elif not loc:  # a check across sections
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"'{loc}': {e['msg']} (got {e.get('input')!r})")
    return KGCError(f"{source}: bad recipe:\n  " + "\n  ".join(lines))


def read_recipe_tree(path: str | Path, *, saved: bool = False) -> dict[str, Any]:
    """The raw mapping of a YAML recipe file (``name`` defaults to the file's stem), not yet validated.

    ``saved``: the ``recipe.yaml`` of a run directory. Runs written before ``model.cross_attend`` existed list
    ``router_layers: 1`` whatever their conditioner (only the router read it then); the bi-encoder reads it
    now (CSR inside the bi-encoder), so in those files it is dropped unless the run is a router run. CASE runs
    written before ``model.case_head`` existed trained the legacy heads, and keep them; router runs written before
    ``model.route_over`` existed routed over every token and scaled the context vectors, and keep doing so.
    """
    path = Path(path)
    if path.name == "recipe.yaml" and any((path.parent / f).exists() for f in ("metrics.jsonl", "best.pt")):
        saved = True  # a run's own recipe (`kgc train RUN/recipe.yaml --out NEW`): read as the run was trained
    if path.is_dir():
        raise KGCError(f"{path}: a folder, not a recipe. Give a YAML file, e.g. recipes/umls_biencoder.yaml")
    if not path.is_file():
        raise KGCError(f"{path}: recipe not found. Recipes live in recipes/*.yaml")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise KGCError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}). "
                       "Save the recipe as UTF-8.") from None
    except yaml.YAMLError as exc:
        raise KGCError(f"{path}: not valid YAML: {exc}") from None
    fix = ("Recipes start from one of recipes/*.yaml: copy one (e.g. recipes/umls_biencoder.yaml) and change its "
           "keys; `kgc recipe keys` lists them all")
    if tree is None:  # an empty file, or comments only: it would train silently with every default
        raise KGCError(f"{path}: an empty recipe (no keys). {fix}")
    if not isinstance(tree, dict):
        kind = {"list": "list", "str": "string", "bool": "boolean"}.get(type(tree).__name__, "single value")
        raise KGCError(f"{path}: a recipe must be a mapping of sections (data, model, loss, train, eval), not a "
                       f"{kind}. {fix}")
    tree.setdefault("name", path.stem)
    model = tree.get("model")
    if saved and isinstance(model, dict) and "cross_attend" not in model and model.get("conditioner") != "router":
        model.pop("router_layers", None)
    if saved and isinstance(model, dict) and model.get("conditioner") == "router" and "route_over" not in model:
        # a router run from before 2026-11-24's routing: w covered [CLS] and [SEP] and scaled the context vectors
        model.update(route_over="all", route_scales="context", scorer=model.get("scorer", "query_key"),
                     weighting=model.get("weighting", "one_plus_w"))
    if saved and isinstance(model, dict) and "route_over" not in model and model.get("conditioner") != "router":
        # every run saved before lists the router's keys with their defaults then, which were not today's
        if model.get("scorer") == "query_key":
            model.pop("scorer")
        if model.get("weighting") == "one_plus_w" and model.get("conditioner") != "biencoder":
            model.pop("weighting")
    if saved and isinstance(model, dict) and model.get("conditioner") == "case" and "case_head" not in model:
        model["case_head"] = "legacy"  # a CASE run from before the paper's heads: its weights are the old heads'
    return tree


def validate_recipe(tree: dict[str, Any], overrides: dict[str, Any] | None = None, *, source: str = "recipe",
                    saved: bool = False) -> Recipe:
    """``tree`` with dotted ``overrides`` (``{"train.lr": 3e-5}``, keys already checked) applied, validated as a
    whole; a bad value or key ends in one message naming ``source``. ``saved``: a run's own recipe (already
    validated when the run was made; names of PyKEEN models are not looked up again)."""
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    try:
        return Recipe.model_validate(tree, context={"saved": saved})
    except ValidationError as err:
        raise _explain(err, source) from None


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None, *, saved: bool = False) -> Recipe:
    """Read a YAML recipe (or defaults when ``path`` is None) and apply ``key=value`` overrides (``--set``)."""
    tree = read_recipe_tree(path, saved=saved) if path is not None else {}
    return validate_recipe(tree, parse_overrides(overrides or []), source=str(path) if path is not None else "recipe",
                           saved=saved)


def override_keys(overrides: Mapping[str, Any] | Sequence[str] | None, kwargs: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Dotted key → value from ``overrides`` (a mapping, or ``key=value`` strings: the ``--set`` syntax, values as
    YAML) and ``section__key`` keyword arguments (Python names cannot hold dots). Unknown keys fail as --set does."""
    known = set(valid_keys())
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        items = list(parse_overrides(list(overrides or [])).items())
    items += [(k.replace("__", "."), v) for k, v in (kwargs or {}).items()]
    out: dict[str, Any] = {}
    for key, value in items:
        if key not in known:
            parse_overrides([f"{key}="])  # raises the same KGCError as an unknown --set key
        out[key] = value
    return out


def resolve_recipe(recipe: "str | Path | Recipe | Mapping[str, Any]",
                   overrides: Mapping[str, Any] | Sequence[str] | None = None, **kwargs: Any) -> Recipe:
    """A validated :class:`Recipe` from a path, a Recipe or a dict, with overrides applied (``kgc.resolve_recipe``)."""
    import copy

    if isinstance(recipe, (str, Path)):
        tree, source = read_recipe_tree(recipe), str(recipe)
    elif isinstance(recipe, Recipe):
        tree, source = recipe.model_dump(mode="json", exclude_unset=True), "recipe"
    elif isinstance(recipe, Mapping):
        tree, source = copy.deepcopy(dict(recipe)), "recipe"
    else:
        raise KGCError(f"recipe: expected a path to a YAML recipe, a kgc.recipe.Recipe or a dict, got "
                       f"{type(recipe).__name__}")
    return validate_recipe(tree, override_keys(overrides, kwargs), source=source)
