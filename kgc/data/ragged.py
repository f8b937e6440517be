"""Lists of integer lists as two flat arrays: millions of token-id lists and neighbour lists without a Python object
per number.

A list of 5 million lists of about 20 token ids costs some 4 GB as Python ints and lists, and minutes to build,
hash or sort. :class:`Ragged` holds the same as ``values`` (every list's items, one after another) and ``offsets``
(list ``i`` is ``values[offsets[i]:offsets[i + 1]]``): 4 bytes per item and 8 per list, built from the tokenizer's
output chunk by chunk, sliced by NumPy, memory-mapped from disk where it is large. It is a read-only
``Sequence[list[int]]``, so code written for lists of lists reads it unchanged; the hot paths use ``lengths``,
:meth:`take` and the arrays themselves.
"""

from __future__ import annotations

from itertools import chain
from typing import Iterable, Iterator, Sequence, overload

import numpy as np


class Ragged(Sequence):
    """``len(self)`` lists of ints; ``self[i]`` is list ``i`` as a Python list."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError("Ragged: offsets must start at 0 and end at len(values)")
        self.values, self.offsets = values, offsets

    @classmethod
    def from_lists(cls, lists: Iterable[Sequence[int]], dtype=np.int32) -> "Ragged":
        lists = lists if isinstance(lists, list) else list(lists)
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        values = np.fromiter(chain.from_iterable(lists), dtype=dtype, count=int(lengths.sum()))
        return cls(values, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> "Ragged":
        return cls(values, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))

    @classmethod
    def concat(cls, parts: Sequence["Ragged"]) -> "Ragged":
        if not parts:
            return cls.from_lists([])
        values = np.concatenate([p.values for p in parts])
        return cls.from_lengths(values, np.concatenate([p.lengths for p in parts]))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def lengths_of(self, rows: np.ndarray) -> np.ndarray:
        """``self.lengths[rows]`` without the difference of every offset (a batch of 256 rows of a 5M-row Ragged:
        microseconds instead of 15 ms)."""
        rows = np.asarray(rows, dtype=np.int64)
        return self.offsets[rows + 1] - self.offsets[rows]

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> list[int]: ...

    @overload
    def __getitem__(self, i: slice) -> "Ragged": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.values[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        values, offsets = self.values, self.offsets.tolist()
        for a, b in zip(offsets[:-1], offsets[1:]):
            yield values[a:b].tolist()

    def __add__(self, other: "Ragged") -> "Ragged":
        return Ragged.concat([self, other])

    def __eq__(self, other) -> bool:
        if isinstance(other, Ragged):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.values, other.values)
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def take(self, rows: np.ndarray) -> "Ragged":
        """The lists ``rows`` (any order, repeats allowed), as one Ragged."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.offsets[rows], self.lengths_of(rows)
        return Ragged.from_lengths(self.values[spans(starts, lengths)], lengths)

    def head(self, k: int) -> "Ragged":
        """Each list cut to its first ``k`` items."""
        lengths = np.minimum(self.lengths, k)
        return Ragged.from_lengths(self.values[spans(self.offsets[:-1], lengths)], lengths)

    def row_of(self) -> np.ndarray:
        """(len(values),) the list each value belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``[starts[i], starts[i] + lengths[i])``, without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    # position p within the output belongs to run r; its index is starts[r] + (p - ends[r] + lengths[r])
    run_start = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return run_start + np.arange(total, dtype=np.int64)


def unique_sorted(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of a 1-d array by one sort and a mask (NumPy 2.4's hash-based unique took 27.6 s on 20M int64
    here, this 0.33 s)."""
    a = np.sort(np.asarray(a).ravel())
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def searchsorted(sorted_array: np.ndarray, values: np.ndarray, side: str = "left") -> np.ndarray:
    """``np.searchsorted(sorted_array, values, side)`` with ``values`` searched in sorted order (the bounds carry
    over: 1.5 s instead of 34.8 s for 20M random needles here), returned in their own order."""
    values = np.asarray(values)
    if values.ndim != 1 or len(values) < 1024:
        return np.searchsorted(sorted_array, values, side)
    order = np.argsort(values, kind="stable")
    out = np.empty(len(values), dtype=np.int64)
    out[order] = np.searchsorted(sorted_array, values[order], side)
    return out
