"""Builders both tasks share: encoders from a recipe, the layer cache of frozen layers, backbone files.

The recipe stops here: what these return (encoders, conditioner options) takes plain typed arguments.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from kgc.conditioning.base import Conditioner
from kgc.encoding.backbone import TextEncoder, load_backbone, resolve_backbone
from kgc.recipe import Recipe


def pooling_options(recipe: Recipe) -> dict[str, Any]:
    m = recipe.model
    return {"s2sent_blocks": m.s2sent_blocks, "s2sent_frequencies": m.s2sent_frequencies,
            "s2sent_reduction": m.s2sent_reduction}


def conditioner_options(recipe: Recipe) -> dict[str, Any]:
    """The ``model.*`` options the recipe's conditioner declares."""
    return recipe.model.options()


def build_encoders(recipe: Recipe, backbone_folder: Path, *, pretrained: bool = True,
                   shared: bool = True) -> tuple[TextEncoder, TextEncoder]:
    """(query/sentence tower, tail tower): the same module when ``shared``, else a deep copy."""
    backbone = load_backbone(backbone_folder, weights=pretrained)
    opts = pooling_options(recipe)
    query = TextEncoder(backbone, recipe.model.pooling, **opts)
    tail = query if shared else TextEncoder(copy.deepcopy(backbone), recipe.model.pooling, **opts)
    for encoder in {query, tail}:  # length groups of a batch's distinct rows (kgc.encoding.inputs)
        encoder.length_bucket = recipe.train.length_bucket or None  # auto: resolved by the device it runs on
        encoder.length_cap = recipe.data.max_tokens
    return query, tail


def setup_layer_cache(encoders: list[TextEncoder], conditioner: Conditioner, recipe: Recipe,
                      tokenizer_hash: str, *, texts: Callable[[], list | None] | None = None,
                      training: bool = False, say: Callable[[str], None] | None = None) -> None:
    """Freeze the layers below T - n in every encoder and attach one cache of their outputs.

    Frozen lower layers are identical in every tower (the same pretrained weights, never updated), so
    one cache, keyed by exact token sequence, serves them all. The cache sits at min(T - n, the conditioner's
    ``plain_below``): the router must see the states entering its own layer.

    ``texts`` returns what the cache would store (:class:`~kgc.training.cache_plan.CachedTexts`; None: unknown):
    before the cache exists its size is weighed against what it may hold (:mod:`kgc.training.cache_plan`; in
    ``training`` it saves at every checkpoint, else it keeps every state in memory), and a cache that would
    not fit is not attached, in one line said to ``say`` (``encoder.cache: required``: a KGCError instead).
    """
    n = recipe.encoder.trainable_layers
    if n == "all":
        return
    from kgc.encoding.cache import LayerCache, lower_weights_hash
    from kgc.encoding.layers import check_bert_family, frozen_below

    encoders = list(dict.fromkeys(encoders))
    for enc in encoders:
        check_bert_family(enc.backbone, "encoder.trainable_layers")
        t = enc.frozen_layers = frozen_below(enc.backbone, n)
        enc.train(enc.training)
    layer = min(t, conditioner.plain_below)
    if layer == 0 or not recipe.encoder.cache:
        return
    first = encoders[0]
    model_hash, depth = lower_weights_hash(first.backbone, layer), first.carried(layer)
    stored = texts() if texts is not None else None
    if stored is not None:  # its size, before its first byte
        from kgc.training.cache_plan import decide, plan

        tc = recipe.train
        sized = plan(stored, hidden=first.dim, depth=depth, max_gb=recipe.encoder.cache_max_gb,
                     folder=LayerCache.folder_for(model_hash, layer, depth),
                     between_saves=tc.checkpoint_every * tc.batch_size if training else None)
        if not decide(sized, recipe.encoder.cache, say):
            return
    cache = LayerCache(layer=layer, model_hash=model_hash, tokenizer_hash=tokenizer_hash, hidden=first.dim,
                       depth=depth)
    for enc in encoders:
        enc.cache = cache


