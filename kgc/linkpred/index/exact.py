"""The exact searches of kgc's entity index: :class:`ExactIndex` (the ``flat`` type: the unit rows as one torch
tensor, searched by one matrix product and a top k, on the GPU when there is one; no FAISS) and
:class:`RescoredIndex` (an approximate FAISS index whose candidates are re-scored exactly against the entity table,
memory-mapped: ``ivfpq`` with ``rescore`` > 1). :mod:`kgc.linkpred.index.types` builds, loads and searches them
as it does the FAISS types."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from kgc.errors import KGCError

if TYPE_CHECKING:
    import torch


class ExactIndex:
    """The flat index without FAISS: ``table`` (entities, dim) unit rows as one float32 torch tensor, on ``device``
    (a torch device; default: where the tensor is), searched by one matrix product per block of queries and a top
    k. What FAISS's ``IndexFlatIP`` returns — the same entities and cosines, up to float rounding (near-ties may swap) — with the
    attributes kgc reads of a FAISS index (``d``, ``ntotal``, ``is_trained``, ``add``, ``search``). Measured on 2
    cores over WN18RR's 40,943 × 384 table, FAISS's flat search took 24 / 46 ms for 16 / 32 queries, one torch
    product 12 / 16 ms (1–4 queries: FAISS 5.4–6.1 ms, torch 6.5–10.5)."""

    BLOCK_SCORES = 1 << 24  # scores held at once per block of queries (64 MiB of float32)
    is_trained = True

    def __init__(self, table: np.ndarray | torch.Tensor, device: str | torch.device | None = None) -> None:
        import torch

        if isinstance(table, np.ndarray):  # shares the array's memory: a memory-mapped entities.npy stays mapped
            table = np.ascontiguousarray(table, dtype=np.float32)
            with warnings.catch_warnings():  # a read-only map: torch warns that writes would reach it; none do
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                table = torch.from_numpy(table)
        self.table = table.float() if device is None else table.float().to(device)  # (entities, dim)

    @property
    def d(self) -> int:
        return int(self.table.shape[1])

    @property
    def ntotal(self) -> int:
        return int(self.table.shape[0])

    @property
    def device(self) -> torch.device:
        return self.table.device

    def to(self, device: str | torch.device) -> "ExactIndex":
        return ExactIndex(self.table, device)

    def add(self, vectors: np.ndarray) -> None:
        import torch

        new = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)  # (new, dim)
        self.table = torch.cat([self.table, new])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)``, both (queries, k), best first; ``queries`` (queries, dim) unit rows, k ≤ ntotal."""
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)  # (queries, dim)
        rows = max(1, self.BLOCK_SCORES // max(1, self.ntotal))
        scores, ids = [], []
        with torch.no_grad():
            for start in range(0, len(q), rows):
                s, i = _topk(q[start: start + rows] @ self.table.T, k)  # (rows, k) each
                scores.append(s)
                ids.append(i)
        if not scores:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        return torch.cat(scores).cpu().numpy(), torch.cat(ids).cpu().numpy().astype(np.int64)


SPLIT_TOPK = 1 << 20  # a row of more scores is cut into pieces for its top k (torch's top k of one row is one thread)
_PIECES = 256


def _topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(scores, k, dim=1)``; a row of more than :data:`SPLIT_TOPK` scores is cut into pieces whose top k
    are taken in parallel, then the top k of those (the same values; measured on 2 cores at 5M scores: 65 → 30 ms)."""
    import torch

    rows, n = scores.shape
    if n <= SPLIT_TOPK or k > n // _PIECES:
        return torch.topk(scores, k, dim=1)
    width = n // _PIECES  # pieces of equal width (a view of one row, no copy), the rest beside them
    s, i = torch.topk(scores[:, : _PIECES * width].reshape(rows * _PIECES, width), k, dim=1)  # (rows · pieces, k)
    i = (i + (torch.arange(_PIECES, device=scores.device) * width).repeat(rows)[:, None]).view(rows, _PIECES * k)
    s = s.view(rows, _PIECES * k)
    if n > _PIECES * width:
        rest_s, rest_i = torch.topk(scores[:, _PIECES * width:], min(k, n - _PIECES * width), dim=1)
        s, i = torch.cat([s, rest_s], dim=1), torch.cat([i, rest_i + _PIECES * width], dim=1)
    s, j = torch.topk(s, k, dim=1)
    return s, torch.gather(i, 1, j)


class RescoredIndex:
    """An ivfpq index searched with exact re-scoring: ``index`` (the FAISS index) proposes ``k × factor``
    candidates per query, which are scored against ``table`` (entities, dim) — the index's ``entities.npy``,
    memory-mapped, so only the rows of the candidates are read — and the top k by exact cosine are returned.
    RAM holds the PQ codes, inverted lists and ids (about pq_bytes + 8 bytes per entity), not the 4·dim bytes per
    entity of the table (FAISS's IndexRefineFlat would). The attributes kgc reads of a FAISS index (``d``,
    ``ntotal``, ``is_trained``, ``search``); :func:`search_index` searches it like any other."""

    BLOCK_BYTES = 1 << 26  # candidate rows gathered at once per block of queries (64 MiB of float32)
    is_trained = True

    def __init__(self, index, table: np.ndarray, factor: int) -> None:
        if table.shape != (index.ntotal, index.d):
            raise KGCError(f"the entity table is {table.shape[0]} × {table.shape[1]}, the index holds "
                           f"{index.ntotal} vectors of dim {index.d}")
        self.index, self.table, self.factor = index, table, int(factor)

    @property
    def d(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def candidates(self, k: int) -> int:
        """Candidates fetched from the PQ index for ``k`` answers (a FAISS GPU index returns at most 2048)."""
        c = min(self.ntotal, k * self.factor)
        return max(k, min(c, 2048)) if type(self.index).__name__.startswith("Gpu") else c  # a FAISS GPU index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)``, both (queries, k), best first by exact cosine; ``queries`` (queries, dim) unit rows.
        A query the PQ index found fewer than k entities for has id -1 (score -inf) in the rest."""
        _, cand = self.index.search(queries, self.candidates(k))  # (queries, candidates), -1 where none
        exact = np.empty(cand.shape, np.float32)  # (queries, candidates)
        rows = max(1, self.BLOCK_BYTES // max(1, 4 * cand.shape[1] * self.d))
        for s in range(0, len(cand), rows):
            vectors = self.table[np.maximum(cand[s: s + rows], 0)]  # (block, candidates, dim): the rows read
            exact[s: s + rows] = np.einsum("bd,bcd->bc", queries[s: s + rows], vectors)
        exact[cand < 0] = -np.inf
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]  # (queries, k)
        return np.take_along_axis(exact, order, 1), np.take_along_axis(cand, order, 1).astype(np.int64)


def with_rescore(index, table: np.ndarray | None, params: dict):
    """``index`` searched as ``params`` say: a :class:`RescoredIndex` over ``table`` when ``params["rescore"]`` is
    above 1 (ivfpq), else ``index`` itself. An ivfpq whose meta.json predates ``rescore`` is searched without it."""
    factor = params.get("rescore") or 1
    if factor <= 1 or table is None:
        return index
    return RescoredIndex(index, table, factor)
