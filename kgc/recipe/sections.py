"""The sections every recipe has, as pydantic models: ``data``, ``model`` (the base of each conditioner's options),
``encoder``, ``train``, ``eval``, ``tune``, and :class:`Recipe` itself (a task's recipe class subclasses it). How a
recipe is read, upgraded, validated and described is :mod:`kgc.recipe`."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kgc.migrations import CURRENT
from kgc.families import MISSING_DATA_PATH, find_recipe, load_tree  # noqa: F401 — find_recipe: for the layers above
from kgc.registry import CONDITIONERS, TRACKERS

DEFAULT_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"


# YAML 1.1 reads these bare words as booleans; an option whose values are words takes the word back
_YAML_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _word_choices(annotation: Any) -> tuple | None:
    """The string values of a ``Literal`` annotation (also inside ``Optional``), None where it also takes a bool
    (a bool there is meant as one) or has no Literal."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return tuple(a for a in args if isinstance(a, str))
    if typing.get_origin(annotation) in (Union, types.UnionType) and bool not in args:
        found = [c for a in args if (c := _word_choices(a))]
        return tuple(w for c in found for w in c) if found else None
    return None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _words_yaml_read_as_booleans(cls, data: Any) -> Any:
        """``amp: off`` (or ``--set train.amp=off``): YAML reads the bare word as ``false``; an option whose values
        are words, one of them off/no/false (on/yes/true), takes that word back instead of refusing the bool."""
        if not isinstance(data, dict):
            return data
        changed = None
        for name, field in cls.model_fields.items():
            value = data.get(name)
            if isinstance(value, bool) and (choices := _word_choices(field.annotation)):
                word = next((w for w in _YAML_WORDS[value] if w in choices), None)
                if word is not None:
                    changed = {**(changed or data), name: word}
        return changed or data


class DataConfig(Section):
    dataset: str = Field("umls", description="catalog name (wn18rr, fb15k237, umls, nations, kinships; "
                                             "csts, synth-csts for task csts) or a folder")
    path: Optional[str] = Field(None, description="explicit folder; wins over the catalog lookup (the run's dataset "
                                                  "name is then the folder's name)")
    max_tokens: int = Field(50, ge=8, description="texts are cut to this many tokens, special tokens included")
    allow_unseen_relations: bool = Field(False, description="accept relations that occur in dev/test but in no "
                                                            "train triple (ranked from their text alone)")

    @model_validator(mode="before")
    @classmethod
    def _name_of_the_folder(cls, data: Any) -> Any:
        """With ``path``, the dataset is the folder there: its name is what the run records (not the default)."""
        if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"].strip():
            data = {**data, "dataset": Path(data["path"].rstrip("/\\")).expanduser().name or data["path"]}
        return data


class ModelConfig(Section):
    """The keys every conditioner reads. ``model:`` is a union on ``conditioner``: each conditioner declares its own
    options model, a subclass of this one beside its code (``Conditioner.Options``), so a key exists only under
    the conditioner that reads it (``rank`` under ``hypernet``)."""
    backbone: str = Field(DEFAULT_BACKBONE, description="Hugging Face id or local folder")
    conditioner: str = Field(description="how the relation conditions the head (a registered conditioner: "
                                         "`kgc recipes keys model.` lists each one's keys)")
    pooling: Literal["mean", "cls", "s2sent"] = Field("mean", description="token states to one vector: mean, [CLS], "
                                                  "or S²Sent (the last blocks fused, kgc/encoding/pooling.py)")
    s2sent_blocks: int = Field(3, ge=1, description="s2sent: the last n blocks fused")
    s2sent_frequencies: int = Field(4, ge=1, description="s2sent: the lowest m 2-D DCT frequencies (m = 1: average)")
    s2sent_reduction: int = Field(12, ge=1, description="s2sent: excitation W1 maps D to D/r")

    @classmethod
    def selected_by(cls, tree: dict) -> bool:
        """Whether a raw ``model:`` mapping selects this member (the discriminator as validation reads it)."""
        tag = cls.model_fields["conditioner"].default
        return (tree.get("conditioner") or CONDITIONERS.default) == tag

    def options(self) -> dict[str, Any]:
        """This member's own keys (the conditioner's options) with their values: neither the keys every conditioner
        reads nor those the task adds (:class:`TaskModelKeys`)."""
        task = {k for base in type(self).__mro__ if isinstance(base, type) and issubclass(base, TaskModelKeys)
                and not issubclass(base, ModelConfig) for k in base.model_fields}
        return {k: getattr(self, k) for k in type(self).model_fields
                if k not in ModelConfig.model_fields and k not in task}