class TaskModel(nn.Module):
    """What the training loop asks of a task's model: its encoders (first: the conditioned one), its
    conditioner and tokenizer hash; from them the device and the layer cache of frozen layers."""

    conditioner: Conditioner

    @property
    def encoders(self) -> list[TextEncoder]:
        raise NotImplementedError

    @property
    def tokenizer_hash(self) -> str:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def layer_cache(self):
        return self.encoders[0].cache

    @property
    def precision(self) -> str:
        """What the encoders run in: fp32, bf16 or fp16 (:mod:`kgc.encoding.precision`); a training step's
        autocast too."""
        return getattr(self, "_precision", "fp32")

    def set_precision(self, name: str) -> None:
        self._precision = name
        for enc in self.encoders:
            enc.precision = name

    def hold_weights(self, on: bool = True) -> None:
        """The encoders' weights will not change from here on (a model loaded to answer): in bf16 or fp16, each
        Linear weight is then cast once for every call without gradient, not again at each
        (:func:`kgc.encoding.precision.cast_once`). Training never sets it."""
        for enc in self.encoders:
            enc.weights_held = on

    def set_bf16_stream(self, on: bool) -> None:
        """``train.bf16_stream``: a bf16 CPU training step keeps every encoder's residual stream in bf16
        (:mod:`kgc.encoding.stream`; no effect elsewhere)."""
        from kgc.encoding import stream

        for enc in self.encoders:
            stream.enable(enc.backbone, on)

    def choose_precision(self, recipe: Recipe, *, say: Callable[[str], None] | None = None):
        """The precision this model answers in on this machine (``train.amp``: a probe of the tail tower on a CPU
        with bf16 hardware, cached), set on every encoder and said once; returns the
        :class:`~kgc.encoding.precision.Precision`."""
        from kgc.encoding.precision import inference_precision

        choice = inference_precision(self.encoders[-1], recipe.train.amp, tokens=recipe.data.max_tokens)
        self.set_precision(choice.name)
        self.precision_choice = choice
        if say is not None:
            say(choice.line() if choice.warning is None else f"warning: {choice.warning}")
        return choice

    def save_cache(self) -> None:
        if self.layer_cache is not None:
            self.layer_cache.save()

    def layer_cache_texts(self, recipe: Recipe, examples: int | None) -> list | None:
        """What the layer cache would store over a run of ``recipe`` that trains on ``examples`` examples (None: no
        training), as :class:`~kgc.training.cache_plan.CachedTexts`; None where the task does not say (the cache is
        then not sized)."""
        return None

    def attach_layer_cache(self, recipe: Recipe, *, examples: int | None = None,
                           say: Callable[[str], None] | None = None) -> None:
        """``encoder.trainable_layers``: freeze below T - n, serve the frozen layers from the layer cache, sized
        first (:func:`setup_layer_cache`) for a run of ``examples`` training examples (None: no training)."""
        setup_layer_cache(self.encoders, self.conditioner, recipe, self.tokenizer_hash,
                          texts=lambda: self.layer_cache_texts(recipe, examples), training=examples is not None,
                          say=say)


def save_backbone_files(folder: Path, recipe: Recipe, tokenizer, *, weights: bool = False) -> None:
    """Copy config + tokenizer into the run, so a run needs nothing else; with ``weights`` the pretrained weights
    too (once: the checkpoints then hold only the weights that train, and the frozen ones come from here)."""
    from transformers import AutoConfig

    from kgc.fileio import atomic_dir, ensure_space, write_error

    source = resolve_backbone(recipe.model.backbone)
    backbone = load_backbone(source) if weights else None
    # float32 weights (the source may hold fp16) and the tokenizer's files, checked before the first byte
    needed = (4 * sum(p.numel() for p in backbone.parameters()) if backbone is not None else 0) + (4 << 20)
    target = folder / ("model.safetensors" if weights else "config.json")
    ensure_space(target, needed, f"the run's copy of {recipe.model.backbone}")
    try:  # written beside, renamed into place whole: a failure leaves the folder as it was
        with atomic_dir(folder, replace=True) as tmp:
            if backbone is not None:  # the weights with their config
                backbone.save_pretrained(str(tmp))
            else:
                AutoConfig.from_pretrained(str(source)).save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    except Exception as exc:  # safetensors and transformers say "disk full" their own ways
        error = write_error(target, exc, needed)
        if error is None or error is exc:
            raise
        raise error from None


def freezes_weights(recipe: Recipe, model: nn.Module) -> bool:
    """Whether some of the model's pretrained weights stay as loaded: lower layers under
    ``encoder.trainable_layers`` (frozen when the layer cache is attached) or a tower frozen already."""
    return recipe.encoder.trainable_layers != "all" or any(not p.requires_grad for p in model.parameters())


def count_parameters(*modules) -> tuple[int, int]:
    """(trainable, total) over the distinct parameters of ``modules``."""
    unique = {id(p): p for m in modules for p in m.parameters()}.values()
    return sum(p.numel() for p in unique if p.requires_grad), sum(p.numel() for p in unique)


def pooling_parameters(encoders: list[TextEncoder]) -> int:
    """Parameters the pooling adds (S²Sent's excitation and gates; 0 for mean and cls)."""
    return sum(p.numel() for enc in dict.fromkeys(encoders) for p in enc.pooler.parameters())
