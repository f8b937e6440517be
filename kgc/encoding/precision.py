"""The encoders' numeric precision: fp32, or bf16 / fp16 autocast, chosen once per run and per machine.

``train.amp`` decides it for every place an encoder runs (training, the layer cache, entity tables for ``kgc
index`` and evaluation, queries for ``predict`` / ``serve`` / batch files, C-STS):

* ``off``: fp32.
* ``bf16``: bf16 autocast, on CUDA and on a CPU (said once, with a warning where the CPU has no bf16 hardware or
  this machine's probe found bf16 slower).
* ``fp16``: fp16 autocast with a gradient scaler on CUDA; a CPU runs fp32 (said: use bf16 there).
* ``auto``: CUDA: bf16. A CPU: bf16 where it has bf16 hardware (``amx_bf16``, the matrix units, or
  ``avx512_bf16`` in /proc/cpuinfo) *and* a probe of the run's own work — a few steps each way, alternating, so a
  busy machine slows both alike — finds bf16 at least :data:`FASTER` quicker; fp32 otherwise. A probe's timings
  are kept in ``$KGC_CACHE_HOME/precision-probes.json`` by CPU model, flags, torch version, threads and the work's
  shape, so it runs once per machine and shape.

``$KGC_AMP`` (auto, off, bf16, fp16), where set, stands for ``train.amp`` in every run of the process: e.g.
``KGC_AMP=off`` for fp32 everywhere without editing a recipe (the test suite runs so, for figures that do not
depend on the machine).

What autocast leaves in fp32 stays there: the loss, the softmax over every entity, the temperature and the
optimiser's state (as on CUDA); an encoder's outputs leave it as fp32 (:func:`in_precision`), so an index and a
query vector are fp32 whatever the encoder ran in. A run records what it trained and encoded in
(``train_summary.json``'s ``precision``, the index's meta), and a run trained in bf16 loads and answers on a CPU
without bf16 (in fp32: the weights are fp32 either way).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from kgc.errors import KGCError
from kgc.fileio import cache_home, write_json

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bf16 in hardware: the matrix units (AMX), or AVX-512's bf16 dot products
SHOWN_FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "amx_fp16", "avx512_bf16", "avx512_fp16", "avx512f", "avx2")
FASTER = 0.9  # auto takes bf16 when a probe's bf16 time is at most this share of fp32's
PROBE_ROUNDS = 3  # timed calls each way, alternating, after one untimed call each (the median is kept)
PROBE_FILE = "precision-probes.json"
ENV = "KGC_AMP"
AMPS = ("auto", "off", "bf16", "fp16")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, Any]:
    """The CPU's model name and flags (/proc/cpuinfo; elsewhere ``platform.processor()`` and no flags)."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {"model": model, "flags": flags}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return {"model": model, "flags": flags}


def bf16_hardware(flags: frozenset[str] | None = None) -> list[str]:
    """The bf16 flags this CPU reports (empty: none; bf16 would be emulated)."""
    flags = cpu_info()["flags"] if flags is None else flags
    return [f for f in BF16_FLAGS if f in flags]


def describe_cpu() -> str:
    """The CPU's model and the flags that matter here, for a benchmark's heading."""
    info = cpu_info()
    shown = [f for f in SHOWN_FLAGS if f in info["flags"]]
    return f"{info['model']} ({', '.join(shown) or 'no AVX/AMX flags'})"


def autocast(device_type: str, precision: str):
    """A context that runs matrix products in ``precision`` (fp32: nothing)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type, dtype=DTYPES[precision])


def in_precision(method: Callable) -> Callable:
    """A TextEncoder method run under its ``precision`` (autocast on its device), floating outputs back as fp32
    for the caller; inside an autocast already entered (a training step's) it runs as it is, uncast."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        precision = getattr(self, "precision", "fp32")
        if precision == "fp32":
            return method(self, *args, **kwargs)
        device_type = next(self.parameters()).device.type
        if torch.is_autocast_enabled(device_type):
            return method(self, *args, **kwargs)
        with torch.autocast(device_type, dtype=DTYPES[precision]):
            out = method(self, *args, **kwargs)
        return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out

    return wrapped


@dataclass
class Precision:
    """What an encoder runs in (``name``: fp32, bf16 or fp16), why, and the probe's timings when one decided."""
    name: str
    reason: str
    probe: dict | None = None
    warning: str | None = None
    seconds: float = 0.0  # spent probing now (0 when the probe was cached)
    device: str = "cpu"  # the device type it was chosen for

    def line(self) -> str:
        return f"precision: {self.name} ({self.reason})"

    def record(self) -> dict:
        out = {"name": self.name, "reason": self.reason, "cpu": describe_cpu() if self.device == "cpu" else None}
        if self.probe:
            out["probe"] = self.probe
        return out


def probe_key(shape: dict) -> str:
    """The cache key of a probe: this machine (CPU model, flags, torch, threads) and the work's shape."""
    info = cpu_info()
    whole = {"cpu": info["model"], "flags": sorted(f for f in SHOWN_FLAGS if f in info["flags"]),
             "torch": torch.__version__, "threads": torch.get_num_threads(), **shape}
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _probes_file() -> Path:
    return cache_home() / PROBE_FILE


def cached_probe(key: str) -> dict | None:
    try:
        found = json.loads(_probes_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) and {"fp32", "bf16"} <= set(found) else None


def keep_probe(key: str, timings: dict) -> None:
    """Add a probe's timings to the cache file (written whole, atomically; a cache that cannot be written is
    skipped: the next run probes again)."""
    path = _probes_file()
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known[key] = timings
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, known)
    except OSError:
        pass


