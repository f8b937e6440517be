"""Run a BERT-family encoder in pieces: embeddings, layers [a, b), pooling.

The conditioning core caches everything below the layer where the condition enters, so the encoder
must be callable from any layer. BERT, RoBERTa and MiniLM share the structure used here
(``embeddings``, ``encoder.layer[i].attention.self.{query,key,value}``); anything else fails with a
clear message.
"""

from __future__ import annotations

import torch
from torch import nn

from kgc.encoding.stream import to_stream
from kgc.errors import KGCError


def check_bert_family(backbone: nn.Module, what: str) -> None:
    ok = hasattr(backbone, "embeddings") and hasattr(backbone, "encoder") and hasattr(backbone.encoder, "layer")
    if ok:
        att = getattr(backbone.encoder.layer[0], "attention", None)
        ok = att is not None and all(hasattr(getattr(att, "self", None), p) for p in ("query", "key", "value"))
    if not ok:
        raise KGCError(f"{what} needs a BERT-family encoder (BERT, RoBERTa, MiniLM); "
                       f"{type(backbone).__name__} has another layout. Use model.conditioner=biencoder.")


def num_layers(backbone: nn.Module) -> int:
    return len(backbone.encoder.layer)


def extended_mask(backbone: nn.Module, attention_mask: torch.Tensor, *, dtype: torch.dtype = torch.float32,
                  hidden: torch.Tensor | None = None, padded: bool | None = None):
    """The (batch, len) 0/1 attention mask in the 4-d form the backbone's attention implementation reads: for SDPA
    (and :mod:`kgc.encoding.dropout`'s) a boolean (batch, 1, len, len) mask (True: attend; None on a CPU when nothing is padded, as Hugging Face does), for
    eager attention an additive one (0 or the dtype's minimum).

    Built here rather than by ``transformers.masking_utils.create_bidirectional_mask``, which asks ``mask.all()`` to
    drop a mask without padding: on a GPU that reads a value back, so the host waits for the device before every
    attention (a 4-d mask is passed through as it is). Other implementations get Hugging Face's builder. ``padded``:
    whether the batch has padding, when the caller knows (then nothing is asked of the mask)."""
    from kgc.encoding.dropout import is_sdpa

    how = getattr(backbone.config, "_attn_implementation", None) or "eager"
    keep = attention_mask.bool()[:, None, None, :]
    if is_sdpa(how):  # no padding: no mask (SDPA's fastest kernel), asked only where asking does not wait (a CPU)
        if padded is None and attention_mask.device.type == "cpu" and bool(attention_mask.all()):
            return None
        length = attention_mask.shape[1]  # (batch, 1, len, len) as Hugging Face makes it: SDPA picks the same kernel
        return keep.expand(-1, -1, length, -1).contiguous()
    if how == "eager":
        zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
        return torch.where(keep, zero, torch.finfo(dtype).min)
    from transformers.masking_utils import create_bidirectional_mask

    embeds = hidden if hidden is not None else torch.zeros(*attention_mask.shape, 1, dtype=dtype,
                                                           device=attention_mask.device)
    return create_bidirectional_mask(config=backbone.config, inputs_embeds=embeds, attention_mask=attention_mask)


def embed(backbone: nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, len) ids → (batch, len, hidden) layer-0 input."""
    if token_type_ids is not None and getattr(backbone.config, "type_vocab_size", 0) <= 1:
        token_type_ids = None
    return backbone.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)


def run_layers(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int,
               end: int | None = None, *, collect: bool = False):
    """Apply layers ``[start, end)`` to ``hidden`` (batch, len, hidden); ``attention_mask`` (batch, len) of 0/1.

    Returns the last state, or with ``collect`` the list of every layer's output (``end - start`` of them).
    """
    layers = backbone.encoder.layer
    end = len(layers) if end is None else end
    outs: list[torch.Tensor] = []
    if start < end:
        hidden = to_stream(hidden, backbone)  # bf16 from here on where train.bf16_stream says (kgc.encoding.stream)
        mask = extended_mask(backbone, attention_mask, dtype=hidden.dtype, hidden=hidden)
        for layer in layers[start:end]:
            out = layer(hidden, mask)
            hidden = out[0] if isinstance(out, tuple) else out
            outs.append(hidden)
    return outs if collect else hidden


def frozen_below(backbone: nn.Module, trainable_layers: int | str) -> int:
    """Freeze embeddings and layers below T - n; return t = T - n (0 when everything trains)."""
    total = num_layers(backbone)
    n = total if trainable_layers == "all" else int(trainable_layers)
    if not 0 <= n <= total:
        raise KGCError(f"encoder.trainable_layers={trainable_layers}: choose 0..{total} or 'all'")
    t = total - n
    if t > 0:
        for p in backbone.embeddings.parameters():
            p.requires_grad_(False)
        for layer in backbone.encoder.layer[:t]:
            for p in layer.parameters():
                p.requires_grad_(False)
    return t
