"""What a training run will need, said before it starts: the peak memory of a training step, and the pace.

``kgc train`` estimates, from the recipe, the data and the backbone's ``config.json`` (no weights are read), the
memory the run adds to the process once its data is read, compares it with what the machine has free
(``MemAvailable`` and the cgroup's limit on a CPU; ``torch.cuda.mem_get_info`` on a GPU) and refuses — one
:class:`~kgc.errors.KGCError`, before the run folder exists — when it does not fit with a margin, naming the
overrides that do fit (a ``train.batch_size`` computed to fit, fewer trainable layers, the dataset's laptop
recipe). ``train.check_memory: false`` (``kgc train --no-memory-check``) skips the refusal; the estimate is still
printed and recorded.

The parts (bytes; B the batch per process, L ``data.max_tokens``, S the sequences per example that run through
the trainable layers, H hidden size, I intermediate size, A attention heads, n trainable layers):

* weights 4·P of every distinct tower, gradients 4·P_train, AdamW's two moments 8·P_train, and the update's
  temporaries (``foreach`` AdamW on a CPU) C_OPT·4·P_train;
* activations kept for the backward pass: B·S·L·n·(C_H·H + C_I·I + C_A·A·L) floats (4 bytes; 2 under bf16/fp16
  autocast on a GPU) — the Q/K/V, LayerNorm and feed-forward inputs scale with H and I, the attention
  probabilities (and their dropout) with A·L per token, since the CPU's scaled-dot-product attention materialises
  them when dropout is on;
* the objective's score matrices: B × (in-batch + pre-batch + table columns) floats, C_LOGITS copies of them (the
  table's columns: at most ``loss.table_chunk`` at a time, of ``loss.table_sample`` or every entity);
  the entity table of ``loss.table_negatives`` (entities × H × 4) and the pre-batch queue;
* the layer cache's states computed between two saves: ``train.checkpoint_every`` steps' texts and, with an entity
  table, every entity's text once; fp16, each counted at L (their length is at most that) and twice (the save
  copies them). Checked on ``recipes/wn18rr_laptop.yaml`` for 30 steps (the table's pass stores 40,943 entities'
  states, 27 tokens long on average, 0.9 GB, and the save holds about 3.5 times that at its peak): measured
  +4.75 GB over the resident set at the check, estimated 4.83 GB for those 30 steps (the line it prints, 6.3 GB,
  counts the 320 steps before the recipe's first save);
* the fixed cost of the model code, the tokenizer and the token ids of every text: C_FIXED + C_TOKEN per text
  slot (link prediction: 2 × entities + relations texts, each L slots).

Calibration (this module's constants; measured on the 2-core, 24 GB CPU machine kgc is developed on, torch 2.13,
transformers 5.24, SDPA attention): 16 real ``kgc train`` runs of 3 steps, each in a fresh process, over a
synthetic graph of 3,000 entities whose texts all fill ``data.max_tokens`` (no batch is shorter than L, no row
repeats), bi-encoder, separate towers: random BERTs of H 64-256, I 128-1024, A 2-8, 1-4 layers, and
all-MiniLM-L6-v2 (H 384, I 1536, A 12, 6 layers); batches 16-256, L 32-64; every layer or the top 2-4 training;
the table of ``loss.table_tails`` or the tail tower. The measured figure is the process's peak resident set
(``VmHWM``, before the finishing work) minus its resident set at the check: 282 MB to 5.6 GB. C_H = 15.2,
C_I = 3.3, C_A = 4.5 and C_FIXED = 174 MiB were fitted by non-negative least squares (C_OPT came out 0: the
update's temporaries do not show); the other parts are counted as above (C_TOKEN from WN18RR's text bank: 259 MB
for 40,943 entities at 50 tokens as Python lists, 88.7 MB since the bank holds ``Ragged`` arrays). The estimate's error against the measured figure: median 2.3 %, at most
21.6 % (over: the smallest run, where the fixed part dominates) and -11.3 % (under: a 1-layer BERT at batch 256,
and the first run that filled the layer cache with every entity's states). CSR's router (not fitted) is
over-estimated by 20 %. On a GPU the same formula holds with 2-byte activations under bf16/fp16 autocast
(not calibrated there: FlashAttention keeps no A·L term, so it errs high). The check refuses above
MARGIN = 85 % of what is available.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kgc.errors import KGCError
from kgc.recipe import Recipe

if TYPE_CHECKING:
    from kgc.training.task import Counts

# ---------------------------------------------------------------- the fitted constants (see the module docstring)
C_H = 15.2  # activation floats kept per token, per trainable layer, per unit of hidden size
C_I = 3.3  # … per unit of intermediate size
C_A = 4.5  # … per attention head and key position
C_OPT = 0.0  # AdamW's temporaries during the update, in copies of the trainable weights (fitted: none seen)
C_LOGITS = 6  # copies of the score matrix (logits, masked, softmax, their gradients): counted, not fitted
C_FIXED = 174 * 2**20  # model code, tokenizer and allocator slack, bytes
C_TOKEN = 22  # bytes per text slot (texts × max_tokens) of the text bank held: WN18RR's 88.7 MB, measured
# |estimate - measured| / measured of the fitted runs (and of CSR's router, not fitted)
FIT = {"runs": 16, "median_error": 0.023, "max_error": 0.216, "router_errors": (0.198, 0.205)}

MARGIN = 0.85  # a run is refused when its estimate exceeds this share of the memory available
GB = 1e9
MEMINFO = "/proc/meminfo"
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # (limit, usage): v2, then v1
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


@dataclass
class BackboneShape:
    """What the estimate reads from a backbone's ``config.json`` (and parameter counts of a weightless copy)."""
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    embedding_params: int  # the embeddings (and anything outside the layers)
    layer_params: int  # one transformer layer

    @property
    def params(self) -> int:
        return self.embedding_params + self.layers * self.layer_params