def time_both(run: Callable[[str], None], rounds: int = PROBE_ROUNDS) -> dict:
    """``run(name)`` for fp32 and bf16: once each untimed (the first call's one-off work), then ``rounds`` times
    each, alternating; the median seconds of each."""
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for name in times:
        run(name)
    for i in range(rounds):
        for name in (("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")):
            start = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - start)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def choose(amp: str, device: torch.device, *, shape: dict | None = None,
           probe: Callable[[str], None] | None = None, flags: frozenset[str] | None = None) -> Precision:
    """The precision ``train.amp`` means on ``device`` (module docstring). ``probe(name)`` runs one unit of the
    work in ``name`` (auto on a CPU with bf16 hardware times it both ways, once per machine and ``shape``);
    without one, auto on such a CPU takes bf16. ``$KGC_AMP`` stands for ``amp`` where set."""
    where = device.type
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in AMPS:
            raise KGCError(f"${ENV}={forced!r}: use one of {', '.join(AMPS)} (or unset it: train.amp decides)")
        amp, said_amp = forced, f"${ENV}={forced}"
    else:
        said_amp = f"train.amp={amp}"
    if amp == "off":
        return Precision("fp32", said_amp, device=where)
    if device.type == "cuda":
        name = "fp16" if amp == "fp16" else "bf16"
        return Precision(name, f"{said_amp} on CUDA", device=where)
    if device.type != "cpu":
        return Precision("fp32", f"{said_amp}: autocast is used on CUDA and CPUs only, not {device.type}",
                         device=where)
    hardware = bf16_hardware(flags)
    if amp == "fp16":
        return Precision("fp32", f"{said_amp}: fp16 is CUDA's; on a CPU use bf16", device=where,
                         warning="train.amp=fp16 on a CPU runs fp32: use train.amp=bf16 (or auto) there")
    timings, spent = None, 0.0
    if hardware and probe is not None:
        key = probe_key(shape or {})
        timings = cached_probe(key)
        if timings is None:
            start = time.perf_counter()
            timings = {**time_both(probe), "shape": shape or {}}
            spent = time.perf_counter() - start
            keep_probe(key, timings)
    shown = {"fp32_s": round(timings["fp32"], 5), "bf16_s": round(timings["bf16"], 5),
             "speedup": round(timings["fp32"] / max(timings["bf16"], 1e-12), 2)} if timings else None
    said = (f"probe: bf16 {shown['speedup']:.2f}x fp32's speed" + (", cached" if not spent else
                                                                    f", {spent:.1f}s") if shown else "")
    if amp == "bf16":
        warning = None
        if not hardware:
            warning = ("train.amp=bf16 on a CPU without bf16 hardware (no amx_bf16 or avx512_bf16 in "
                       "/proc/cpuinfo): bf16 is emulated there and likely slower than fp32 (train.amp=auto chooses)")
        elif shown and shown["speedup"] < 1:
            warning = f"train.amp=bf16: this machine's probe found bf16 slower ({said}); train.amp=auto would choose fp32"
        return Precision("bf16", said_amp + (f"; {said}" if said else ""), shown, warning, spent, where)
    if not hardware:
        return Precision("fp32", f"{said_amp}: this CPU has no bf16 hardware (amx_bf16, avx512_bf16)",
                         device=where)
    if shown is None:
        return Precision("bf16", f"{said_amp}: the CPU has {', '.join(hardware)}", device=where)
    faster = timings["bf16"] <= FASTER * timings["fp32"]
    return Precision("bf16" if faster else "fp32",
                     f"{said_amp}: the CPU has {', '.join(hardware)}; {said}"
                     + ("" if faster else f" (bf16 is taken at {1 / max(FASTER, 1e-9):.2f}x or more)"), shown, None, spent,
                     where)


def encoder_shape(encoder, tokens: int, rows: int) -> dict:
    """What decides an encoder's precision probe: its architecture and the batch it runs."""
    config = encoder.backbone.config
    return {"hidden": int(config.hidden_size), "layers": int(config.num_hidden_layers),
            "intermediate": int(getattr(config, "intermediate_size", 0)),
            "heads": int(getattr(config, "num_attention_heads", 0)), "tokens": int(tokens), "rows": int(rows),
            "pooling": encoder.pooling}


def inference_precision(encoder, amp: str, *, tokens: int, rows: int = 64) -> Precision:
    """The precision an encoder answers in on this machine (``train.amp``'s rule): auto on a CPU with bf16
    hardware probes a batch of ``rows`` texts of ``tokens`` tokens through the whole encoder, without gradient
    (random token ids of random lengths, padded as real batches are: the time depends on the shapes only; the
    layer cache is left out, and untouched)."""
    device = next(encoder.parameters()).device
    vocab = int(encoder.backbone.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000 if vocab > 2000 else 1, vocab, (rows, tokens), generator=generator)
    lengths = torch.randint(max(2, tokens // 4), tokens + 1, (rows, 1), generator=generator)
    mask = (torch.arange(tokens).unsqueeze(0) < lengths).long()
    ids, mask = (ids * mask).to(device), mask.to(device)

    def run(name: str) -> None:
        cache, was, before = encoder.cache, encoder.training, encoder.precision
        encoder.cache, encoder.precision = None, name
        encoder.eval()
        try:
            with torch.no_grad():
                encoder(ids, mask, dense=False)
        finally:
            encoder.cache, encoder.precision = cache, before
            encoder.train(was)

    return choose(amp, device, shape={"work": "encode", **encoder_shape(encoder, tokens, rows)}, probe=run)
