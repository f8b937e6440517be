"""The entity table encoded in shards, one per process: ``kgc index RUN --nproc N`` on one machine, or
``torchrun … -m kgc index RUN`` across several, each shard resumable after a kill, assembled into one index.

**The same batches as one process.** A one-process build encodes ``bank.length_batches(batch_size)``: the entities
sorted by text length, cut into batches (little padding each). Here that same order is cut into *chunks* of
``chunk_size`` entities (rounded up to whole batches), and rank r of N takes the contiguous run of chunks
``[⌈r·C/N⌉, ⌈(r+1)·C/N⌉)``; a chunk is encoded batch by batch with the tail tower, as
:meth:`~kgc.linkpred.model.LinkPredictor.entity_table` does. So every vector comes out of the very batch it would
in one process, and on the same kind of device the assembled table is the one-process table (a chunk smaller
than a batch, as in the tests, is one batch of its own: the same function on a smaller batch, equal to float
rounding).

**Resume.** Each finished chunk is written atomically (temp file + rename: never half a file) as
``RUN/index/shards/<key>/chunk-<start>-<end>.npy`` (positions in the length order). ``<key>`` hashes the weights,
the entity texts and the batch size, so chunks of other weights or texts are never read (they are removed when a
sharded encoding starts). A rank skips the chunks already there; as the chunks do not depend on N, a run killed
with ``--nproc 4`` resumes under ``--nproc 2`` as well. The work folder lives only until the table is committed,
so chunks there are always those of an interrupted encoding of the same weights and texts: ``--force`` reuses them
too, and re-embeds everything once a build was committed.

**Processes.** The process that runs the command is rank 0. It decides as a one-process ``kgc index`` does
(nothing to do, new search parameters, a stored table to reuse, or a table to encode) and only for the last —
holding the run's lock from then until the commit and the work folder's removal — starts the N − 1 other ranks
(``torch.multiprocessing``, spawn; under ``torchrun`` they exist already and wait), joins them in a gloo group and
broadcasts the job (or None: nothing to encode). Every rank encodes its chunks (on its own GPU, ``cuda:LOCAL_RANK``,
where there are GPUs; else with ``cpus // N`` threads), and reports what it encoded and reused; rank 0 gathers the
reports, assembles the table from the chunks and hands it to :func:`~kgc.linkpred.index.store.build_index` —
``meta.json``, the fingerprint, the file records and the FAISS types are those of a one-process build — then removes
the work folder. The group carries only the job and the reports (the vectors travel as files), so it is gloo even
on GPUs; across nodes the run folder must be on a filesystem every node sees. Only rank 0 writes anything but chunk
files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from kgc.errors import KGCError
from kgc.fileio import run_lock, write_npy
from kgc.training import distributed
from kgc.training.run import RunDir, silent

CHUNK = 4096  # entities per chunk file: what a kill can cost, at most, per rank
SHARDS = "shards"  # RUN/index/shards/<key>/: the chunks of an encoding not yet committed
KILL_ENV = "KGC_SHARD_KILL"  # test hook, "RANK:N": that rank kills itself (SIGKILL) after writing its N-th chunk
TIMEOUT = timedelta(hours=24)  # rank 0 waits this long for the slowest rank (a dead one is noticed at once)


@dataclass(frozen=True)
class Job:
    """What every rank encodes: the run (rank 0's absolute path), the fingerprint the chunks belong to, and the
    cut (batch size, entities per chunk, processes)."""

    run: str
    current: dict
    batch_size: int
    chunk: int
    world: int
    entities: int
    dim: int
    device: str  # rank 0's device type: "cuda" puts every rank on a GPU

    @property
    def key(self) -> str:
        text = f"{self.current['weights_sha256']}\n{self.current['texts_sha256']}\n{self.batch_size}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def folder(self, run: RunDir) -> Path:
        return run.index / SHARDS / self.key

    def ranges(self) -> list[tuple[int, int]]:
        """Every chunk, as (start, end) positions in the length order."""
        return [(s, min(s + self.chunk, self.entities)) for s in range(0, self.entities, self.chunk)]

    def share(self, rank: int) -> list[tuple[int, int]]:
        """Rank ``rank``'s chunks: a contiguous run of them, ``[⌈r·C/N⌉, ⌈(r+1)·C/N⌉)`` (rank 0, which starts first,
        takes the larger share; with fewer chunks than processes the last ranks have none)."""
        ranges = self.ranges()
        return ranges[-(-rank * len(ranges) // self.world): -(-(rank + 1) * len(ranges) // self.world)]


def chunk_entities(chunk_size: int, batch_size: int) -> int:
    """Entities per chunk: ``chunk_size`` rounded up to whole batches (so the batches are one process's)."""
    return chunk_size if chunk_size <= batch_size else -(-chunk_size // batch_size) * batch_size


def threads(local_processes: int) -> int:
    """Threads per rank: the cores this process may use, shared by the ranks of this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_processes))


def _read_chunk(path: Path, rows: int, dim: int) -> np.ndarray | None:
    """A chunk file that holds (rows, dim) float32, else None (absent or not whole)."""
    try:
        part = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):
        return None
    return part if part.shape == (rows, dim) and part.dtype == np.float32 else None


def _maybe_die(rank: int, written: int) -> None:
    spec = os.environ.get(KILL_ENV, "")
    if spec and spec.split(":") == [str(rank), str(written)]:
        os.kill(os.getpid(), signal.SIGKILL)


@torch.no_grad()
def encode_share(model, job: Job, run: RunDir, rank: int, *, progress: bool = False) -> dict:
    """Encode rank ``rank``'s chunks that are not written yet, each written atomically; its report (rank, positions,
    chunks encoded and reused, and ``line``, what ``kgc index`` prints)."""
    from tqdm.auto import tqdm

    order = [e for batch in model.bank.length_batches(job.batch_size) for e in batch]
    folder, mine = job.folder(run), job.share(rank)
    todo = [(s, e) for s, e in mine if _read_chunk(folder / f"chunk-{s}-{e}.npy", e - s, job.dim) is None]
    bar = tqdm(total=sum(e - s for s, e in todo), desc=f"entities (shard {rank + 1}/{job.world})", leave=False) \
        if progress else None  # none at all on the other ranks: tqdm's lock is a semaphore a rank's exit would leak
    for n, (start, end) in enumerate(todo, 1):
        parts = []
        for b in range(start, end, job.batch_size):  # within a chunk, the batches of one process
            idx = order[b: min(b + job.batch_size, end)]
            parts.append(model.encode_tail_inputs(model.bank.entity_inputs(idx)).float().cpu())
            if bar is not None:
                bar.update(len(idx))
        write_npy(folder / f"chunk-{start}-{end}.npy", torch.cat(parts).numpy().astype(np.float32))
        _maybe_die(rank, n)
    if bar is not None:
        bar.close()
    report = {"rank": rank, "world": job.world, "chunks": len(mine), "encoded": len(todo),
              "reused": len(mine) - len(todo), "start": mine[0][0] if mine else None,
              "end": mine[-1][1] if mine else None}
    chunks = len(job.ranges())
    report["line"] = (f"shard {rank + 1}/{job.world}: entities {report['start']}..{report['end'] - 1} (by text "
                      f"length), {_count(report['encoded'], 'chunk')} encoded, {report['reused']} reused" if mine else
                      f"shard {rank + 1}/{job.world}: nothing to encode ({_count(chunks, 'chunk')} for {job.world} "
                      "processes)")
    return report


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def assemble(job: Job, run: RunDir, model) -> np.ndarray:
    """(entities, dim) float32 in entity order, from every chunk (all written by now)."""
    order = np.fromiter((e for batch in model.bank.length_batches(job.batch_size) for e in batch), dtype=np.int64)
    table = np.empty((job.entities, job.dim), dtype=np.float32)
    for start, end in job.ranges():
        path = job.folder(run) / f"chunk-{start}-{end}.npy"
        part = _read_chunk(path, end - start, job.dim)
        if part is None:
            raise KGCError(f"{path}: missing or damaged after every shard finished. Run `kgc index {run.path}` "
                           "again: it encodes that chunk again.")
        table[order[start:end]] = part
    return table


def _rank_model(job: Job, run: RunDir, local: int):
    """The run's model for a rank > 0, on its GPU (``local``'s) when rank 0 runs on one, checked against the job's
    fingerprint (a chunk of other weights or texts is never written)."""
    from kgc.linkpred.index.records import fingerprint
    from kgc.linkpred.answer.predictor import Predictor

    device = torch.device("cpu")
    if job.device == "cuda":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = Predictor(run, device, echo=silent).model()
    current = fingerprint(run, model)
    if any(current[k] != job.current[k] for k in ("weights_sha256", "texts_sha256")):
        raise KGCError(f"{run.path}: its weights or entity texts differ from those rank 0 read; run every rank on "
                       "the same run folder (a filesystem every node sees)")
    return model


def follow_rank(run: RunDir, rank: int, local: int) -> dict | None:
    """A rank > 0 in the group: wait for rank 0's job, encode its chunks, report (None: rank 0 had nothing to
    encode, or stopped before). A failure is reported to rank 0, which says it."""
    try:
        job = distributed.broadcast(None)
        if job is None:
            return None
        try:
            report = encode_share(_rank_model(job, run, local), job, run, rank)
        except Exception as exc:  # said by rank 0, with the rank's name
            report = {"rank": rank, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
        distributed.gather_objects(report)
    except RuntimeError as exc:  # gloo: rank 0 is gone (it failed, and says why, or it was killed)
        raise KGCError(f"shard {rank + 1}: rank 0 stopped ({str(exc).splitlines()[0][:160]}); the chunks written so "
                       "far are kept: run the same command again to resume") from None
    return report


def _child(index: int, store: str, run: str, world: int, cores: int) -> None:
    """A spawned rank (1 … N−1) of ``kgc index --nproc N``: join the group through ``store``, follow rank 0."""
    distributed._die_with_parent()  # rank 0 killed: its ranks go too (it held the lock; they write for it)
    torch.set_num_threads(cores)
    rank = index + 1
    files = dist.FileStore(store, world)
    files.set(f"ready/{rank}", "1")
    dist.init_process_group("gloo", store=files, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        follow_rank(RunDir(run), rank, rank)
    finally:
        dist.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # its work is in its files (fsynced): skip tearing down torch and transformers (a second or more)


class Shards:
    """One sharded ``kgc index`` in this process: rank 0 (:attr:`leads`; :meth:`encode` is its ``build_index``
    hook) or a torchrun rank > 0 (:meth:`follow`). Use as a context manager: on leaving, rank 0 tells waiting ranks
    when there was nothing to encode, removes the work folder after a committed build, lets the run's lock go and
    leaves the group."""

    def __init__(self, run: RunDir, world: int, *, torchrun: bool, chunk_size: int) -> None:
        self.run, self.world, self.torchrun, self.chunk_size = run, world, torchrun, chunk_size
        self.rank = int(os.environ.get("RANK", "0")) if torchrun else 0
        self.leads = self.rank == 0
        self.reports: list[dict] = []
        self._sent = False  # the job (or None) was broadcast
        self._joined = False  # this object made the group (and leaves it)
        self._children: Any = None
        self._tmp: str | None = None
        self._threads = torch.get_num_threads()
        self._stack = contextlib.ExitStack()

    @classmethod
    def open(cls, run: RunDir, nproc: int | None, *, chunk_size: int | None = None) -> "Shards | None":
        """The shards of ``kgc index RUN --nproc N`` (under torchrun: its group, ``nproc`` left out or equal); None
        for one process (``nproc`` None or 1), the path as it always was."""
        if nproc is not None and nproc < 1:
            raise KGCError(f"--nproc {nproc}: give 1 or more processes")
        chunk_size = CHUNK if chunk_size is None else chunk_size
        if chunk_size < 1:
            raise KGCError(f"chunk_size={chunk_size}: give 1 or more entities per chunk")
        if distributed.launched():
            world = int(os.environ["WORLD_SIZE"])
            if nproc is not None and nproc != world:
                raise KGCError(f"--nproc {nproc} under torchrun, whose group has {world} processes: leave --nproc "
                               "out (torchrun's --nnodes and --nproc-per-node decide)")
            return cls(run, world, torchrun=True, chunk_size=chunk_size)
        if nproc is None or nproc == 1:
            return None
        return cls(run, nproc, torchrun=False, chunk_size=chunk_size)

    def __enter__(self) -> "Shards":
        if self.torchrun and not dist.is_initialized():  # every rank joins now; rank 0 says later what to do
            distributed._die_with_parent()
            dist.init_process_group("gloo", timeout=TIMEOUT)
            self._joined = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.leads and self._group() and not self._sent:
                distributed.broadcast(None)  # nothing to encode (or rank 0 failed first): the others stop
            if exc_type is None and self._sent and self.leads:
                shutil.rmtree(self.run.index / SHARDS, ignore_errors=True)  # committed: the chunks are spent
        finally:
            torch.set_num_threads(self._threads)
            if self._joined and dist.is_initialized():
                dist.destroy_process_group()
            self._reap(stop=exc_type is not None)
            self._stack.close()  # the run's lock, held from the first chunk to the work folder's removal

    def _group(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def follow(self) -> dict:
        """A torchrun rank > 0: encode what rank 0 sends; ``{"action": "follow", "why", "meta": None, "shards"}``."""
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.set_num_threads(threads(int(os.environ.get("LOCAL_WORLD_SIZE", self.world))))
        report = follow_rank(self.run, self.rank, local)
        why = "nothing to encode" if report is None else report.get("line", report.get("error", ""))
        return {"action": "follow", "why": why, "meta": None, "shards": [report] if report else []}

    def encode(self, model, batch_size: int, progress: bool) -> np.ndarray:
        """Rank 0, holding the run's lock: the (entities, dim) float32 table, encoded by the group's ranks into
        chunk files (those already written reused), then assembled; :attr:`reports` says who did what."""
        from kgc.linkpred.index.records import fingerprint

        entities = model.bank.graph.num_entities
        if self.world > entities:
            raise KGCError(f"--nproc {self.world}: the graph has {entities} entities; give at most {entities} "
                           "processes")
        current = fingerprint(self.run, model)
        device = next(model.parameters()).device.type
        job = Job(run=str(self.run.path.resolve()), current=current, batch_size=batch_size,
                  chunk=chunk_entities(self.chunk_size, batch_size), world=self.world, entities=entities,
                  dim=model.tail_encoder.dim, device=device)
        self._stack.enter_context(run_lock(self.run.path, "encoding the entities in shards"))
        self._prepare(job.folder(self.run))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) if self.torchrun else self.world
        torch.set_num_threads(threads(local))
        if not self.torchrun:
            self._spawn(job, threads(local))
        distributed.broadcast(job)
        self._sent = True
        mine = encode_share(model, job, self.run, 0, progress=progress)
        try:
            self.reports = distributed.gather_objects(mine)
        except RuntimeError as exc:  # gloo: a rank died (killed, out of memory)
            raise KGCError(f"{self._lost(exc)}. The chunks written so far are kept in {job.folder(self.run)}: run "
                           "the same command again to resume.") from None
        failed = [r for r in self.reports if "error" in r]
        if failed:
            raise KGCError(f"shard {failed[0]['rank'] + 1}/{self.world} failed: {failed[0]['error']}")
        torch.set_num_threads(self._threads)
        return assemble(job, self.run, model)

    def _prepare(self, folder: Path) -> None:
        """The work folder, made; those of other weights, texts or batch sizes removed (never reusable), and the
        temp file of a write a kill cut short."""
        root = folder.parent
        if root.is_dir():
            for old in root.iterdir():
                if old != folder:
                    shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def _spawn(self, job: Job, cores: int) -> None:
        """Start ranks 1 … N−1 and join them in a gloo group as rank 0 (one that dies on starting is said at once,
        not after the group's timeout)."""
        if self._group():
            raise KGCError("this process is in a torch.distributed group already: run `kgc index --nproc N` from a "
                           "fresh process, or the whole command under torchrun")
        import torch.multiprocessing as mp

        self._tmp = tempfile.mkdtemp(prefix="kgc-shards-")
        store = os.path.join(self._tmp, "store")
        files = dist.FileStore(store, self.world)
        self._children = mp.start_processes(_child, args=(store, job.run, self.world, cores), nprocs=self.world - 1,
                                            join=False, start_method="spawn")
        ready = [f"ready/{r}" for r in range(1, self.world)]
        while not files.check(ready):
            dead = [p for p in self._children.processes if p.exitcode not in (None, 0)]
            if dead:
                raise KGCError(f"a shard process could not start (exit code {dead[0].exitcode}); its error is "
                               "printed above")
            time.sleep(0.05)
        dist.init_process_group("gloo", store=files, rank=0, world_size=self.world, timeout=TIMEOUT)
        self._joined = True

    def _lost(self, exc: BaseException) -> str:
        """Which rank stopped, as well as this process can tell."""
        if self._children is not None:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for i, p in enumerate(self._children.processes):
                    if p.exitcode not in (None, 0):
                        how = (f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else
                               f"exited with code {p.exitcode}")
                        return f"shard {i + 2}/{self.world} (pid {p.pid}) {how} before it finished"
                time.sleep(0.05)
        return f"a shard process stopped before it finished ({str(exc).splitlines()[0][:160]})"

    def _reap(self, *, stop: bool) -> None:
        """Wait for the spawned ranks (they end after their report); with ``stop`` (a failure) stop them at once."""
        if self._children is not None:
            for p in self._children.processes:
                p.join(timeout=0 if stop else 30)
                if p.is_alive():
                    p.kill()
                    p.join()
            self._children = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