def backbone_shape(model: str | Path) -> BackboneShape:
    """The shape of ``model`` (a Hugging Face id or folder) from its config alone: the parameters are counted on a
    copy built on torch's ``meta`` device (no memory, no weights read), or by BERT's formula where that fails."""
    from transformers import AutoConfig

    from kgc.encoding.backbone import resolve_backbone

    config = AutoConfig.from_pretrained(str(resolve_backbone(str(model))))
    h = int(config.hidden_size)
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_attention_heads", max(1, h // 64)))
    inter = int(getattr(config, "intermediate_size", 4 * h))
    vocab = int(getattr(config, "vocab_size", 30522))
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    emb = (vocab + int(getattr(config, "max_position_embeddings", 512))
           + int(getattr(config, "type_vocab_size", 2))) * h + 2 * h
    try:
        import torch
        from transformers import AutoModel

        with torch.device("meta"):
            try:
                m = AutoModel.from_config(config, add_pooling_layer=False)
            except TypeError:
                m = AutoModel.from_config(config)
        total = sum(p.numel() for p in m.parameters())
        blocks = getattr(getattr(m, "encoder", None), "layer", None)
        if blocks is not None and len(blocks) == layers:
            per_layer = sum(p.numel() for p in blocks[0].parameters())
        emb = total - layers * per_layer
    except Exception:  # noqa: BLE001  (an architecture the meta device cannot build: the formula stands)
        pass
    return BackboneShape(hidden=h, layers=layers, heads=heads, intermediate=inter, vocab=vocab,
                         embedding_params=emb, layer_params=per_layer)


@dataclass
class Workload:
    """What one training step of a recipe runs (per process), in the terms of the estimate."""
    batch: int  # examples per step in this process
    global_batch: int
    seq: int  # tokens per sequence (data.max_tokens: batches pad to their longest)
    trained_sequences: float  # sequences per example through the trainable layers (all towers)
    cached_sequences: float  # sequences per example read from the layer cache (below the trainable layers)
    towers: int  # distinct backbone copies held
    trainable_towers: int  # of which train
    trainable_layers: int  # per trainable tower
    embeddings_train: bool
    score_columns: int  # columns of the objective's score matrix per example
    table_rows: int  # rows of an entity table held (loss.table_negatives), else 0
    queue_rows: int  # pre-batch queue rows
    texts: int  # texts whose token ids the run holds
    cache_depth: int  # K of the layer cache (1 but for S²Sent)
    cache_sequences: int  # at most this many states computed between two saves of the layer cache


@dataclass
class Estimate:
    """Bytes per part, their total, and what the device has (None: unknown)."""
    parts: dict[str, int]
    device: str
    available: int | None
    where: str  # how ``available`` was read
    workload: Workload = field(repr=False)
    shape: BackboneShape = field(repr=False)

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    @property
    def fits(self) -> bool:
        return self.available is None or self.total <= MARGIN * self.available

    def line(self) -> str:
        have = (f"{self.available / GB:.1f} GB available ({self.where})" if self.available is not None
                else "available memory unknown")
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])[:3]
        return (f"memory: ~{self.total / GB:.1f} GB per step on {self.device} ({have}; largest: "
                + ", ".join(f"{k} {v / GB:.1f} GB" for k, v in big) + ")")

    def record(self) -> dict[str, Any]:
        """What train_summary.json keeps of it."""
        return {"estimate_bytes": self.total, "available_bytes": self.available, "device": self.device,
                "parts": {k: int(v) for k, v in self.parts.items()}}


