"""On-disk cache of a frozen encoder's hidden states at layer t, keyed by the exact token sequence.

With ``encoder.trainable_layers: n`` everything below layer t = T − n is frozen, so the states a text
reaches at layer t never change: they are computed once (fp16), kept in memory until the next save (each
checkpoint), then read from the memory-mapped segment they were saved as under
``$KGC_CACHE_HOME/layers/<model-hash>-L<t>/``, which later runs with the same backbone reuse. The folder name
carries the hash of the frozen weights and t; ``meta.json`` records model hash, layer, tokenizer hash and hidden
size, and a folder whose metadata does not match is rebuilt rather than trusted. Lookups are by (token ids, token
types), so a hit is always the state of exactly that input — neighbour-excluded training texts included.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from kgc.fileio import cache_home, write_json, write_npy
from kgc.profiling import section


def lower_weights_hash(backbone: nn.Module, layer: int) -> str:
    """sha256 of the embeddings and layers [0, layer) — everything the cached states depend on."""
    h = hashlib.sha256()
    modules = [("embeddings", backbone.embeddings)] + [(f"layer{i}", backbone.encoder.layer[i]) for i in range(layer)]
    for prefix, module in modules:
        for name, tensor in sorted(module.state_dict().items()):
            h.update(f"{prefix}.{name}".encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# what one stored token sequence of n tokens costs (kgc/training/cache_plan.py sizes the cache from these):
BYTES_PER_VALUE = 2  # its states, n × depth × hidden values in fp16 (memory until the next save, then disk, mapped)
DISK_BYTES_PER_TOKEN = 8  # its token ids and types (int32 each) in the segment's tokens.npy
DISK_BYTES_PER_SEQUENCE = 8  # its offset (int64) in offsets.npy
# the lookup index held in the process for every stored sequence: the key (5 bytes a token: int32 id + int8 type)
# and, per sequence, the key's bytes object, the dict slot and the array (a memory-mapped view once saved):
# measured with tracemalloc on 20,000 sequences of 10-50 tokens reloaded from a saved segment, 576 B + 5 B a token
INDEX_BYTES_PER_TOKEN = 5
INDEX_BYTES_PER_SEQUENCE = 600


def state_bytes(tokens: int, *, depth: int, hidden: int) -> int:
    """Bytes of the states of ``tokens`` tokens (summed over the sequences): :attr:`LayerCache.nbytes` once they are
    stored."""
    return int(tokens) * depth * hidden * BYTES_PER_VALUE


def _key(ids: torch.Tensor | np.ndarray, types: torch.Tensor | np.ndarray) -> bytes:
    """The lookup key of one token sequence: its ids (int32) and token types (int8), as bytes."""
    return np.asarray(ids).astype(np.int32).tobytes() + b"|" + np.asarray(types).astype(np.int8).tobytes()


class LayerCache:
    """Hidden states (len, depth, hidden) in fp16 per token sequence, at one layer of one frozen encoder.

    ``depth`` K is what a split at this layer carries (:meth:`TextEncoder.carried`): the state entering
    the layer, preceded by the lower layer outputs a multi-block pooling (S²Sent) reads.
    """

    def __init__(self, *, layer: int, model_hash: str, tokenizer_hash: str, hidden: int, depth: int = 1,
                 folder: Path | None = None) -> None:
        self.layer, self.hidden, self.depth = layer, hidden, depth
        self.meta = {"model_sha256": model_hash, "layer": layer, "tokenizer_sha256": tokenizer_hash,
                     "hidden": hidden, "depth": depth, "dtype": "float16"}
        self.folder = folder if folder is not None else self.folder_for(model_hash, layer, depth)
        self.states: dict[bytes, np.ndarray] = {}  # key → (len, depth, hidden) fp16 (memmap rows or fresh arrays)
        self.fresh: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ids, types, states) not yet saved
        self.hits = self.misses = 0
        # False: misses are computed (and rounded to fp16, as stored states are) but not kept — a long-lived
        # server answering ever new texts must not grow without bound; the states loaded from disk still hit
        self.store = True
        self._load()

    @staticmethod
    def folder_for(model_hash: str, layer: int, depth: int = 1) -> Path:
        """The folder under ``$KGC_CACHE_HOME`` of the states of these frozen weights at ``layer``."""
        return cache_home() / "layers" / (f"{model_hash[:16]}-L{layer}" + (f"-K{depth}" if depth > 1 else ""))

    # ---------------------------------------------------------------- persistence
    def _load(self) -> None:
        meta_file = self.folder / "meta.json"
        if not meta_file.is_file():
            return
        meta = json.loads(meta_file.read_text())
        if any(meta.get(k) != v for k, v in self.meta.items()):
            shutil.rmtree(self.folder)  # stale: built from other weights/tokenizer/layer
            return
        for seg in meta.get("segments", []):
            states = np.load(self.folder / f"{seg}.states.npy", mmap_mode="r")
            tokens = np.load(self.folder / f"{seg}.tokens.npy")
            offsets = np.load(self.folder / f"{seg}.offsets.npy")
            for a, b in zip(offsets[:-1], offsets[1:]):
                self.states[_key(tokens[a:b, 0], tokens[a:b, 1])] = states[a:b]

    def save(self) -> None:
        """Write the states computed since the last save as one new segment (atomically), then meta.json."""
        if not self.fresh:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        meta_file = self.folder / "meta.json"
        segments = json.loads(meta_file.read_text()).get("segments", []) if meta_file.is_file() else []
        seg = f"seg{len(segments):05d}-{os.getpid()}"
        lengths = [len(ids) for ids, _, _ in self.fresh]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.concatenate([np.stack([ids, types], 1) for ids, types, _ in self.fresh]).astype(np.int32)
        states = np.concatenate([s for _, _, s in self.fresh]).astype(np.float16)
        for name, arr in (("states", states), ("tokens", tokens), ("offsets", offsets)):
            write_npy(self.folder / f"{seg}.{name}.npy", arr)
        write_json(meta_file, {**self.meta, "segments": segments + [seg]})
        # from now on read from the segment, as a later run would: its pages are the page cache's to keep or drop,
        # so the process holds in its own memory only what was computed since the last save (a 90-minute
        # FB15k-237 laptop run grew past 19 GB resident, and toward the machine's 24, while it kept them all)
        mapped = np.load(self.folder / f"{seg}.states.npy", mmap_mode="r")
        for (ids, types, _), a, b in zip(self.fresh, offsets[:-1], offsets[1:]):
            if (key := _key(ids, types)) in self.states:
                self.states[key] = mapped[a:b]
        self.fresh = []

    @property
    def nbytes(self) -> int:
        return int(sum(s.nbytes for s in self.states.values()))

    # ---------------------------------------------------------------- lookups
    def lookup(self, batch: dict[str, torch.Tensor], compute: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        """(batch, len, depth, hidden) float32 states of the padded ``batch``; misses go through ``compute``."""
        with section("layer cache lookup (misses computed)"):
            return self._lookup(batch, compute)

    def _lookup(self, batch: dict[str, torch.Tensor],
                compute: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        ids, mask, types = (batch[k].cpu() for k in ("input_ids", "attention_mask", "token_type_ids"))
        lengths = mask.sum(1).tolist()
        keys = [_key(ids[i, :n], types[i, :n]) for i, n in enumerate(lengths)]
        first: dict[bytes, int] = {}  # each missing sequence once, at its first row
        for i, k in enumerate(keys):
            if k not in self.states:
                first.setdefault(k, i)
        todo = list(first.values())
        computed: dict[bytes, np.ndarray] = {}
        self.misses += len(todo)
        self.hits += len(keys) - len(todo)
        if todo:
            idx = torch.tensor(todo)
            width = max(lengths[i] for i in todo)
            sub = {k: v[idx.to(v.device), :width] for k, v in batch.items()}
            with torch.no_grad():
                out = compute(sub).float().cpu().numpy().astype(np.float16)  # (misses, width, depth, hidden)
            for row, i in enumerate(todo):
                n = lengths[i]
                computed[keys[i]] = out[row, :n]
                if self.store:
                    self.states[keys[i]] = out[row, :n]
                    self.fresh.append((ids[i, :n].numpy(), types[i, :n].numpy(), out[row, :n]))
        result = torch.zeros(len(keys), ids.shape[1], self.depth, self.hidden)
        for i, (k, n) in enumerate(zip(keys, lengths)):
            state = computed[k] if k in computed else self.states[k]
            result[i, :n] = torch.from_numpy(np.asarray(state, dtype=np.float32))
        return result.to(batch["input_ids"].device)