class TaskModelKeys(Section):
    """Keys a task adds to ``model:`` whatever the conditioner (link prediction's ``shared_towers``), declared
    beside the task and named by its recipe class (``Recipe.model_keys``): :func:`recipe_type` joins them to every
    conditioner's options in that task's recipe, so another task's recipe does not have them."""


class EncoderConfig(Section):
    trainable_layers: Union[int, Literal["all"]] = Field(
        "all", description="train the top n layers; the frozen ones below come from a layer cache")
    cache: Union[bool, Literal["required"]] = Field(
        True, description="cache the frozen layers' outputs on disk ($KGC_CACHE_HOME): true: when what the run's "
                          "cache holds in memory fits encoder.cache_max_gb and its segments the free disk, else off "
                          "(said in one line, with its estimated size); required: the cache or nothing (a run whose "
                          "cache would not fit stops before its first byte); false: off")
    cache_max_gb: Optional[float] = Field(
        None, gt=0, description="the most memory the layer cache may take, GB: the states it holds at once (all of "
                                "them at evaluation; between two saves in training) and its lookup index; unset: half "
                                "the memory available when the cache is set up (kgc/training/cache_plan.py)")


class TrainConfig(Section):
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
    amp: Literal["auto", "off", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on CUDA; on a CPU bf16 where it has bf16 hardware and a probe of the step "
                            "finds it faster, else fp32 (kgc.encoding.precision); off: fp32")
    bf16_stream: bool = Field(
        False, description="experimental: in a bf16 CPU training step, cast the encoder's residual stream to bf16 "
                           "once at its first layer instead of autocast's cast for each matrix product "
                           "(kgc/encoding/stream.py: residual sums and layer-norm outputs rounded to bf16); not yet "
                           "measured on a CPU with bf16 matrix units, so off; no effect in fp32, inference or on a GPU")
    num_threads: Union[int, Literal["auto"], None] = Field(
        "auto", description="CPU threads for torch: a number; auto: the cores not already busy (runnable tasks in "
                            "/proc/loadavg), at most $OMP_NUM_THREADS where set, so two runs on one machine do not "
                            "oversubscribe it; null: torch's default (every core). Set for the run only: a program "
                            "that calls kgc.train gets its own thread count back")
    keep: Literal["best", "all"] = Field(
        "best", description="after training, keep best.pt only (best: checkpoints/ is deleted) or also "
                            "checkpoints/last.pt with the optimiser state, to train further (all)")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    log_every: int = Field(10, ge=1, description="steps between rows of metrics.jsonl")
    trackers: list[str] = Field(
        [], description="where the metrics.jsonl rows also go, each a registered tracker (kgc/training/trackers.py; a "
                        "plugin's too): tensorboard (RUN/tensorboard), mlflow ($MLFLOW_TRACKING_URI or RUN/mlflow), csv "
                        "(RUN/metrics.csv), wandb (offline unless $WANDB_MODE says otherwise, RUN/wandb); all but csv "
                        "optional extras: pip install 'kgc[tensorboard]' / 'kgc[mlflow]' / 'kgc[wandb]'")
    prefetch: Union[bool, Literal["auto"]] = Field(
        "auto", description="build step n+1's inputs (token ids, distinct rows, length groups, pinned memory) in a "
                            "background thread while step n runs (kgc/training/prefetch.py); auto: on a GPU (on 2 CPU "
                            "cores the thread would take a core from the step itself)")
    length_bucket: Union[int, Literal["auto"], None] = Field(
        "auto", description="a batch's distinct texts are encoded in length groups, each padded to its longest "
                            "rounded up to this many tokens (kgc/encoding/inputs.py: little work on padding, a fixed "
                            "set of widths); 0 or null: one group padded to the batch's longest, the path before; "
                            "auto: 8 on a GPU, 0 on a CPU (where it measured no faster, and runs train bit for bit "
                            "as before)")
    compile: bool = Field(False, description="run the encoders of a training step through torch.compile (one graph "
                          "per length-group width; evaluation stays eager). The compile time counts as training "
                          "time; docs/gpu.md says when it pays")
    profile_steps: Optional[int] = Field(
        None, ge=1, description="profile this many training steps with torch.profiler, after 10 steps of warm-up, "
                                "and write RUN/profile.md: the top operators by GPU and by CPU time, the GPU's idle "
                                "share, host-device synchronisations per step (kgc/profiling.py)")
    check_memory: bool = Field(True, description="refuse to start when the estimated memory of a training step "
                               "exceeds what the machine has free (kgc/training/estimate.py); false: warn and go on "
                               "(kgc train --no-memory-check)")

    @model_validator(mode="before")
    @classmethod
    def _one_tracker(cls, data: Any) -> Any:
        """``train.trackers: tensorboard`` (or ``--set train.trackers=tensorboard``) is the list of that one."""
        if isinstance(data, dict) and isinstance(data.get("trackers"), str):
            data = {**data, "trackers": [t.strip() for t in data["trackers"].split(",") if t.strip()]}
        return data

    @field_validator("trackers")
    @classmethod
    def _registered_trackers(cls, names: list[str]) -> list[str]:
        """Each a registered tracker (kgc.registry.TRACKERS: the built-in ones and plugins')."""
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ValueError(f"unknown tracker {unknown[0]!r}; registered: {', '.join(TRACKERS)}")
        return names

    @model_validator(mode="after")
    def _threads_positive(self) -> "TrainConfig":
        if isinstance(self.length_bucket, int) and self.length_bucket < 0:
            raise ValueError(f"train.length_bucket={self.length_bucket}: give a token count (8), 0 for none, or auto")
        if isinstance(self.num_threads, int) and self.num_threads < 1:
            raise ValueError(f"train.num_threads={self.num_threads}: give a count of at least 1, or auto")
        if self.schedule == "minutes" and not self.max_minutes:
            raise ValueError("train.schedule=minutes fits the decay to train.max_minutes: set train.max_minutes=N, "
                             "or schedule=steps")
        return self


