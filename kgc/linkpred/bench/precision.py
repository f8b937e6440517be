"""``kgc bench precision RECIPE``: fp32 and bf16 side by side in one process, alternating, so a busy machine slows
both alike (:mod:`kgc.encoding.precision` is what ``train.amp`` chooses from).

* **the limit**: the matrix-product rate at the model's own shapes (a training step's rows × the hidden and
  feed-forward widths, and the query-by-table product of ``loss.table_negatives``), GFLOP/s each way;
* **training**: ``--steps`` optimiser steps of the recipe's batch per block, fp32 and bf16 blocks alternating
  (``--rounds`` each), on one model: triples/s, and the share of the limit a step reaches (its FLOPs counted by
  ``torch.utils.flop_counter`` over one step: the matrix products that really run, cached layers excluded);
* **entities**: the tail tower over ``--entities`` of the graph's entities (no gradient), entities/s;
* **queries**: ``--queries`` test queries encoded and ranked against the entity table, queries/s;
* **where a step waits**: with ``--profile``, the operators with the most self time in a step, each way;
* **the same model**: with ``--mrr-steps N``, two runs of the recipe trained ``N`` steps from the same seed
  (``train.amp=off`` and ``train.amp=bf16``) and evaluated on the test split: MRR and Hits@10 of each.

On a CPU without bf16 hardware (no ``amx_bf16`` or ``avx512_bf16``) bf16 is emulated: its matrix products measured
1.3–2.5 GFLOP/s against fp32's 167–180 on an AVX2-only AMD EPYC, so a bf16 block of the quickstart's steps would take many
minutes and say only that. There the limit is measured both ways (it is what shows it), the fp32 figures are
measured, and bf16's are skipped and said so (``train.amp: auto`` chooses fp32 there without a probe);
``emulated=True`` (``--emulated``) times bf16 anyway.

It prints the CPU's model name and flags; docs/results/cpu.md holds its table for the machine it was measured on.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kgc.data.formats import load_graph
from kgc.encoding.backbone import resolve_backbone
from kgc.encoding.precision import BF16_FLAGS, bf16_hardware, describe_cpu
from kgc.recipe import load_recipe
from kgc.training.common import fuse_adamw, make_optimizer, seed_everything
from kgc.training.task import task_class

NAMES = ("fp32", "bf16")


def _rate(shape: tuple[int, int, int], dtype: torch.dtype, seconds: float = 0.4) -> float:
    """GFLOP/s of an (m, k) @ (k, n) product in ``dtype`` over about ``seconds``."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(2):
        a @ b
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or runs < 2:
        a @ b
        runs += 1
    return 2 * m * k * n * runs / (time.perf_counter() - start) / 1e9


def matrix_limit(shapes: dict[str, tuple[int, int, int]], rounds: int = 2) -> dict:
    """Each shape's GFLOP/s in fp32 and bf16 (best of ``rounds``, alternating), and the FLOP-weighted rate of the
    set (the time the set takes at each shape's rate): the machine's limit for this model."""
    best = {name: {s: 0.0 for s in shapes} for name in NAMES}
    for _ in range(rounds):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for label, shape in shapes.items():
                best[name][label] = max(best[name][label], _rate(shape, dtype))
    flops = {label: 2 * m * k * n for label, (m, k, n) in shapes.items()}
    out = {}
    for name in NAMES:
        seconds = sum(flops[s] / (best[name][s] * 1e9) for s in shapes)
        out[name] = {"by_shape": {s: round(v, 1) for s, v in best[name].items()},
                     "gflops": round(sum(flops.values()) / seconds / 1e9, 1)}
    return out