def _conditioner(recipe: Recipe):
    from kgc.conditioning.base import conditioner_class

    return conditioner_class(recipe.model.conditioner)


def workload(recipe: Recipe, counts: "Counts | None" = None, *, world: int = 1,
             shape: BackboneShape | None = None) -> Workload:
    """The step of ``recipe`` (``counts``: its task's data as read — examples an epoch, the batch it forms, a graph's
    entities and relations; None: the recipe's batch alone).

    What a step encodes per example — sequences, towers, score columns, tables — is the task's
    (:meth:`kgc.training.task.Task.workload`); here what follows from it for any task: the trainable and frozen
    layers, the layer cache, the batch per process. Each sequence counted at ``data.max_tokens``: an upper bound
    (batches pad to their longest text, identical rows are encoded once)."""
    from kgc.training.task import task_class

    shape = shape or backbone_shape(recipe.model.backbone)
    tc, enc = recipe.train, recipe.encoder
    cond = _conditioner(recipe)
    global_batch = tc.batch_size
    examples = None
    if counts is not None:
        global_batch = min(global_batch, max(2, counts.batch))
        examples = counts.steps_per_epoch * global_batch
    batch = max(1, math.ceil(global_batch / max(1, world)))
    n = shape.layers if enc.trainable_layers == "all" else int(enc.trainable_layers)
    n = max(0, min(n, shape.layers))
    step = task_class(recipe.task).workload(recipe, counts, batch=batch, global_batch=global_batch)
    frozen = shape.layers - n
    cached = 0.0
    cache_seqs = 0
    plain = cond.plain_layers(recipe.model.options(), shape.layers)  # the layers below the condition's entry
    if frozen > 0 and enc.cache and min(frozen, plain) > 0:  # every tower that runs reads the one cache
        cached = step.query_sequences + step.other_sequences
        per_save = tc.checkpoint_every * global_batch * cached
        # the table's pass goes through it
        cache_seqs = int(min(per_save, (examples or per_save) * cached)) + step.table_rows
    depth = max(1, recipe.model.s2sent_blocks) if recipe.model.pooling == "s2sent" else 1
    return Workload(batch=batch, global_batch=global_batch, seq=recipe.data.max_tokens,
                    trained_sequences=step.trained, cached_sequences=cached, towers=step.towers,
                    trainable_towers=step.trainable_towers, trainable_layers=n, embeddings_train=frozen == 0,
                    score_columns=int(step.score_columns), table_rows=step.table_rows, queue_rows=step.queue_rows,
                    texts=step.texts, cache_depth=depth,
                    cache_sequences=cache_seqs)


def activation_floats(w: Workload, s: BackboneShape) -> float:
    """Floats kept for the backward pass of one step (the fitted part)."""
    tokens = w.batch * w.trained_sequences * w.seq
    return tokens * w.trainable_layers * (C_H * s.hidden + C_I * s.intermediate + C_A * s.heads * w.seq)


def parts(w: Workload, s: BackboneShape, *, half: bool = False, gpu: bool = False) -> dict[str, int]:
    """Bytes per part of the estimate (module docstring); ``gpu``: the device's parts only (the token ids, the model
    code and the layer cache's stored states stay in host memory)."""
    train_params = w.trainable_towers * (w.trainable_layers * s.layer_params
                                         + (s.embedding_params if w.embeddings_train else 0))
    act_bytes = 2 if half else 4
    out = {
        "weights": 4 * w.towers * s.params,
        "gradients": 4 * train_params,
        "optimizer": int((8 + 4 * C_OPT) * train_params),
        "activations": int(act_bytes * activation_floats(w, s)),
        "scores": 4 * C_LOGITS * w.batch * w.score_columns,
        "entity table": 4 * s.hidden * (w.table_rows + w.queue_rows),
        # fp16 states computed since the last save, and their copy while the save writes them; a step's lookups
        "layer cache": 2 * 2 * w.cache_depth * s.hidden * w.seq * w.cache_sequences
                       + 4 * w.cache_depth * s.hidden * w.seq * int(w.batch * w.cached_sequences),
        "fixed": int(C_FIXED + C_TOKEN * w.texts * w.seq),
    }
    if gpu:
        out["layer cache"] = 4 * w.cache_depth * s.hidden * w.seq * int(w.batch * w.cached_sequences)
        del out["fixed"]
    return {k: int(v) for k, v in out.items() if v}


