"""What each stage of a recipe would need on a graph of a given size, before any of it runs: ``kgc bench scale`` asks
:func:`stage_memory` for a recipe and the synthetic graph's counts (Wikidata5M's 4.6M entities / 20.6M triples have
no download here) and prints, per stage, the bytes, whether they fit this machine, and what a GPU would need.

The stages and where their numbers come from (no model weights are read, no data is loaded):

* ``data``: the model code, tokenizer and every text's token ids in the training process (``C_FIXED + C_TOKEN ·
  texts · L``, :mod:`kgc.training.estimate`; texts = 2 · entities + 2 · relations) — host memory on any device;
* ``layer cache`` (with ``encoder.trainable_layers: n`` and the cache not off): :mod:`kgc.training.cache_plan`'s
  states and lookup index for every entity text and one query sequence per training example (at most one per train
  direction), each at ``data.max_tokens`` unless ``mean_tokens`` says — host memory on any device. A cache that
  does not fit is left off (``encoder.cache: true``), and the training step below is then estimated without it;
* ``training step``: :func:`kgc.training.estimate.estimate` of the training process at its peak (the data above,
  weights, gradients, AdamW, activations, the score matrices — the entity table's columns chunked and sampled as the recipe's ``loss`` says — the entity
  table, the pre-batch queue), on this machine's CPU and on a GPU (its device memory: weights, activations at
  2 bytes under autocast, scores; the token ids and the cache stay on the host);
* ``evaluation``: every entity's embedding (entities × d × 4 B, what the evaluation and a flat index hold) plus the
  largest score block (``eval.max_score_bytes``). An approximate index (IVF-PQ, HNSW) holds less or more beside it:
  that is the index's own estimate.

"Fits" compares with MARGIN (85 %) of what is available: this host's ``MemAvailable`` (or ``available``), and
``gpu_memory`` for the GPU column.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kgc.recipe import Recipe
from kgc.training import estimate as est
from kgc.training.cache_plan import CachedTexts, plan
from kgc.training.task import Counts

GPU_MEMORY = 80e9  # an 80 GB GPU (A100/H100) unless told


@dataclass
class Stage:
    """One stage's estimate. ``gpu_bytes``: the device memory it takes when training on a GPU (None: it stays in host
    memory there too, as ``bytes``)."""
    name: str
    bytes: int  # on this machine (host memory)
    fits: bool  # within MARGIN of what this machine has available
    gpu_bytes: int | None = None
    fits_gpu: bool | None = None  # within MARGIN of gpu_memory
    note: str = ""  # what decides it; what happens when it does not fit
    parts: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _counts(entities: int, relations: int, triples: int, batch: int) -> Counts:
    """The task's data as :func:`kgc.training.estimate.workload` reads it: every train triple both ways, batches of
    ``batch``."""
    return Counts(examples=max(1, 2 * triples), batch=min(batch, max(1, 2 * triples)), entities=entities,
                  relations=relations)


def _with_encoder(recipe: Recipe, **values) -> Recipe:
    return recipe.model_copy(update={"encoder": recipe.encoder.model_copy(update=values)})


def stage_memory(recipe: Recipe, *, entities: int, triples: int, relations: int | None = None, device: str = "cpu",
                 gpu_memory: float = GPU_MEMORY, available: int | None = None,
                 backbone: str | Path | None = None, shape: est.BackboneShape | None = None,
                 mean_tokens: float | None = None, eval_triples: int = 10_000) -> list[Stage]:
    """Per stage (data, layer cache, training step, evaluation) the estimated bytes of ``recipe`` on a graph of
    ``entities`` entities, ``triples`` train triples and ``relations`` forward relations (default entities / 100,
    10 to 822, as ``kgc data synth-graph`` makes them), whether it fits this machine (``available`` bytes, default
    its ``MemAvailable``; ``device`` names it in the notes) and a GPU of ``gpu_memory`` bytes.

    ``mean_tokens``: the texts' mean length in tokens (default ``data.max_tokens``, an upper bound);
    ``eval_triples``: dev + test triples, whose queries the cache also stores; ``shape``/``backbone``: the encoder's
    shape, else read from the recipe's backbone's ``config.json``."""
    if relations is None:
        relations = min(822, max(10, entities // 100))
    if available is None:
        available = est.host_available()[0]
    shape = shape or est.backbone_shape(backbone if backbone is not None else recipe.model.backbone)
    tc, L = recipe.train, recipe.data.max_tokens
    tokens = float(min(L, mean_tokens if mean_tokens is not None else L))
    counts = _counts(entities, relations, triples, tc.batch_size)
    examples = max(1, math.ceil(2 * triples / tc.batch_size)) * tc.epochs * tc.batch_size
    if tc.max_steps:
        examples = min(examples, tc.max_steps * tc.batch_size)

    def fits(n: int | None, room: float | None) -> bool:
        return room is None or (n or 0) <= est.MARGIN * room

    stages = []
    texts = 2 * entities + 2 * relations
    data = int(est.C_FIXED + est.C_TOKEN * texts * L)
    stages.append(Stage("data", data, fits(data, available),
                        note=f"token ids of {texts:,} texts × {L} tokens and the model code; host memory on any device",
                        parts={"fixed": int(est.C_FIXED), "token ids": data - int(est.C_FIXED)}))

    cache_on = recipe.encoder.trainable_layers != "all" and recipe.encoder.cache is not False
    if cache_on:
        cond = est._conditioner(recipe)
        stored = [CachedTexts("entity texts", entities, tokens),
                  CachedTexts("query sequences", min(examples, 2 * triples) + 2 * eval_triples, tokens)]
        if cond.encodes_conditions:
            stored.append(CachedTexts("relation texts", 2 * relations, tokens))
        depth = max(1, recipe.model.s2sent_blocks) if recipe.model.pooling == "s2sent" else 1
        cache = plan(stored, hidden=shape.hidden, depth=depth, max_gb=recipe.encoder.cache_max_gb,
                     available=available, between_saves=tc.checkpoint_every * tc.batch_size)
        if cache.fits:
            note = f"kept: {cache.line().removeprefix('layer cache: ')}"
        elif recipe.encoder.cache == "required":
            note = f"refused (encoder.cache: required): {cache.error()}"
        else:
            note = ("left off (encoder.cache: true), the step below runs the frozen layers: "
                    f"{cache.line().removeprefix('layer cache: ')}")
            recipe = _with_encoder(recipe, cache=False)
        stages.append(Stage("layer cache", cache.memory, cache.fits, note=note,
                            parts={"states held at once": cache.held, "lookup index": cache.index,
                                   "states on disk": cache.states}))

    here = est.estimate(recipe, counts, device="cpu", shape=shape, available_bytes=available)
    gpu = est.estimate(recipe, counts, device="cuda", shape=shape, available_bytes=int(gpu_memory))
    big = ", ".join(f"{k} {v / est.GB:.1f} GB" for k, v in sorted(here.parts.items(), key=lambda kv: -kv[1])[:3])
    lo = recipe.loss
    table = ""
    if lo.table_negatives:
        scored = entities if not lo.table_sample or lo.table_sample >= entities else lo.table_sample
        table = (f"; each query against {scored:,} table rows a step" + (" (sampled)" if scored < entities else "")
                 + (f", in chunks of {lo.table_chunk:,}" if scored > lo.table_chunk else ""))
    stages.append(Stage("training step", here.total, here.fits, gpu.total, gpu.fits,
                        note=f"the training process at its peak, the data above included: batch {tc.batch_size} on "
                             f"{device} (largest: {big}){table}; on a GPU its device memory", parts=here.parts))

    embeddings = 4 * shape.hidden * entities
    scores = int(recipe.eval.max_score_bytes or 0)
    evaluation = embeddings + scores
    stages.append(Stage("evaluation", evaluation, fits(evaluation, available), evaluation,
                        fits(evaluation, gpu_memory),
                        note=f"{entities:,} entity embeddings × {shape.hidden} × 4 B and one score block; an "
                             "approximate index adds its own structure",
                        parts={"entity embeddings": embeddings, "score block": scores}))
    return stages


def stage_table(stages: list[Stage], *, gpu_memory: float = GPU_MEMORY) -> str:
    """The stages as the lines ``kgc bench scale`` may print: bytes here, fits, bytes on a GPU, fits there."""
    gb = lambda n: "-" if n is None else f"{n / est.GB:,.1f} GB"  # noqa: E731
    yes = lambda ok: "-" if ok is None else ("yes" if ok else "NO")  # noqa: E731
    rows = [f"{'stage':<15}{'here':>12}{'fits':>6}{f'GPU ({gpu_memory / est.GB:.0f} GB)':>16}{'fits':>6}  note"]
    for s in stages:
        rows.append(f"{s.name:<15}{gb(s.bytes):>12}{yes(s.fits):>6}{gb(s.gpu_bytes):>16}{yes(s.fits_gpu):>6}  "
                    f"{s.note}")
    return "\n".join(rows)
