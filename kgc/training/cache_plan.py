"""How large the layer cache of frozen layers would grow, said before its first byte is written, and whether it is kept.

:class:`~kgc.encoding.cache.LayerCache` keeps, for every distinct token sequence of n tokens that reaches the frozen
layers, its states at the cache's layer: n × K × H values in fp16 (K its depth, H the hidden size). They are held in
the process's memory until the next save (each checkpoint; evaluation never saves, so there they stay for the whole
process), then live in a memory-mapped segment on disk beside their token ids and offsets, where the page cache
keeps what it can; a lookup reads a sequence's contiguous rows, so a cache larger than the memory still serves from
disk. For every stored sequence the process also keeps a lookup key and an array object (``INDEX_BYTES_*`` of
:mod:`kgc.encoding.cache`). For a run that stores S sequences of N tokens in all, H_t of them held at once::

    states = N · K · H · 2 B                        (= LayerCache.nbytes once every sequence is stored)
    memory = c · H_t · K · H · 2 B  +  N · 5 B + S · 600 B     (c = SAVE_COPIES in training, 1 at evaluation)
    disk   = states + N · 8 B + S · 8 B             (training only: evaluation writes nothing)

What a run stores (:meth:`kgc.training.setup.TaskModel.layer_cache_texts`, link prediction's answer): every entity's
text once (the tail tower, the entity table, evaluation), one query-tower sequence per training example — at most one
per train direction, since the same head, relation and left-out neighbour make the same sequence — and dev/test's,
and each relation's text where the conditioner encodes conditions apart; with the special tokens, at most
``data.max_tokens``. Held at once in training: every entity text (the table's pass, or a validation, stores them all
before the next save) and the other sequences of ``train.checkpoint_every`` steps.

What fits: the memory part within ``encoder.cache_max_gb``, by default CACHE_SHARE of the memory available when the
cache is set up (``MemAvailable``, lower under a cgroup limit; the step itself needs the rest), and the segments
within DISK_SHARE of the free disk under ``$KGC_CACHE_HOME`` (plus what an earlier run with the same frozen weights
already wrote there, which this run reuses).

``encoder.cache`` decides what happens when it does not fit: ``true`` (the default) runs without the cache, saying so
in one line with the numbers — every step then encodes the frozen layers too, the answers the same up to the fp16
rounding the cache applies; ``required`` stops with a :class:`~kgc.errors.KGCError` naming the sizes and the fixes;
``false`` never caches. (``true`` meant "cache" before there was a size to check; recipes and saved runs that say it
keep their meaning wherever the cache fits.) At Wikidata5M's 4.6M entities the entity texts alone hold 4.6M × 50 × 384 × 2 B ≈ 177 GB of
states (all-MiniLM-L6-v2, texts of 50 tokens), every byte of it in memory at once during the entity table's pass
or an evaluation.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kgc.encoding.cache import (DISK_BYTES_PER_SEQUENCE, DISK_BYTES_PER_TOKEN, INDEX_BYTES_PER_SEQUENCE,
                                INDEX_BYTES_PER_TOKEN, state_bytes)
from kgc.errors import KGCError

CACHE_SHARE = 0.5  # of the memory available: the default of encoder.cache_max_gb
DISK_SHARE = 0.9  # of the free disk under $KGC_CACHE_HOME
# copies of the states held at once while a save writes them (the states, their concatenation, its fp16 copy): the
# save's peak measured at about 3.5 times the states on WN18RR's laptop recipe (kgc/training/estimate.py)
SAVE_COPIES = 3.5
GB = 1e9


@dataclass(frozen=True)
class CachedTexts:
    """``count`` token sequences of ``tokens`` tokens on average (special tokens included) that the cache would
    store, described as ``what`` ("entity texts", "query sequences", "relation texts")."""
    what: str
    count: int
    tokens: float

    @property
    def total_tokens(self) -> int:
        return int(round(self.count * self.tokens))


def _gb(n: float) -> str:
    """Bytes in decimal units: ``176.4 GB``, ``3.2 MB``, ``832 B``."""
    for unit, size in (("TB", 1e12), ("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class CachePlan:
    """The cache a run would fill, its bytes, and what it may hold."""
    texts: list[CachedTexts]
    hidden: int
    depth: int
    allowed: int | None  # bytes of memory the cache may take (None: unknown, not checked)
    where: str  # how ``allowed`` was set
    disk_free: int | None = None  # bytes free under $KGC_CACHE_HOME, plus what the cache already wrote there
    between_saves: int | None = None  # training: sequences (other than entity texts) stored between two saves;
    # None: evaluation, where nothing is saved and every state stays in memory

    @property
    def sequences(self) -> int:
        return sum(t.count for t in self.texts)

    @property
    def tokens(self) -> int:
        return sum(t.total_tokens for t in self.texts)

    @property
    def states(self) -> int:
        return state_bytes(self.tokens, depth=self.depth, hidden=self.hidden)

    @property
    def index(self) -> int:
        return self.tokens * INDEX_BYTES_PER_TOKEN + self.sequences * INDEX_BYTES_PER_SEQUENCE

    @property
    def held(self) -> int:
        """Bytes of states in memory at once: all of them at evaluation; in training every entity text and the other
        sequences stored between two saves, SAVE_COPIES times while the save writes them."""
        if self.between_saves is None:
            return self.states
        tokens = sum(t.total_tokens if t.what == "entity texts" else
                     min(t.count, self.between_saves) * t.tokens for t in self.texts)
        return int(SAVE_COPIES * state_bytes(int(tokens), depth=self.depth, hidden=self.hidden))

    @property
    def memory(self) -> int:
        """What the cache takes of the process's memory at most: the states held at once and the lookup index."""
        return self.held + self.index

    @property
    def disk(self) -> int:
        if self.between_saves is None:
            return 0
        return self.states + self.tokens * DISK_BYTES_PER_TOKEN + self.sequences * DISK_BYTES_PER_SEQUENCE

    @property
    def fits_memory(self) -> bool:
        return self.allowed is None or self.memory <= self.allowed

    @property
    def fits_disk(self) -> bool:
        return self.disk_free is None or self.disk <= DISK_SHARE * self.disk_free

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_disk

    def size(self) -> str:
        """``4,594,485 entity texts × 50.0 tokens × 384 × 2 B = 176.4 GB of states``."""
        k = f"{self.depth} × " if self.depth > 1 else ""
        groups = [f"{t.count:,} {t.what} × {t.tokens:.1f} tokens" for t in self.texts if t.count]
        shown = f"({' + '.join(groups)})" if len(groups) > 1 else (groups[0] if groups else "nothing")
        return f"{shown} × {k}{self.hidden} × 2 B = {_gb(self.states)} of states"

    def memory_words(self) -> str:
        """``181.1 GB of it in memory (every state: evaluation saves none; + 3.9 GB of lookup index)``."""
        how = ("every state: evaluation saves none" if self.between_saves is None else
               f"the states between two saves, {SAVE_COPIES:g}× while saving")
        return f"{_gb(self.memory)} of it in memory at once ({how}; + {_gb(self.index)} of lookup index)"

    def limit(self) -> str:
        """Why it does not fit, with the numbers: the memory allowed, the disk, or both."""
        out = []
        if not self.fits_memory:
            out.append(f"more than the {_gb(self.allowed or 0)} allowed ({self.where})")
        if not self.fits_disk:
            out.append(f"and its segments, {_gb(self.disk)}, more than {DISK_SHARE:.0%} of the "
                       f"{_gb(self.disk_free or 0)} free under $KGC_CACHE_HOME")
        return " ".join(out)

    def line(self) -> str:
        """The line a run says: kept within what it may hold, or off and why."""
        if self.fits:
            room = (f"within the {_gb(self.allowed)} allowed ({self.where})" if self.allowed is not None
                    else "memory available unknown")
            return f"layer cache: up to {self.size()}, {self.memory_words()}, {room}"
        return (f"layer cache: would hold {self.size()}, {self.memory_words()}, {self.limit()}; running without it: "
                "every step encodes the frozen layers too (encoder.cache=required would stop instead)")

    def error(self) -> KGCError:
        """The refusal of a recipe that requires the cache (``encoder.cache: required``) when it does not fit."""
        fixes = ["run without it: `--set encoder.cache=true` (off when it does not fit) or `encoder.cache=false`",
                 "train every layer: `--set encoder.trainable_layers=all` (nothing frozen to cache)"]
        if not self.fits_memory:
            need = math.ceil(self.memory / GB * 10) / 10
            fixes.append(f"allow it more: `--set encoder.cache_max_gb={need:g}` on a machine with that much memory "
                         "to spare")
        if not self.fits_disk:
            fixes.append("free disk under $KGC_CACHE_HOME, or point it at a larger disk")
        return KGCError(f"the layer cache would hold {self.size()}, {self.memory_words()}, {self.limit()}, and the "
                        f"recipe requires it (encoder.cache: required). To go on, {'; or '.join(fixes)}. Nothing was "
                        "written.")


