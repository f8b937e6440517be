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
  are kept in ``$KGC_CACHE_HOME/precision-probes.json`` by CPU model and family, flags, torch version, threads and the work's
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
import threading
import time
from contextlib import contextmanager, nullcontext
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
PROBE_CLEAR = 2.0  # a first timed pair with bf16 this many times as fast ends the probe (time_both)
PROBE_FILE = "precision-probes.json"
ENV = "KGC_AMP"
AMPS = ("auto", "off", "bf16", "fp16")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, Any]:
    """This CPU's :func:`parse_cpuinfo` (/proc/cpuinfo; elsewhere ``platform.processor()``, no flags and no
    numbers)."""
    model = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {"model": model, "flags": frozenset(), "family": None}
    return parse_cpuinfo(text, model)


def parse_cpuinfo(text: str, model: str = "unknown") -> dict[str, Any]:
    """The first processor's model name, flags and x86 family / model numbers from /proc/cpuinfo's ``text``. The
    numbers tell apart CPUs that share a name: two AMD EPYC generations both say "AMD EPYC" (family 25: Zen 3/4;
    family 26: Zen 5, whose bf16 products measured 2.0–2.8× faster here)."""
    flags, numbers = frozenset(), {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not key and (numbers or flags):  # the first processor's block ends
            break
        if key == "model name" and value:
            model = value
        elif key == "flags":
            flags = frozenset(value.split())
        elif key in ("cpu family", "model") and value.isdigit():
            numbers[key] = value
    family = f"family {numbers['cpu family']} model {numbers.get('model', '?')}" if "cpu family" in numbers else None
    return {"model": model, "flags": flags, "family": family}


def bf16_hardware(flags: frozenset[str] | None = None) -> list[str]:
    """The bf16 flags this CPU reports (empty: none; bf16 would be emulated)."""
    flags = cpu_info()["flags"] if flags is None else flags
    return [f for f in BF16_FLAGS if f in flags]


def describe_cpu() -> str:
    """The CPU's model and the flags that matter here, for a benchmark's heading."""
    info = cpu_info()
    shown = [f for f in SHOWN_FLAGS if f in info["flags"]]
    family = f", {info['family']}" if info.get("family") else ""
    return f"{info['model']}{family} ({', '.join(shown) or 'no AVX/AMX flags'})"


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
        held = cast_once(self, DTYPES[precision]) if getattr(self, "weights_held", False) else nullcontext()
        with torch.autocast(device_type, dtype=DTYPES[precision]), held:
            out = method(self, *args, **kwargs)
        return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out

    return wrapped


_SWAP = threading.Lock()


@contextmanager
def cast_once(module: torch.nn.Module, dtype: torch.dtype):
    """Without gradient, on an encoder whose weights are held (``weights_held``: a model loaded to answer — ``kgc
    index``, evaluation, queries, serving — :meth:`~kgc.training.setup.TaskModel.hold_weights`), ``module``'s
    Linear layers run on copies of their fp32 weights and biases cast to ``dtype`` once, instead of autocast casting
    every weight again at every call: autocast casts an fp32 weight to bf16 the same way (round to nearest), and
    leaves one already bf16 as it is, so the outputs are the same bit for bit. Measured on a CPU answering one
    query at a time: the casts were 39 % of its time (``aten::copy_``), bf16 answered slower than fp32. With
    gradient (a training step) nothing is swapped: autocast's own cache spans the step.

    A model in training never holds its weights: a copy is made again where a weight's storage or version changed,
    but torch's fused AdamW (a bf16 CPU step's) updates weights in place without moving their version, so a kept
    copy would be stale — tried, a bf16 run's validations scored its first weights (dev MRR 0.34 for 0.69).

    The swap lasts the outermost call, and is undone however it ends; a call from another thread meanwhile sees the
    copies too (the same values as its own autocast would make: one model runs in one precision), and where two
    calls start together neither may swap (both then run on autocast's own casts: the same values, slower)."""
    if torch.is_grad_enabled():
        yield
        return
    state = module.__dict__.setdefault("_kgc_cast_once", {"depth": 0, "copies": {}, "saved": []})
    with _SWAP:
        state["depth"] += 1  # first: a copy that fails (memory) is undone by the finally below
    try:
        with _SWAP:
            if state["depth"] == 1 and not state["saved"]:
                _swap_in(module, state, dtype)
        yield
    finally:
        with _SWAP:
            state["depth"] -= 1
            if state["depth"] == 0:
                for layer, name, param in state["saved"]:
                    layer._parameters[name] = param
                state["saved"] = []


def _swap_in(module: torch.nn.Module, state: dict, dtype: torch.dtype) -> None:
    """:func:`cast_once`'s swap: each fp32 Linear weight and bias of ``module`` replaced by its kept ``dtype`` copy
    (made again where the weight changed), the originals in ``state["saved"]``."""
    copies = {}  # only the layers the module holds now
    for layer in module.modules():
        if not isinstance(layer, torch.nn.Linear):
            continue
        for name in ("weight", "bias"):
            param = layer._parameters.get(name)
            if param is None or param.dtype != torch.float32:
                continue
            kept = state["copies"].get((id(layer), name))
            if kept is None or kept[0] is not param or kept[1] != (param.data_ptr(), param._version, dtype):
                kept = (param, (param.data_ptr(), param._version, dtype), param.detach().to(dtype))
            copies[(id(layer), name)] = kept
            state["saved"].append((layer, name, param))
            layer._parameters[name] = kept[2]
    state["copies"] = copies


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
    """The cache key of a probe: this machine (CPU model, family, flags, torch, threads) and the work's shape."""
    info = cpu_info()
    whole = {"cpu": info["model"], "family": info.get("family"),
             "flags": sorted(f for f in SHOWN_FLAGS if f in info["flags"]),
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


def time_both(run: Callable[[str], None], rounds: int = PROBE_ROUNDS, clear: float | None = PROBE_CLEAR) -> dict:
    """``run(name)`` for fp32 and bf16: once each untimed (the first call's one-off work), then ``rounds`` times
    each, alternating; the median seconds of each. Where the first timed pair already finds bf16 ``clear`` times
    as fast or faster (far past :data:`FASTER`'s line), the probe stops there: the rounds after it could not change
    the choice, and on the quickstart they were 2 of its 4.3 s (an fp32 step is the slow one). Only a clear bf16
    lead stops it: a verdict for fp32, which a hiccup in one bf16 call could fake, takes every round."""
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for name in times:
        run(name)
    for i in range(rounds):
        for name in (("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")):
            start = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - start)
        if i == 0 and clear is not None and times["bf16"][0] * clear <= times["fp32"][0]:
            break
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