class EvalConfig(Section):
    batch_size: int = Field(256, ge=1, description="queries (and entity texts) encoded per batch at evaluation")
    dev_queries: Optional[int] = Field(None, ge=1, description="validate on a fixed sample of dev triples")
    validate_every_epoch: bool = Field(True, description="validate on dev after each epoch (best.pt: the best)")
    validate_every_steps: Optional[int] = Field(None, ge=1, description="also validate every N steps")


class ParamRange(Section):
    """One dimension of a ``tune.space``: ``{low, high[, log, step]}`` (an int range when both ends are ints) or
    ``{choices: [...]}``."""
    low: Optional[Union[int, float]] = Field(None, description="the lowest value")
    high: Optional[Union[int, float]] = Field(None, description="the highest value")
    log: bool = Field(False, description="sample on a log scale (low > 0)")
    step: Optional[Union[int, float]] = Field(None, gt=0, description="a grid step")
    choices: Optional[list[Union[bool, int, float, str]]] = Field(None, description="the values to choose from")

    @model_validator(mode="after")
    def _one_kind(self) -> "ParamRange":
        if self.choices is not None:
            if not self.choices or self.low is not None or self.high is not None:
                raise ValueError("give either choices: [...] (not empty) or low and high")
            return self
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"give low < high (got low={self.low}, high={self.high}) or choices: [...]")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got {self.low})")
        return self

    def is_int(self) -> bool:
        return (self.choices is None and isinstance(self.low, int) and isinstance(self.high, int)
                and not isinstance(self.low, bool) and (self.step is None or isinstance(self.step, int)))