def available_for_cache(max_gb: float | None, *, available: int | None = None) -> tuple[int | None, str]:
    """(bytes the cache may hold, how that was set): ``encoder.cache_max_gb``, or CACHE_SHARE of ``available``
    (default: what the host has free now, :func:`kgc.training.estimate.host_available`)."""
    if max_gb is not None:
        return int(max_gb * GB), "encoder.cache_max_gb"
    if available is None:
        from kgc.training.estimate import host_available

        available, how = host_available()
    else:
        how = "given"
    if available is None:
        return None, "memory available unknown"
    return int(CACHE_SHARE * available), (f"encoder.cache_max_gb unset: {CACHE_SHARE:.0%} of the "
                                          f"{_gb(available)} available, {how}")


def disk_free(folder: Path) -> int | None:
    """Free bytes on the file system of ``folder`` (its nearest existing parent), plus the segments already in it
    (a later run reuses them: they need no new room)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return None
    used = sum(f.stat().st_size for f in folder.glob("*.npy")) if folder.is_dir() else 0
    return int(free + used)


def plan(texts: list[CachedTexts], *, hidden: int, depth: int = 1, max_gb: float | None = None,
         available: int | None = None, folder: Path | None = None, between_saves: int | None = None) -> CachePlan:
    """The plan of a cache of ``texts``: ``between_saves`` in training (``train.checkpoint_every`` × batch; None:
    evaluation, nothing saved), ``folder`` where its segments would go (for the disk check)."""
    allowed, where = available_for_cache(max_gb, available=available)
    free = disk_free(folder) if folder is not None and between_saves is not None else None
    return CachePlan(texts=list(texts), hidden=hidden, depth=depth, allowed=allowed, where=where, disk_free=free,
                     between_saves=between_saves)


def decide(p: CachePlan, mode: bool | str, say: Callable[[str], None] | None) -> bool:
    """Whether to keep the cache under ``encoder.cache`` = ``mode``: kept when it fits (said when ``say`` is given);
    else under ``true`` off with :meth:`CachePlan.line` (said to ``say``, else to stderr), under ``required`` its
    KGCError."""
    if p.fits:
        if say is not None:
            say(p.line())
        return True
    if mode == "required":
        raise p.error()
    import sys

    (say or (lambda m: print(m, file=sys.stderr)))(p.line())
    return False