# ---------------------------------------------------------------- what the machine has


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available() -> tuple[int | None, str]:
    """Bytes a new allocation may take on this host: ``MemAvailable`` of /proc/meminfo, lower where a cgroup's
    memory limit leaves less."""
    avail, where = None, "MemAvailable"
    try:
        for row in Path(MEMINFO).read_text().splitlines():
            if row.startswith("MemAvailable:"):
                avail = int(row.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in CGROUP_FILES:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:
            left = max(0, limit - usage)
            if avail is None or left < avail:
                avail, where = left, "the cgroup's memory limit"
            break
    return avail, where


def available(device) -> tuple[int | None, str]:
    """(bytes free, how it was read) on ``device``: the GPU's free memory, or the host's."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        try:
            free, _total = torch.cuda.mem_get_info(device)
            return int(free), "torch.cuda.mem_get_info"
        except Exception:  # noqa: BLE001
            return None, "unknown"
    return host_available()


def estimate(recipe: Recipe, counts: "Counts | None" = None, *, device: Any = "cpu", world: int = 1,
             shape: BackboneShape | None = None, available_bytes: int | None = None,
             backbone: str | Path | None = None) -> Estimate:
    """The estimate of one training step of ``recipe`` on ``device`` (``available_bytes``: what is free, default
    read from the machine; ``backbone``: the folder whose config to read, default the recipe's model). On a CPU every
    local process of a ``torchrun`` group counts: they share the host."""
    shape = shape or backbone_shape(backbone if backbone is not None else recipe.model.backbone)
    w = workload(recipe, counts, world=world, shape=shape)
    is_cuda = getattr(device, "type", str(device)) == "cuda"
    half = is_cuda and recipe.train.amp in ("auto", "bf16", "fp16")
    p = parts(w, shape, half=half, gpu=is_cuda)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if world > 1 and not is_cuda else 1
    if local > 1:
        p = {k: v * local for k, v in p.items()}
    if available_bytes is not None:
        avail, where = available_bytes, "given"
    else:
        avail, where = available(device)
    return Estimate(parts=p, device=str(device), available=avail, where=where, workload=w, shape=shape)


# ---------------------------------------------------------------- the refusal and its fixes


def _with(recipe: Recipe, section: str, **values) -> Recipe:
    return recipe.model_copy(update={section: getattr(recipe, section).model_copy(update=values)})


def fitting_batch(recipe: Recipe, counts: "Counts | None", *, device: Any, world: int, shape: BackboneShape,
                  available_bytes: int) -> int | None:
    """The largest ``train.batch_size`` (a multiple of 8 where above 8, of ``world`` always) whose estimate fits."""
    def fits(b: int) -> bool:
        return estimate(_with(recipe, "train", batch_size=b), None if counts is None else counts.at_batch(b), device=device, world=world,
                        shape=shape, available_bytes=available_bytes).fits

    lo, hi = 2, recipe.train.batch_size
    if not fits(lo):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    best = hi if fits(hi) else lo
    step = max(world, 8 if best > 8 else 1)
    return max(world, best // step * step) if best >= step else best


def _recipe_folders() -> list[Path]:
    from kgc.families import recipe_folder

    here = recipe_folder().resolve()
    return list(dict.fromkeys(p for p in (Path("recipes").resolve(), here) if p.is_dir()))


def laptop_recipes(recipe: Recipe) -> list[Path]:
    """The shipped recipes for the recipe's dataset on a laptop (``recipes/<dataset>_laptop*.yaml``), the one with
    the recipe's conditioner first."""
    found: list[Path] = []
    for folder in _recipe_folders():
        found += sorted(folder.glob(f"{recipe.data.dataset.lower()}_laptop*.yaml"))
    if not found:
        return []

    def same_conditioner(p: Path) -> bool:
        try:
            from kgc.recipe import load_recipe

            return load_recipe(p).model.conditioner == recipe.model.conditioner
        except Exception:  # noqa: BLE001
            return False

    return sorted(dict.fromkeys(found), key=lambda p: (not same_conditioner(p), p.name))


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def refusal(est: Estimate, recipe: Recipe, counts: "Counts | None", *, world: int = 1) -> KGCError:
    """The KGCError of a run that does not fit: the estimate, what is free, and the overrides that fit."""
    avail = est.available or 0
    fixes = []
    b = fitting_batch(recipe, counts, device=est.device, world=world, shape=est.shape, available_bytes=avail)
    if b is not None and b < recipe.train.batch_size:
        fixes.append(f"`--set train.batch_size={b}` (the largest multiple of 8 whose estimate fits)")
    now = est.shape.layers if recipe.encoder.trainable_layers == "all" else int(recipe.encoder.trainable_layers)
    for n in (k for k in (4, 2, 1) if k < now):
        e2 = estimate(_with(recipe, "encoder", trainable_layers=n), counts, device=est.device, world=world,
                      shape=est.shape, available_bytes=avail)
        if e2.fits:
            fixes.append(f"`--set encoder.trainable_layers={n}` (the top {n} layer{'s' * (n > 1)} train over the "
                         f"layer cache: ~{e2.total / GB:.1f} GB)")
            break
    for path in laptop_recipes(recipe)[:1]:
        fixes.append(f"the laptop recipe `kgc train {_shown(path)}`")
    how = ("It fits with " + "; or ".join(fixes) + ". ") if fixes else \
        "No smaller batch fits: free memory or use a larger machine. "
    biggest = ", ".join(f"{k} {v / GB:.1f} GB" for k, v in sorted(est.parts.items(), key=lambda kv: -kv[1])[:4])
    return KGCError(
        f"this run needs ~{est.total / GB:.1f} GB per training step on {est.device} ({biggest}: batch "
        f"{recipe.train.batch_size}, {est.workload.trainable_layers} trainable layers of {est.shape.layers}, "
        f"{est.workload.seq} tokens), but {avail / GB:.1f} GB is available ({est.where}); it would be killed "
        f"for want of memory. {how}"
        f"To start anyway: `kgc train ... --no-memory-check` (train.check_memory: false). Nothing was written.")


def check(recipe: Recipe, counts: "Counts | None", *, device: Any, world: int = 1, enabled: bool = True,
          backbone: str | Path | None = None, say: Callable[[str], None] = print) -> Estimate | None:
    """Say the estimate in one line; raise :func:`refusal`'s KGCError when it does not fit (``enabled``). None
    (and nothing said) where the estimate cannot be made (a backbone without a readable config: loading it fails
    next with its own message)."""
    try:
        est = estimate(recipe, counts, device=device, world=world, backbone=backbone)
    except KGCError:
        return None
    except Exception as exc:  # noqa: BLE001  (never let the estimate stop a run it cannot judge)
        say(f"memory: no estimate ({type(exc).__name__}: {exc})")
        return None
    say(est.line())
    if not est.fits:
        if enabled:
            raise refusal(est, recipe, counts, world=world)
        say(f"warning: the estimate exceeds {MARGIN:.0%} of the memory available; going on "
            "(train.check_memory: false)")
    return est


# ---------------------------------------------------------------- measured: resident memory, the pace


def resident_bytes(pid: int | str = "self") -> tuple[int | None, int | None]:
    """(a process's resident set now, its peak so far) in bytes, from /proc/PID/status (None elsewhere)."""
    now = peak = None
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                now = int(row.split()[1]) * 1024
            elif row.startswith("VmHWM:"):
                peak = int(row.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return now, peak


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    return f"{int(minutes // 60)} h {int(minutes % 60):02d} min"


def pace(*, step: int, total: int, seconds_per_step: float, train_seconds: float, max_minutes: float | None,
         unit: str, rate: float, now: float | None = None) -> tuple[str, dict[str, Any]]:
    """The line ``kgc train`` prints once, early — the measured pace and when the run ends (its steps, or
    ``train.max_minutes``, whichever comes first; validation not included) — and what train_summary.json keeps."""
    import time
    from datetime import datetime

    left_steps = max(0, total - step)
    left = left_steps * seconds_per_step
    by = f"{total:,} steps"
    if max_minutes:
        cap = max(0.0, 60 * max_minutes - train_seconds)
        if cap < left:
            at = step + int(cap / seconds_per_step)
            left, by = cap, f"train.max_minutes={max_minutes:g}, at step ~{at:,} of {total:,}"
    end = (now if now is not None else time.time()) + left
    when = datetime.fromtimestamp(end).strftime("%H:%M" if left < 20 * 3600 else "%Y-%m-%d %H:%M")
    line = (f"pace: {seconds_per_step:.2f} s/step ({rate:.1f} {unit}/s) after {step} steps; "
            f"training ends in about {_duration(left)}, at {when} ({by}; validation not included)")
    record = {"seconds_per_step": round(seconds_per_step, 4), f"{unit}_per_s": round(rate, 2),
              "measured_at_step": step, "total_steps": total,
              "estimated_seconds_left": round(left, 1),
              "estimated_end": datetime.fromtimestamp(end).isoformat(timespec="seconds"), "ends_by": by}
    return line, record