def _step(task, model, criterion, optimizer, batch) -> None:
    loss = task.batch_loss(model, criterion, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def top_operators(run, n: int = 8) -> list[dict]:
    """``run()`` under torch.profiler (CPU): the ``n`` operators with the most self time, their share and calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"operator": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": int(e.count)}
            for e in events[:n]]


def step_flops(task, model, criterion, batch) -> float:
    """The FLOPs of one training step's forward and backward, counted by torch (the optimiser's are not matrix
    products and are left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss = task.batch_loss(model, criterion, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    criterion.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def bench_precision(recipe_path: Path, *, steps: int = 4, rounds: int = 2, entities: int = 1024,
                    queries: int = 256, mrr_steps: int = 0, profile: bool = False,
                    overrides: list[str] | None = None, emulated: bool = False, echo=print) -> dict:
    recipe = load_recipe(recipe_path, list(overrides or []))
    cpu, hardware = describe_cpu(), bf16_hardware()
    echo(f"CPU: {cpu}; {torch.get_num_threads()} threads; bf16 hardware: {', '.join(hardware) or 'none (emulated)'}")
    both = bool(hardware) or emulated  # bf16 timed too beyond the limit
    names = NAMES if both else ("fp32",)
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    task = task_class(recipe.task).training(recipe, graph=graph)
    seed_everything(recipe.train.seed)
    model, _ = task.build_model(resolve_backbone(recipe.model.backbone))
    model.attach_layer_cache(recipe)
    model.set_bf16_stream(recipe.train.bf16_stream)  # as training sets it (kgc.encoding.stream)
    criterion = task.make_loss(torch.device("cpu"))
    optimizer = make_optimizer([model, criterion], recipe.train.lr, recipe.train.weight_decay)
    model.train()
    criterion.train()
    b = task.b
    rng = np.random.default_rng(recipe.train.seed)
    batches = [task.prepare(model, criterion, task.examples[rng.choice(len(task.examples), b, replace=False)])
               for _ in range(steps)]
    config = model.encoders[0].backbone.config
    rows_per_step = b * recipe.data.max_tokens
    hidden, inter = int(config.hidden_size), int(config.intermediate_size)
    shapes = {f"{rows_per_step}x{hidden}@{hidden}x{hidden}": (rows_per_step, hidden, hidden),
              f"{rows_per_step}x{hidden}@{hidden}x{inter}": (rows_per_step, hidden, inter),
              f"{rows_per_step}x{inter}@{inter}x{hidden}": (rows_per_step, inter, hidden)}
    if recipe.loss.table_negatives:
        shapes[f"{b}x{hidden}@{hidden}x{graph.num_entities}"] = (b, hidden, graph.num_entities)
    limit = matrix_limit(shapes)
    echo("matrix products at the model's shapes, GFLOP/s: " + "; ".join(
        f"{s}: fp32 {limit['fp32']['by_shape'][s]:.0f}, bf16 {limit['bf16']['by_shape'][s]:.0f}" for s in shapes))
    if not both:
        echo(f"bf16 is emulated on this CPU (no {' or '.join(BF16_FLAGS)} in /proc/cpuinfo): its matrix products "
             f"{limit['fp32']['gflops'] / max(limit['bf16']['gflops'], 1e-9):.0f}x slower than fp32's here, so only fp32 "
             "is timed below (train.amp=auto chooses fp32 on this CPU; --emulated times bf16 anyway)"
             + ("; --mrr-steps trains no bf16 run either" if mrr_steps else ""))

    def use(name: str) -> None:  # as training runs it: the encoders in ``name``, AdamW fused in bf16
        model.set_precision(name)
        fuse_adamw(optimizer, name == "bf16")

    task.before_step(model, criterion, 0)  # the loss's entity table (table_negatives), as training's first step
    for name in names:  # warm: the layer cache filled, allocations made, for both
        use(name)
        for batch in batches:
            _step(task, model, criterion, optimizer, batch)
    flops = {}
    for name in names:
        model.set_precision(name)
        flops[name] = step_flops(task, model, criterion, batches[0]) / b
    seconds = {name: 0.0 for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            use(name)
            start = time.perf_counter()
            for batch in batches:
                _step(task, model, criterion, optimizer, batch)
            seconds[name] += time.perf_counter() - start
    done = rounds * steps * b
    training = {}
    for name in names:
        rate = done / seconds[name]
        reached = rate * flops[name] / 1e9
        training[name] = {"triples_per_s": round(rate, 2), "gflops_per_triple": round(flops[name] / 1e9, 3),
                          "gflops": round(reached, 1), "of_limit": round(reached / limit[name]["gflops"], 3),
                          "of_fp32_limit": round(reached / limit["fp32"]["gflops"], 3)}
        echo(f"training {name}: {rate:.1f} triples/s ({rounds} x {steps} steps of {b}), "
             f"{flops[name] / 1e9:.2f} GFLOP a triple: {reached:.0f} GFLOP/s, "
             f"{100 * training[name]['of_limit']:.0f} % of the {name} limit ({limit[name]['gflops']:.0f})")

    profiles = {}
    if profile:  # where a step's time goes, each way: the operators with the most self time
        for name in names:
            use(name)
            profiles[name] = top_operators(lambda: [_step(task, model, criterion, optimizer, b_) for b_ in batches])
            echo(f"top operators of a {name} step (self CPU time): " + ", ".join(
                f"{op['operator']} {100 * op['share']:.0f} % ({op['calls'] // steps}/step)" for op in profiles[name]))

    model.eval()
    model.hold_weights()  # trained no further: entities and queries encoded as a loaded run encodes them
    n = min(entities, graph.num_entities)
    ids = list(range(n))
    enc_seconds = {name: 0.0 for name in names}
    with torch.no_grad():
        for name in names:  # warm
            model.set_precision(name)
            model.encode_entities(ids[:64])
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                model.set_precision(name)
                start = time.perf_counter()
                tables = [model.encode_entities(ids[s: s + 256]) for s in range(0, n, 256)]
                enc_seconds[name] += time.perf_counter() - start
    encoding = {name: round(rounds * n / enc_seconds[name], 1) for name in names}
    echo("entities encoded: " + ", ".join(f"{k} {v:.0f}/s" for k, v in encoding.items()) + f" ({n} entities x {rounds})")

    test = graph.splits["test"][:queries]
    table = torch.cat(tables).float()
    q_seconds = {name: 0.0 for name in names}
    with torch.no_grad():
        for r in range(rounds + 1):
            for name in (names if r % 2 == 0 else names[::-1]):
                model.set_precision(name)
                start = time.perf_counter()
                for s in range(0, len(test), 64):
                    chunk = test[s: s + 64]
                    vectors = model.encode_queries(chunk[:, 0].tolist(), chunk[:, 1].tolist())
                    (vectors.float() @ table.t()).topk(min(10, table.shape[0]), dim=1)
                if r:  # the first round warms
                    q_seconds[name] += time.perf_counter() - start
    answering = {name: round(rounds * len(test) / q_seconds[name], 1) for name in names}
    echo("queries answered: " + ", ".join(f"{k} {v:.0f}/s" for k, v in answering.items()) + f" ({len(test)} x {rounds})")

    quality = _same_steps(recipe_path, overrides or [], mrr_steps, echo) if mrr_steps and both else None
    ratio = {"limit": round(limit["bf16"]["gflops"] / limit["fp32"]["gflops"], 2)}
    if both:
        ratio = {"training": round(training["bf16"]["triples_per_s"] / training["fp32"]["triples_per_s"], 2),
                 "entities": round(encoding["bf16"] / encoding["fp32"], 2),
                 "queries": round(answering["bf16"] / answering["fp32"], 2), **ratio}
    echo("bf16 / fp32: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    return {"recipe": str(recipe_path), "overrides": list(overrides or []), "cpu": cpu,
            "bf16_hardware": hardware, "timed": list(names), "threads": torch.get_num_threads(), "batch": b, "steps": steps,
            "rounds": rounds, "limit": limit, "training": training, "entities_per_s": encoding,
            "queries_per_s": answering, "ratio": ratio, "same_steps": quality, "profile": profiles or None}


def _same_steps(recipe_path: Path, overrides: list[str], steps: int, echo) -> dict:
    """The recipe trained ``steps`` steps from the same seed in fp32 and in bf16 (each evaluated on the test split in
    the precision it trained in): MRR and Hits@10 of each, and their difference."""
    import os

    from kgc.encoding.precision import ENV

    out = {}
    forced = os.environ.pop(ENV, None)  # $KGC_AMP would stand for both runs' train.amp
    try:
        _train_both(recipe_path, overrides, steps, echo, out)
    finally:
        if forced is not None:
            os.environ[ENV] = forced
    out["mrr_difference"] = round(out["bf16"]["mrr"] - out["fp32"]["mrr"], 4)
    out["steps"] = steps
    return out


def _train_both(recipe_path: Path, overrides: list[str], steps: int, echo, out: dict) -> None:
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.training.loop import train

    with tempfile.TemporaryDirectory(prefix="kgc-precision-") as tmp:
        for name, amp in (("fp32", "off"), ("bf16", "bf16")):
            recipe = load_recipe(recipe_path, [*overrides, f"train.max_steps={steps}", f"train.amp={amp}",
                                               "eval.validate_every_epoch=false", "train.trackers=[]"])
            path = train(recipe, out=Path(tmp) / name, progress=False, echo=lambda line: None)
            results = LinkPredRun(path, echo=None).evaluate("test", progress=False)
            both = results["both"]["realistic"]
            out[name] = {"mrr": round(both["inverse_harmonic_mean_rank"], 4), "hits_at_10": round(both["hits_at_10"], 4),
                         "precision": results["kgc"]["precision"]}
            echo(f"after {steps} steps in {name}: test MRR {out[name]['mrr']:.4f}, H@10 {out[name]['hits_at_10']:.4f}")
