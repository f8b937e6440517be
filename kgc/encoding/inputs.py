"""A padded batch made ready for an encoder on the host: its distinct rows, grouped by length, pinned.

A training step encodes ~3,000 texts of 10–50 tokens. Padded to the batch's longest, a third to a half of the
encoder's work is padding; a batch's repeated texts (UMLS's 135 entities in a batch of 1,024 tails) would be
encoded again. :func:`build_inputs` does, on the CPU and before the step (the prefetch thread,
:mod:`kgc.training.prefetch`), what the device should not wait for:

* the **distinct rows**, found by one 64-bit hash per row and a sort of the hashes (checked row by row against
  the representative, so a collision falls back to an exact ``np.unique``): 0.2 ms for 2,048 rows where
  ``torch.unique(dim=0)`` took 5.8 ms;
* **length groups**: the distinct rows sorted by length, cut into groups whose width is the group's longest row
  rounded up to a multiple of ``bucket`` tokens (at most ``cap``), each padded only to its own width. Groups of
  fewer than ``min_rows`` rows join the next wider one (a kernel over a handful of rows costs a launch and does
  little). Widths come from a small fixed set (8, 16, …, cap), so a compiled encoder (``train.compile``) builds a
  handful of graphs, not one per batch;
* the map back (``inverse``): row i of the batch is row ``inverse[i]`` of the groups' outputs concatenated.

``bucket`` None (``train.length_bucket: 0``) is the path before length groups exactly: one group padded to the
longest, the distinct rows in ``torch.unique``'s order (sorted as tuples; the batch's own order when every row is
distinct), so dropout draws the same masks for the same rows and a run trains bit for bit as it did.

Each row's embedding depends on its own tokens only (padding is masked in attention and pooling), so the grouped
encoding equals the padded one up to float rounding: ``tests/test_step_inputs.py`` checks the loss and every
gradient within 1e-5 in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# odd 64-bit multipliers for the row hash (any fixed odd numbers: a collision is caught by the row check)
_MIX = np.random.default_rng(0x6B6763).integers(1, 2 ** 63 - 1, size=4096, dtype=np.int64) | 1
MIN_ROWS = 32  # a length group smaller than this joins the next wider one
GPU_BUCKET = 8  # train.length_bucket: auto on a GPU (on a CPU: none, one padded group)


def resolve_bucket(bucket: "int | str | None", device_type: str) -> int | None:
    """``train.length_bucket`` for a device: auto is GPU_BUCKET on CUDA and None (one padded group) elsewhere; 0 is
    None."""
    if bucket == "auto":
        return GPU_BUCKET if device_type == "cuda" else None
    if bucket is None:
        return None
    return int(bucket) or None


@dataclass
class EncoderInputs:
    """A batch's distinct rows in length groups (each a dict of ``(rows, width)`` tensors) and ``inverse`` (batch,):
    the row of ``cat(outputs of the groups)`` that each batch row reads. Built on the host; :meth:`to` moves it."""

    groups: list[dict[str, torch.Tensor]]
    inverse: torch.Tensor
    rows: int  # rows of the batch it came from
    padded_tokens: int  # tokens the batch held padded to its longest (the plain path's work)
    dense: list[bool] | None = None  # per group: no padding at all (attention then needs no mask), known on the host

    @property
    def distinct(self) -> int:
        return sum(len(g["input_ids"]) for g in self.groups)

    @property
    def tokens(self) -> int:
        """Token positions the encoder runs over (the groups' rows × their widths)."""
        return sum(g["input_ids"].numel() for g in self.groups)

    @property
    def widths(self) -> list[int]:
        return [int(g["input_ids"].shape[1]) for g in self.groups]

    def pin(self, device: torch.device) -> "EncoderInputs":
        """For a GPU ``device``: the tensors in page-locked memory, so :meth:`to` copies them without the host
        waiting; for any other, as they are."""
        if device.type != "cuda":
            return self
        pin = lambda t: t.pin_memory()  # noqa: E731
        return EncoderInputs([{k: pin(v) for k, v in g.items()} for g in self.groups], pin(self.inverse), self.rows,
                             self.padded_tokens, self.dense)

    def to(self, device: torch.device) -> "EncoderInputs":
        """On ``device``; to a GPU without blocking the host (the kernels that read a tensor wait for its copy on
        their stream)."""
        if all(t.device == device for g in self.groups for t in g.values()):
            return self
        move = (lambda t: t.to(device, non_blocking=t.is_pinned())) if device.type == "cuda" else (  # noqa: E731
            lambda t: t.to(device))
        return EncoderInputs([{k: move(v) for k, v in g.items()} for g in self.groups], move(self.inverse),
                             self.rows, self.padded_tokens, self.dense)


def distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) of the rows of ``key`` (n, w) int64: ``first`` the index of each distinct row's first
    occurrence (in the order of their hashes), ``inverse[i]`` the distinct row of row i. Exact: each row is compared
    with its representative, and a hash collision falls back to ``np.unique(axis=0)``."""
    n, w = key.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    mix = _MIX[:w] if w <= len(_MIX) else np.resize(_MIX, w)
    with np.errstate(over="ignore"):
        h = (key * mix).sum(1)  # wraps modulo 2^64: a hash, not a number
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    if not np.array_equal(key[first][inverse], key):  # two different rows with one hash: the exact way
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)


def group_widths(lengths: np.ndarray, bucket: int | None, cap: int, min_rows: int = MIN_ROWS) -> list[tuple[int, int]]:
    """For ``lengths`` sorted ascending: ``[(end, width), …]``, the groups ``[previous end, end)`` and the width
    each is padded to. ``bucket`` None or 0: one group at the longest length (the plain path; any order)."""
    n = len(lengths)
    if n == 0:
        return []
    longest = int(lengths.max())
    if not bucket:
        return [(n, longest)]
    cap = max(cap, longest)
    rounded = np.minimum(-(-lengths // bucket) * bucket, cap)  # (n,) each row's width, ascending
    ends = np.flatnonzero(np.diff(rounded)) + 1  # where the width changes
    bounds = [(int(e), int(rounded[e - 1])) for e in ends] + [(n, int(rounded[-1]))]
    groups: list[tuple[int, int]] = []
    start = 0
    for end, width in bounds:
        if end - start >= min_rows or end == n:
            if end - start < min_rows and groups:  # the last, small: widen the previous group to take it
                groups[-1] = (end, width)
            else:
                groups.append((end, width))
            start = end
    return groups


def build_inputs(batch: dict[str, torch.Tensor], *, bucket: int | None = 8, cap: int | None = None,
                 min_rows: int = MIN_ROWS, dedupe: bool = True) -> EncoderInputs:
    """``batch`` (CPU tensors: ``input_ids``, ``attention_mask``, ``token_type_ids``, optional ``pool_mask`` …, all
    (batch, len)) as :class:`EncoderInputs`: distinct rows (``dedupe``; rows equal in ids, token types and pool mask),
    in length groups of widths rounded up to ``bucket`` (None: one group, padded to the longest), at most ``cap``
    (default the batch's width)."""
    ids = batch["input_ids"]
    n, width = ids.shape
    lengths_all = batch["attention_mask"].sum(1).numpy()
    if dedupe and n > 1:
        parts = [batch["input_ids"], batch.get("token_type_ids")] + ([batch["pool_mask"]] if "pool_mask" in batch
                                                                     else [])
        key = np.concatenate([p.numpy().astype(np.int64, copy=False) for p in parts if p is not None], axis=1)
        first, inverse = distinct_rows(key)
    else:
        first, inverse = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    lengths = lengths_all[first]
    if bucket:
        order = np.argsort(lengths, kind="stable")  # distinct rows by length
    elif len(first) < n:  # one group in torch.unique's order (the rows sorted as tuples): the path before, exactly
        order = np.lexsort(key[first].T[::-1])
    else:  # every row distinct: the batch's own order, as before
        order = np.argsort(first, kind="stable")
    rows = first[order]  # batch rows, one per distinct text, shortest first
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))  # distinct row → its place in the groups' concatenation
    groups, dense, start = [], [], 0
    sorted_lengths = lengths[order]
    for end, w in group_widths(sorted_lengths, bucket, cap or width, min_rows):
        dense.append(bool((sorted_lengths[start:end] == w).all()))
        take = torch.from_numpy(rows[start:end])
        group = {}
        for k, v in batch.items():
            part = v.index_select(0, take)
            if part.shape[1] >= w:
                part = part[:, :w]
            else:  # wider than the batch (one of the fixed widths): zeros, masked out like any padding
                part = torch.nn.functional.pad(part, (0, w - part.shape[1]))
            group[k] = part.contiguous()
        groups.append(group)
        start = end
    return EncoderInputs(groups, torch.from_numpy(position[inverse]), n, int(n * width), dense)