class TuneConfig(Section):
    space: dict[str, ParamRange] = Field(
        {}, description="kgc tune's search space: recipe keys (as --set writes them) → {low, high[, log, step]} or "
                        "{choices: [...]}; empty: the conditioner's shipped space (kgc/tune.py)")
    trials: int = Field(20, ge=1, description="kgc tune: finished (complete or pruned) trials the study holds at the end")
    budget: Optional[str] = Field(None, description="each trial's training, the same for all: 'N triples' (the "
                                  "task's unit; 'N pairs' for C-STS), 'N steps' or 'N minutes'; unset: the recipe's")
    reports: int = Field(4, ge=1, description="validations per trial: the dev curve the pruner reads")
    pruner: Literal["median", "halving", "none"] = Field(
        "median", description="stop a trial whose dev figure falls below the median of earlier trials at the same "
                              "step (median) or outside the top of its rung (halving: successive halving)")
    timeout_minutes: Optional[float] = Field(None, gt=0, description="kgc tune starts no trial after this many minutes")
    metric: Optional[str] = Field(None, description="the dev figure a study optimises, in its direction (kgc tune "
                                                    "--metric: dev_mrr, dev_hits_at_10, dev_head_above_gold, "
                                                    "dev_pearson, …); unset: the task's (dev MRR, dev Spearman)")
    sampler: Literal["tpe", "random", "grid", "cmaes"] = Field(
        "tpe", description="how a study draws a trial's values: tpe (Optuna's TPE), random, grid (every point of a "
                           "space of choices and stepped ranges, in random order) or cmaes (CMA-ES: ranges only)")
    stale_after: int = Field(20, ge=4, description="seconds: a running trial whose heartbeat (sent every quarter of "
                                                   "this) is older is taken for killed, marked failed and its values "
                                                   "tried once more")


class Recipe(Section):
    """The sections every task has. A task adds its own (``loss``; link prediction also ``index`` and
    ``structure``) in a subclass it registers (``Task.recipe_class``), and ``model`` is the union of the registered
    conditioners' options (:func:`recipe_type` joins them); :func:`validate_recipe` and :func:`load_recipe` pick
    the class a tree's ``task`` names."""
    model_keys: ClassVar[Optional[type[TaskModelKeys]]] = None  # keys this task adds to every conditioner's model:

    @classmethod
    def member_unions(cls) -> dict[str, tuple[Any, Any]]:
        """Sections of this task's recipe that are unions over a registry, built when the recipe class is
        (:func:`recipe_type`), so a plugin's member is a choice: ``{field: (annotation, FieldInfo)}``."""
        return {}
    version: int = Field(CURRENT, description="the schema this recipe is written for; an older one (no version: 1) "
                                              "is upgraded step by step on loading (kgc/migrations.py)")
    name: str = Field("run", description="the run's name: runs/<name>-<time> by default (a recipe file: its stem)")
    task: str = Field(description="a registered task (`kgc recipes keys --task NAME` lists the keys it reads)")
    data: DataConfig = DataConfig()
    model: ModelConfig = Field(description="the encoder, pooling and conditioner: a union on model.conditioner")
    encoder: EncoderConfig = EncoderConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    tune: TuneConfig = TuneConfig()

    @model_validator(mode="before")
    @classmethod
    def _conditioner_named(cls, data: Any) -> Any:
        """``model.conditioner`` defaults to the registry's default; an unknown one is one message listing all."""
        if not isinstance(data, dict):
            return data
        model = data.get("model")
        if model is None or (isinstance(model, dict) and "conditioner" not in model):
            data = {**data, "model": {"conditioner": CONDITIONERS.default, **(model or {})}}
        name = data["model"].get("conditioner") if isinstance(data["model"], dict) else None
        if isinstance(name, str) and name not in CONDITIONERS:
            raise ValueError(f"model.conditioner {name!r}: unknown conditioner. Available: {', '.join(CONDITIONERS)}")
        return data

    def to_yaml(self) -> str:
        """The fully resolved recipe (every key this task and these members read, with its value)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
