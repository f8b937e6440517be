"""Link prediction's benchmarks (``kgc bench inference / train / loss / index / structure``), each run as ratios
inside one process; :mod:`kgc.bench` finds them through ``LinkPredTask.bench_commands``, which reads their
command-line descriptions in :mod:`kgc.linkpred.bench.commands`.

``kgc bench inference``: answer every test query of a dataset in both directions with each
conditioner on the same backbone, entity embeddings already cached (computed once and shared). Each
conditioner then pays only what its design requires: the bi-encoder a full encoder pass per query; the
router its per-entity layer-t states (reported as one-time preparation) and the top k layers per
query; the tri-encoders and Hyper-CL one pass per relation and a composition per query.

``kgc bench train``: training triples/s of a recipe with full fine-tuning against
``encoder.trainable_layers = n``, on the same fixed batches. The partial run first fills its layer
cache with one untimed pass over those batches, so the figure is the steady state of epoch ≥ 2 (or
of any run after the first that uses the same backbone).

``kgc bench loss``: the recipe's SimKGC objective alone (forward and backward) on batches of the recipe's graph, random
unit vectors in place of the towers: the false-negative masks by binary search in the sorted train keys (what
training runs) against the same masks by ``torch.isin`` (the reference they replaced), equal losses checked, s/step
of each and their ratio.

``kgc bench index``: the entity index types (flat, ivf, hnsw, ivfpq) on synthetic clustered unit vectors at a
chosen scale (1M × 384 is the figure in docs/scale.md): build time, index bytes (held in RAM) per entity, queries/s of
one batched search (best of ``repeats``, FAISS on every core) and recall@10 against the exact flat search, with a
sweep over the search-time parameters (nprobe, ef_search, and ivfpq's exact re-scoring factor) of each approximate
type.

``kgc bench inputs``: the host's share of a training step (:func:`bench_inputs`): a batch's inputs built one entity
at a time, as before in the step, and as ``task.prepare`` builds them a step ahead, checked equal; then steps with a
tiny BERT, inputs in the step against prefetched.

``kgc bench structure``: PyKEEN alone on its own bundled copy of the recipe's dataset (:func:`bench_structure`).

``kgc bench scale``: the whole path, each stage its own ``kgc`` process, on generated graphs of growing size
(:mod:`kgc.linkpred.bench.scale`).

``kgc bench serve --add N`` asks :func:`added_entities_request` (``LinkPredTask.bench_write_request``) for its
write: ``POST /entities`` with texts like the graph's.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kgc.data.graph import load_graph
from kgc.encoding.backbone import resolve_backbone
from kgc.errors import KGCError
from kgc.linkpred.model import QueryEngine, build_model
from kgc.profiling import collect, section
from kgc.recipe import load_recipe
from kgc.registry import CONDITIONERS
from kgc.training.common import make_optimizer, seed_everything
from kgc.training.task import task_class


@torch.no_grad()
def bench_inference(*, dataset: str = "wn18rr", conditioners=None,
                    limit: int | None = None, batch_size: int = 256, overrides: list[str] | None = None,
                    echo=print, progress: bool = True) -> dict:
    base = [f"data.dataset={dataset}", "model.shared_towers=true", *(overrides or [])]
    recipe = load_recipe(None, base)
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    triples = graph.splits["test"][:limit]
    queries = np.concatenate([triples, graph.inverse_queries(triples)])
    folder = resolve_backbone(recipe.model.backbone)
    seed_everything(0)
    table, table_seconds, rows = None, 0.0, []
    for name in conditioners or list(CONDITIONERS):  # "router" or, with model options, "router:cross_attend=top,router_layers=2"
        kind, _, opts = name.partition(":")
        extra = [f"model.{kv.strip()}" for kv in opts.split(",") if kv.strip()]
        model, _ = build_model(load_recipe(None, base + [f"model.conditioner={kind}", *extra]), graph, folder)
        model.eval()
        if table is None:  # the cached entity embeddings, shared by every conditioner (same tail tower)
            start = time.perf_counter()
            table = model.entity_table(batch_size, progress=progress)
            table_seconds = time.perf_counter() - start
            echo(f"entity embeddings: {graph.num_entities} entities in {table_seconds:.1f}s (computed once, shared)")
        start = time.perf_counter()
        engine = QueryEngine(model, batch_size=batch_size, progress=progress, entity_table=table)
        prep = time.perf_counter() - start
        start = time.perf_counter()
        for s in range(0, len(queries), batch_size):
            chunk = queries[s: s + batch_size]
            scores = engine(chunk[:, 0], chunk[:, 1]) @ table.t()  # (batch, entities)
            scores.topk(10, dim=1)
        seconds = time.perf_counter() - start
        rows.append({"conditioner": name, "prepare_seconds": round(prep, 2), "query_seconds": round(seconds, 3),
                     "_seconds": max(seconds, 1e-9),
                     "queries": int(len(queries)), "queries_per_s": round(len(queries) / seconds, 1),
                     "passes": dict(engine.passes)})
        echo(f"{name:<10} prepare {prep:8.2f}s   answer {len(queries)} queries {seconds:8.2f}s")
    base = next((r["_seconds"] for r in rows if r["conditioner"] == CONDITIONERS.default), None)
    for row in rows:
        exact = row.pop("_seconds")
        row[f"speedup_vs_{CONDITIONERS.default}"] = None if base is None else round(base / exact, 1)
    return {"dataset": graph.source, "backbone": recipe.model.backbone, "entities": graph.num_entities,
            "entity_table_seconds": round(table_seconds, 2), "threads": torch.get_num_threads(), "rows": rows}


def _timed_steps(task, model, criterion, optimizer, batches) -> float:
    """Seconds for full optimisation steps (forward, loss, backward, AdamW) over ``batches``."""
    start = time.perf_counter()
    for batch in batches:
        with section("step"):
            loss = task.batch_loss(model, criterion, batch)
            optimizer.zero_grad(set_to_none=True)
            with section("backward (trained towers, loss)"):
                loss.backward()
            with section("optimiser (AdamW)"):
                optimizer.step()
    return time.perf_counter() - start


def bench_train(recipe_path: Path, *, trainable_layers: int = 2, steps: int = 5, batch_size: int = 32,
                overrides: list[str] | None = None, full: bool = True, echo=print) -> dict:
    """``full=False``: the partial row alone (its pace, e.g. one row of a conditioner table), no speed-up."""
    rows, graph = [], None
    for layers in (("all",) if full else ()) + (trainable_layers,):
        recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}", f"encoder.trainable_layers={layers}",
                                           *(overrides or [])])
        if graph is None:  # both modes read the same data section
            graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
        task = task_class(recipe.task).training(recipe, graph=graph)  # its model (a tail tower that does not train is frozen),
        # objective
        seed_everything(recipe.train.seed)
        rng = np.random.default_rng(recipe.train.seed)
        batches = [task.examples[rng.choice(len(task.examples), batch_size, replace=False)] for _ in range(steps)]
        model, _ = task.build_model(resolve_backbone(recipe.model.backbone))
        model.attach_layer_cache(recipe)
        criterion = task.make_loss(torch.device("cpu"))
        optimizer = make_optimizer([model, criterion], recipe.train.lr, recipe.train.weight_decay)
        model.train()
        start = time.perf_counter()
        task.before_step(model, criterion, 0)  # loss.table_negatives: the entity table, as training's first step
        table_seconds = time.perf_counter() - start

        warm = batches if model.layer_cache is not None else batches[:1]  # fill the cache / warm allocations
        warm_seconds = _timed_steps(task, model, criterion, optimizer, warm)
        with collect() as parts:  # where a steady-state step's time goes (kgc.profiling sections)
            seconds = _timed_steps(task, model, criterion, optimizer, batches)
        rate = steps * batch_size / seconds
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows.append({"trainable_layers": layers, "triples_per_s": round(rate, 2), "seconds": round(seconds, 2),
                     "warmup_seconds": round(warm_seconds, 2), "trainable_params": trainable,
                     "entity_table_seconds": round(table_seconds, 2) if criterion.table is not None else None,
                     "cache_layer": None if model.layer_cache is None else model.layer_cache.layer,
                     "seconds_per_step": {k: round(v / steps, 4) for k, v in parts.items()}})
        echo(f"trainable_layers={layers}: {rate:.1f} triples/s over {steps} steps of {batch_size} "
             f"(warm-up {warm_seconds:.1f}s" + (f"; entity table {table_seconds:.1f}s, once per refresh)"
                                                 if criterion.table is not None else ")"))
        step = parts.get("step", seconds) / steps
        for name, total in sorted(parts.items(), key=lambda kv: -kv[1]):
            if name != "step":
                echo(f"    {name:<40} {total / steps:8.3f} s/step  {100 * total / steps / step:5.1f} %")
        model.save_cache()
    ratio = rows[-1]["triples_per_s"] / rows[0]["triples_per_s"] if full else None
    if full:
        echo(f"speed-up of trainable_layers={trainable_layers} over full fine-tuning: {ratio:.2f}x")
    return {"recipe": str(recipe_path), "rows": rows, "speedup": None if ratio is None else round(ratio, 2),
            "threads": torch.get_num_threads()}


# ---------------------------------------------------------------- kgc bench loss


@contextlib.contextmanager
def _isin_masks():
    """A context in which the loss builds its masks with ``torch.isin`` over every (query, candidate) key, the
    reference :func:`kgc.linkpred.loss.is_known` and :func:`~kgc.linkpred.loss.false_negative_mask_all` replaced."""
    from kgc.linkpred import loss

    saved = loss.is_known, loss.false_negative_mask_all
    loss.is_known = lambda keys, train_keys: torch.isin(keys, train_keys)
    loss.false_negative_mask_all = lambda hr, gold, train_keys, n: loss.false_negative_mask(
        hr, gold, torch.arange(n, device=hr.device), train_keys, n)
    try:
        yield
    finally:
        loss.is_known, loss.false_negative_mask_all = saved


def bench_loss(recipe_path: Path, *, steps: int = 20, batch_size: int | None = None,
               overrides: list[str] | None = None, echo=print) -> dict:
    recipe = load_recipe(recipe_path, overrides or [])
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    task = task_class(recipe.task).training(recipe, graph=graph)  # its objective, as training makes it
    b = batch_size or recipe.train.batch_size
    keys = torch.as_tensor(graph.train_keys)
    r2, n, dim = 2 * graph.num_relations, graph.num_entities, 384
    gen = torch.Generator().manual_seed(recipe.train.seed)
    rows = keys[torch.randint(0, keys.numel(), (steps, b), generator=gen)]
    batches = [(k // n // r2, k // n % r2, k % n) for k in rows]  # (heads, rels, tails) of real train triples
    unit = lambda *shape: torch.nn.functional.normalize(torch.randn(*shape, dim, generator=gen), dim=-1)
    table = unit(n) if recipe.loss.table_negatives else None
    vectors = [(unit(b), unit(b), unit(b)) for _ in range(steps)]
    figures, losses = {}, {}
    for name, context in (("binary search", contextlib.nullcontext), ("torch.isin", _isin_masks)):
        criterion = task.make_loss(torch.device("cpu"))
        criterion.set_table(table)
        out = []
        with context():
            start = time.perf_counter()
            for (heads, rels, tails), (q, t, h) in zip(batches, vectors):
                q = q.clone().requires_grad_(True)
                tail, head = (None, None) if criterion.table_tails else (t, h)
                loss = criterion(q, tail, head, heads=heads, rels=rels, tails=tails, train_keys=keys,
                                 num_entities=n, num_relations2=r2)
                loss.backward()
                out.append(float(loss.detach()))
            figures[name] = (time.perf_counter() - start) / steps
        losses[name] = out
    if losses["binary search"] != losses["torch.isin"]:
        raise KGCError("kgc bench loss: the two masks gave different losses (a bug in kgc.linkpred.loss)")
    ratio = figures["torch.isin"] / figures["binary search"]
    for name, sec in figures.items():
        echo(f"{name:<14} {1000 * sec:9.2f} ms/step (batch {b}, {n:,} entities, {keys.numel():,} train keys"
             + (", the entity-table block" if table is not None else "") + ")")
    echo(f"binary search over torch.isin: {ratio:.1f}x faster; losses equal over {steps} steps")
    return {"recipe": str(recipe_path), "batch_size": b, "entities": n, "train_keys": int(keys.numel()),
            "table": table is not None, "ms_per_step": {k: round(1000 * v, 3) for k, v in figures.items()},
            "speedup": round(ratio, 2), "threads": torch.get_num_threads()}


# ---------------------------------------------------------------- kgc bench inputs


def _one_at_a_time(bank, heads, tails, relation_ids, max_tokens: int) -> tuple[dict, dict]:
    """A training step's inputs as kgc built them before the array code: a token list per entity (neighbour names
    appended one row at a time) and a tensor per padded row. The reference ``kgc bench inputs`` checks against."""
    special = bank.special

    def pad_rows(seqs):
        n, width = len(seqs), max(len(ids) for ids, _ in seqs)
        out = {k: torch.zeros((n, width), dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")}
        out["input_ids"].fill_(special.pad_id)
        for i, (ids, tt) in enumerate(seqs):
            out["input_ids"][i, : len(ids)] = torch.tensor(ids)
            out["token_type_ids"][i, : len(tt)] = torch.tensor(tt)
            out["attention_mask"][i, : len(ids)] = 1
        return out

    queries = [special.wrap_pair(bank.entity_ids(int(h), int(t)), r, max_tokens)
               for h, t, r in zip(heads, tails, relation_ids)]
    ents = [special.wrap(bank.entity_ids(int(e), int(x)), max_tokens)
            for e, x in zip(np.concatenate([tails, heads]), np.concatenate([heads, tails]))]
    return pad_rows(queries), pad_rows(ents)


def _arrays(bank, heads, tails, relation_ids, max_tokens: int) -> tuple[dict, dict]:
    """The same inputs as training builds them now (``TextBank.entity_batch``, ``SpecialTokens.wrap_pad`` / ``pad``)."""
    special = bank.special
    sentences = bank.entity_batch(heads, tails)
    queries = special.pad([special.wrap_pair(s, r, max_tokens) for s, r in zip(sentences, relation_ids)])
    return queries, bank.entity_inputs(np.concatenate([tails, heads]), np.concatenate([heads, tails]))


def _unique_rows_by_sort(batch: dict) -> dict:
    """A padded batch's distinct rows as training found them before issue 50: ``torch.unique(dim=0)`` over the ids
    and token types, the first row of each, trimmed to their longest (kept here as the reference it was)."""
    key = torch.cat([batch["input_ids"], batch["token_type_ids"]], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(uniq) == len(key):
        return batch
    first = torch.full((len(uniq),), len(key), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(key)), reduce="amin")
    sub = {k: v[first] for k, v in batch.items()}
    width = int(sub["attention_mask"].sum(1).max())
    return {k: v[:, :width] for k, v in sub.items()}


def _before(bank, heads, tails, relation_ids, max_tokens: int) -> tuple[dict, dict]:
    """A step's inputs as training built them before issue 50, in the step: the arrays' inputs, then each tower's
    distinct rows by ``torch.unique(dim=0)``."""
    queries, ents = _arrays(bank, heads, tails, relation_ids, max_tokens)
    return _unique_rows_by_sort(queries), _unique_rows_by_sort(ents)


def _same_rows(prepared, padded: dict) -> bool:
    """Whether :class:`~kgc.encoding.inputs.EncoderInputs` hold, row for row, the padded batch's tokens."""
    width = padded["input_ids"].shape[1]
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        rows = torch.cat([torch.nn.functional.pad(g[key][:, :width], (0, max(0, width - g[key].shape[1])))
                          for g in prepared.groups])[prepared.inverse]
        if not torch.equal(rows * padded["attention_mask"], padded[key] * padded["attention_mask"]):
            return False
    return True


def _tiny_backbone(recipe, folder: Path) -> Path:
    """A 2-layer, 32-wide BERT with random weights and the recipe's tokenizer: a step whose model costs little, so
    what is left is the host's."""
    from transformers import BertConfig, BertModel

    from kgc.encoding.backbone import load_tokenizer

    tokenizer = load_tokenizer(resolve_backbone(recipe.model.backbone))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max(64, recipe.data.max_tokens + 2),
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # dropout: CPU work, not host
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _as_on_a_gpu(model, recipe) -> None:
    """The recipe's length groups as a GPU run resolves them (``train.length_bucket: auto`` is 8 there)."""
    from kgc.encoding.inputs import resolve_bucket

    for encoder in model.encoders:
        encoder.length_bucket = resolve_bucket(recipe.train.length_bucket, "cuda")


def _step_sections(recipe, graph, backbone: Path, batches, *, ahead: bool) -> dict[str, float]:
    """ms per step of each part of a training step with the tiny backbone: its inputs as the loop waits for them
    (built in the step, or taken from the prefetch thread), the towers, the loss, backward, AdamW (fused, as on a
    GPU), and the whole."""
    from kgc.training.prefetch import Prefetcher

    task = task_class(recipe.task).training(recipe, graph=graph)
    model, _ = task.build_model(backbone)
    _as_on_a_gpu(model, recipe)
    criterion = task.make_loss(torch.device("cpu"))
    model.train()
    optimizer = make_optimizer([model, criterion], recipe.train.lr, recipe.train.weight_decay, fused=True)
    times: dict[str, float] = {}
    feed = Prefetcher(batches, lambda rows: task.prepare(model, criterion, rows), enabled=ahead)
    it = iter(feed)
    for i in range(len(batches)):
        t0 = time.perf_counter()
        with collect() as parts:
            batch = next(it) if ahead else task.prepare(model, criterion, batches[i])
            t1 = time.perf_counter()
            loss = task.batch_loss(model, criterion, batch)
            t2 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t3 = time.perf_counter()
            optimizer.step()
            criterion.after_step()
        t4 = time.perf_counter()
        if i == 0:
            continue  # the first step's one-off work (allocations) left out
        towers = parts.get("query tower forward", 0.0) + parts.get("tail tower forward", 0.0)
        for name, sec in (("inputs", t1 - t0), ("towers", towers), ("loss", t2 - t1 - towers), ("backward", t3 - t2),
                          ("optimizer", t4 - t3), ("step", t4 - t0)):
            times[name] = times.get(name, 0.0) + sec
    feed.close()
    return {k: 1000 * v / max(1, len(batches) - 1) for k, v in times.items()}


def bench_inputs(recipe_path: Path, *, steps: int = 10, batch_size: int | None = None,
                 overrides: list[str] | None = None, step_steps: int = 6, echo=print) -> dict:
    """The host's share of a training step, what a GPU waits on unless it is done ahead:

    1. the token inputs of a batch's queries (head text under its relation) and of its tails and heads (the tail
       tower, self-negatives), built three ways on the same batches of real train triples — one entity at a time
       (the reference), as training built them before issue 50 in the step (arrays, then ``torch.unique`` over each
       tower's rows), and as it prepares them now (``task.prepare``: pairs on the arrays, hashed distinct rows,
       length groups; run in the prefetch thread) — each checked to hold the same tokens;
    2. the encoder's token positions with length groups against padding to the batch's longest;
    3. ``step_steps`` training steps with a tiny random BERT (2 layers, 32 wide: the model costs little) at the
       recipe's batch, inputs built in the step against prefetched, by part; "outside the model" is the step less
       the towers and backward."""
    import tempfile

    from kgc.data.texts import TextBank
    from kgc.encoding.backbone import load_tokenizer

    recipe = load_recipe(recipe_path, [*(overrides or []), *([f"train.batch_size={batch_size}"] if batch_size else [])])
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    bank = TextBank(graph, load_tokenizer(resolve_backbone(recipe.model.backbone)), max_tokens=recipe.data.max_tokens,
                    neighbor_text=recipe.data.neighbor_text, max_neighbors=recipe.data.max_neighbors,
                    short_description_words=recipe.data.short_description_words)
    b, m = recipe.train.batch_size, recipe.data.max_tokens
    train = np.asarray(graph.splits["train"], dtype=np.int64)
    rng = np.random.default_rng(recipe.train.seed)
    batches = [train[rng.integers(0, len(train), b)] for _ in range(steps)]
    with tempfile.TemporaryDirectory() as tmp:
        tiny = _tiny_backbone(recipe, Path(tmp) / "tiny")
        task = task_class(recipe.task).training(recipe.model_copy(update={"model": recipe.model.model_copy(
            update={"backbone": str(tiny)})}), graph=graph)
        model, _ = task.build_model(tiny)
        _as_on_a_gpu(model, recipe)
        criterion = task.make_loss(torch.device("cpu"))
        figures, built = {}, {}
        ways = (("one at a time", lambda h, r, t: _one_at_a_time(bank, h, t, [bank.relation_ids[int(x)] for x in r], m)),
                ("before (in the step)", lambda h, r, t: _before(bank, h, t, [bank.relation_ids[int(x)] for x in r], m)),
                ("prepared (a step ahead)", lambda h, r, t: task.prepare(model, criterion, np.stack([h, r, t], 1))))
        for name, build in ways:
            start, out = time.perf_counter(), []
            for rows in batches:
                out.append(build(rows[:, 0], rows[:, 1], rows[:, 2]))
            figures[name], built[name] = (time.perf_counter() - start) / steps, out
        padded = positions = 0
        for old, new, now in zip(built["one at a time"], built["before (in the step)"], built["prepared (a step ahead)"]):
            arrays = _arrays(bank, now.rows[:, 0], now.rows[:, 2], [bank.relation_ids[int(x)] for x in now.rows[:, 1]],
                             m)
            same = all(torch.equal(a[k], c[k]) for a, c in zip(arrays, old) for k in c)
            if not same or not _same_rows(now.entities, arrays[1]) or (
                    not isinstance(now.query, tuple) and not _same_rows(now.query, arrays[0])):
                raise KGCError("kgc bench inputs: the arrays built other inputs than the reference "
                               "(a bug in kgc.data.texts or kgc.encoding.inputs)")
            for prepared, before in ((now.entities, new[1]),) + (() if isinstance(now.query, tuple)
                                                                   else ((now.query, new[0]),)):
                padded += before["input_ids"].numel()
                positions += prepared.tokens
        echo(f"a step's inputs (batch {b}: {b:,} queries + {2 * b:,} tail-tower texts, {graph.num_entities:,} "
             f"entities, max_tokens {m}):")
        for name, sec in figures.items():
            echo(f"  {name:<24} {1000 * sec:9.2f} ms/step")
        echo(f"  the same tokens over {steps} steps; the encoders run over {positions:,} token positions in length "
             f"groups against {padded:,} padded to each batch's longest ({1 - positions / max(padded, 1):.0%} fewer)")
        sections = {}
        for name, ahead in (("inputs in the step", False), ("prefetched", True)):
            sections[name] = _step_sections(task.recipe, graph, tiny, batches[:max(2, step_steps)], ahead=ahead)
    echo("a training step with a tiny BERT (2 layers, 32 wide) on this CPU, ms/step:")
    for name, part in sections.items():
        outside = part["step"] - part["towers"] - part["backward"]
        part["outside_model"] = outside
        echo(f"  {name:<20} step {part['step']:8.1f}   outside the model {outside:7.1f}   (inputs "
             f"{part['inputs']:.1f}, loss {part['loss']:.1f}, optimizer {part['optimizer']:.1f}; towers "
             f"{part['towers']:.1f}, backward {part['backward']:.1f})")
    return {"recipe": str(recipe_path), "batch_size": b, "entities": graph.num_entities, "steps": steps,
            "ms_per_step": {k: round(1000 * v, 3) for k, v in figures.items()},
            "speedup": round(figures["before (in the step)"] / figures["prepared (a step ahead)"], 2),
            "token_positions": {"length_groups": positions, "padded": padded},
            "host_bound_triples_per_s": {k: round(b / v, 1) for k, v in figures.items()},
            "step_ms": {k: {n: round(v, 2) for n, v in part.items()} for k, part in sections.items()},
            "threads": torch.get_num_threads()}


# ---------------------------------------------------------------- kgc bench rules


def bench_rules(recipe_path: Path, *, split: str = "test", batch_size: int = 64, overrides: list[str] | None = None,
                echo=print) -> dict:
    """Mined rules scoring a split's queries (both directions, in batches as evaluation asks): a small graph's
    per-relation tables (``RuleModel.tables``, every head's row computed at a relation's first query and kept)
    against rows computed for each batch's heads alone, on the same rules; the scores must be equal."""
    from kgc.linkpred.structure.rules import RuleModel, RulesOptions, mine_graph

    recipe = load_recipe(recipe_path, ["structure.model=rules", *(overrides or [])])
    config = recipe.structure
    if not isinstance(config, RulesOptions):  # the override above makes it one; a recipe cannot say otherwise
        raise KGCError(f"{recipe_path}: kgc bench rules needs structure.model=rules")
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    r2 = 2 * graph.num_relations
    start = time.perf_counter()
    rules, edges = mine_graph(config, graph)
    mined = time.perf_counter() - start
    if split not in graph.splits:
        raise KGCError(f"--split {split}: choose one of {', '.join(graph.splits)}")
    queries = graph.both_directions(split)  # (head, r, ?) then (tail, r + R, ?)
    heads, rels = queries[:, 0], queries[:, 1]
    seconds, scored = {}, {}
    for name in ("tables", "rows"):
        model = RuleModel(rules, edges, graph.num_entities, r2, config.rule_aggregation)
        if name == "rows":
            model.tables = None
        elif model.tables is None:
            raise KGCError(f"{graph.num_entities:,} entities × {r2} relations: the tables would pass TABLE_BYTES "
                           "(kgc.linkpred.structure.rules); this graph is scored by rows only")
        start = time.perf_counter()
        scored[name] = torch.cat([model.scores(heads[i: i + batch_size], rels[i: i + batch_size])
                                  for i in range(0, len(heads), batch_size)])
        seconds[name] = time.perf_counter() - start
    if not torch.equal(scored["tables"], scored["rows"]):
        raise KGCError("kgc bench rules: the tables gave other scores than the rows (a bug in kgc.linkpred.structure.rules)")
    ratio = seconds["rows"] / seconds["tables"]
    echo(f"{len(rules):,} rules mined in {mined:.1f} s ({graph.num_entities:,} entities, {r2} relations with the "
         f"inverses); {len(heads):,} {split} queries in batches of {batch_size}")
    for name, sec in seconds.items():
        echo(f"{name:<7} {sec:8.2f} s  ({len(heads) / sec:,.0f} queries/s)")
    echo(f"tables over rows: {ratio:.1f}x faster; the scores equal")
    return {"recipe": str(recipe_path), "split": split, "queries": len(heads), "batch_size": batch_size,
            "rules": len(rules), "mine_seconds": round(mined, 2),
            "seconds": {k: round(v, 3) for k, v in seconds.items()}, "speedup": round(ratio, 2)}


# ---------------------------------------------------------------- kgc bench index


def clustered_unit_vectors(n: int, dim: int, *, clusters: int = 2000, seed: int = 0, stream: int = 0,
                           spread: float = 1.2, latent: int = 24, chunk: int = 65_536) -> np.ndarray:
    """(n, dim) float32 unit vectors from a mixture of ``clusters`` Gaussians on the sphere; deterministic.

    The mixture (centres, noise shape) depends on ``seed`` only; ``stream`` draws an independent sample of it
    (0: the database, 1: held-out query points). Centres are random directions inside a ``latent``-dimensional
    subspace, so neighbouring clusters overlap as topics do; a point is its centre + ``spread`` · noise, the noise
    a Gaussian whose variance along the i-th axis of a random rotation is ∝ 1/i (≈ 26 effective dimensions at
    384: real sentence embeddings are far from isotropic), then normalised. Generated in chunks of float32."""
    rng = np.random.default_rng(seed)
    latent = min(latent, dim)
    basis = rng.standard_normal((latent, dim), dtype=np.float32)
    centres = rng.standard_normal((clusters, latent), dtype=np.float32) @ basis  # (clusters, dim)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scales = 1.0 / np.sqrt(np.arange(1, dim + 1))
    scales /= np.sqrt((scales ** 2).sum())  # E|noise|² = 1
    mix = (scales[:, None] * rotation.T).astype(np.float32)  # (dim, dim): standard normal -> shaped noise
    out = np.empty((n, dim), np.float32)
    draw = np.random.default_rng([seed, stream])
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = centres[draw.integers(0, clusters, m)] + spread * (draw.standard_normal((m, dim), dtype=np.float32) @ mix)
        out[s: s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top-k among its returned top-k. found, truth (queries, k)."""
    hit = (found[:, :, None] == truth[:, None, :]) & (found[:, :, None] >= 0)  # (queries, k, k)
    return float(hit.any(2).sum(1).mean() / truth.shape[1])


def _best_search_seconds(index, queries: np.ndarray, k: int, repeats: int) -> tuple[float, np.ndarray]:
    from kgc.linkpred.index.types import search_index

    best, ids = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        _, ids = search_index(index, queries, k)
        best = min(best, time.perf_counter() - start)
    return best, ids


def bench_index(*, entities: int = 1_000_000, dim: int = 384, queries: int = 1000,
                types=("flat", "ivf", "hnsw", "ivfpq"), nprobe=(8, 16, 32, 64, 128),
                ef_search=(16, 32, 64, 128), rescore=(1, 10), build: dict | None = None, k: int = 10,
                clusters: int = 2000, seed: int = 0, threads: int | None = None, repeats: int = 3,
                echo=print) -> dict:
    """Build each index type over ``entities`` synthetic vectors and search ``queries`` held-out ones.

    ``build``: build keys of the recipe's ``index:`` section (nlist, hnsw_m, ef_construction, pq_bytes,
    train_size), each given to the types that read it. One row per (type, search setting): ivf once per
    ``nprobe``, ivfpq once per (``nprobe``, ``rescore``) — rescore 1 is plain PQ, above 1 a row labelled
    ``ivfpq+rescore`` whose k × rescore candidates are re-scored exactly against the table (here the generated
    array in RAM, as a warm page cache holds the run's memory-mapped entities.npy) — hnsw once per ``ef_search``.
    ``bytes_per_entity`` is what the index holds in RAM (its serialised size / entities); ``mmap_bytes_per_entity``
    the table a re-scored search reads from disk / the page cache (4 · dim; 0 for the others). Ground truth is the
    exact flat search (always run, since every row's speed-up is against it)."""
    import os

    import faiss

    from kgc.linkpred.index import types as index_types

    unknown = [t for t in types if t not in index_types.TYPES]
    if unknown or not types:
        raise KGCError(f"--types {','.join(unknown)}: unknown index type. Choose from "
                       f"{', '.join(index_types.TYPES)}.")
    if min(entities, dim, queries, k) < 1 or k > entities:
        raise KGCError(f"need entities >= k >= 1, dim >= 1 and queries >= 1 (got entities={entities}, k={k}, "
                       f"dim={dim}, queries={queries})")
    before = faiss.omp_get_max_threads()
    threads = threads or os.cpu_count() or 1
    faiss.omp_set_num_threads(threads)
    try:
        start = time.perf_counter()
        base = clustered_unit_vectors(entities, dim, clusters=clusters, seed=seed)  # (entities, dim)
        held_out = clustered_unit_vectors(queries, dim, clusters=clusters, seed=seed, stream=1)  # (queries, dim)
        noisy = held_out + 0.1 / np.sqrt(dim) * np.random.default_rng([seed, 2]).standard_normal(
            held_out.shape, dtype=np.float32)
        xq = noisy / np.linalg.norm(noisy, axis=1, keepdims=True)
        data_seconds = time.perf_counter() - start
        echo(f"data: {entities} × {dim} clustered unit vectors ({clusters} clusters) + {queries} held-out queries "
             f"in {data_seconds:.1f}s; FAISS {faiss.__version__}, {threads} threads")
        rows, flat_seconds, truth = [], None, None
        for kind in dict.fromkeys(["flat", *types]):  # flat first: the ground truth and the speed baseline
            spec = index_types.TYPES[kind]
            keys = {key: v for key, v in (build or {}).items() if key in spec.build and v is not None}
            config = index_types.index_config(None, type=kind, **keys)
            params = index_types.resolve(config, entities, dim)
            index, info = index_types.build(base, params, seed=seed)
            build_seconds = info["train_seconds"] + info["add_seconds"]
            size = index_types.index_bytes(index)
            echo(f"{kind}: {info['factory']} built in {build_seconds:.1f}s (train {info['train_seconds']:.1f}s, "
                 f"add {info['add_seconds']:.1f}s) on {info['device']}, {size / 2**20:.1f} MiB")
            sweep = {"ivf": ("nprobe", nprobe), "ivfpq": ("nprobe", nprobe), "hnsw": ("ef_search", ef_search)}
            key, values = sweep.get(kind, (None, [None]))
            settings = [(v, f) for v in values for f in (rescore if "rescore" in spec.search else [None])]
            for value, factor in settings:
                if key is not None:
                    params = {**params, key: min(value, params["nlist"]) if key == "nprobe" else value}
                if factor is not None:
                    params = {**params, "rescore": factor}
                index_types.set_search_params(index, params)
                searched = index_types.with_rescore(index, base, params)  # ivfpq, rescore > 1: re-scored exactly
                seconds, ids = _best_search_seconds(searched, xq, k, repeats)
                if kind == "flat":
                    flat_seconds, truth = seconds, ids
                if kind == "flat" and "flat" not in types:
                    continue
                rescored = searched is not index
                row = {"type": kind, "label": f"{kind}+rescore" if rescored else kind, "params": dict(params),
                       "factory": info["factory"], "device": info["device"],
                       "build_seconds": round(build_seconds, 2), "train_seconds": info["train_seconds"],
                       "add_seconds": info["add_seconds"], "index_bytes": size,
                       "bytes_per_entity": round(size / entities, 1),
                       "mmap_bytes_per_entity": 4 * dim if rescored else 0, "search_seconds": round(seconds, 4),
                       "queries_per_s": round(queries / seconds, 1),
                       "speedup_vs_flat": round(flat_seconds / seconds, 2),
                       f"recall_at_{k}": round(_recall(ids, truth), 4)}
                rows.append(row)
                what = " ".join(f"{n}={params[n]}" for n in (key, "rescore" if factor is not None else None) if n) \
                    or "exact"
                echo(f"  {what:<22} {row['queries_per_s']:>10.1f} queries/s  {row['speedup_vs_flat']:>7.2f}× flat  "
                     f"recall@{k} {row[f'recall_at_{k}']:.4f}")
            del index
    finally:
        faiss.omp_set_num_threads(before)
    good = [r for r in rows if r[f"recall_at_{k}"] >= 0.95 and r["type"] != "flat"]
    best = max(good, key=lambda r: r["speedup_vs_flat"], default=None)
    small = min(good, key=lambda r: (r["bytes_per_entity"], -r["speedup_vs_flat"]), default=None)
    return {"entities": entities, "dim": dim, "queries": queries, "k": k, "clusters": clusters, "seed": seed,
            "threads": threads, "repeats": repeats, "faiss_version": faiss.__version__,
            "data_seconds": round(data_seconds, 2), "flat_queries_per_s": round(queries / flat_seconds, 1),
            "rows": rows,
            "fastest_at_recall_0.95": None if best is None else {
                "type": best["type"], "params": best["params"], "speedup_vs_flat": best["speedup_vs_flat"],
                f"recall_at_{k}": best[f"recall_at_{k}"]},
            "smallest_at_recall_0.95": None if small is None else {  # least RAM per entity, then fastest
                "type": small["type"], "params": small["params"], "bytes_per_entity": small["bytes_per_entity"],
                "speedup_vs_flat": small["speedup_vs_flat"], f"recall_at_{k}": small[f"recall_at_{k}"]}}


def index_table(result: dict) -> str:
    """The rows of :func:`bench_index` as a markdown table (RAM: the index's bytes per entity; mmap: the table a
    re-scored search reads from disk / the page cache)."""
    k = result["k"]
    lines = [f"| type | parameters | build (s) | index size | RAM bytes / entity | + mmap bytes / entity | "
             f"queries/s | × flat | recall@{k} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        params = ", ".join(f"{key}={v}" for key, v in r["params"].items() if key != "type") or "exact"
        mmap = r.get("mmap_bytes_per_entity", 0)
        lines.append(f"| {r.get('label', r['type'])} | {params} | {r['build_seconds']:.1f} | "
                     f"{r['index_bytes'] / 2**20:,.1f} MiB | {r['bytes_per_entity']:,.0f} | "
                     f"{f'{mmap:,}' if mmap else '–'} | {r['queries_per_s']:,.0f} | {r['speedup_vs_flat']:.1f} | "
                     f"{r[f'recall_at_{k}']:.3f} |")
    return "\n".join(lines)


# datasets PyKEEN ships inside its wheel (no download): kgc's catalog name -> PyKEEN's dataset name
PYKEEN_BUNDLED = {"umls": "UMLS", "kinships": "Kinships", "nations": "Nations"}
STRUCTURE_METRICS = {"mrr": "inverse_harmonic_mean_rank", "hits_at_1": "hits_at_1", "hits_at_3": "hits_at_3",
                     "hits_at_10": "hits_at_10"}


def bench_structure(recipe_path: Path, *, overrides: list[str] | None = None, seeds=(0,), progress: bool = True,
                    echo=print) -> dict:
    """``kgc bench structure``: PyKEEN alone, as a PyKEEN user runs it — ``pipeline(dataset=<its own bundled
    copy>, …)`` with the recipe's ``structure:`` settings and inverse triples, evaluated by PyKEEN on test
    (filtered, both directions, realistic ranks) — the reference for the structure-only row of ``kgc evaluate``
    on a run of the same recipe (kgc trains the same pipeline on its own ids)."""
    import pykeen
    from pykeen.pipeline import pipeline

    from kgc.linkpred.structure.pykeen import pipeline_kwargs
    from kgc.training.common import pick_device

    recipe = load_recipe(recipe_path, overrides)
    config = recipe.structure
    if config is None:
        raise KGCError(f"{recipe_path}: no `structure:` section to run with PyKEEN alone (see recipes/*_fused.yaml)")
    if config.is_rules:
        raise KGCError(f"{recipe_path}: structure.model=rules is not a PyKEEN model; `kgc structure RUN` mines the "
                       "rules in seconds and prints their dev MRR alone")
    name = PYKEEN_BUNDLED.get(recipe.data.dataset) if recipe.data.path is None else None
    if name is None:
        raise KGCError(f"{recipe_path}: data.dataset={recipe.data.dataset!r} is not one PyKEEN ships in its wheel "
                       f"({', '.join(PYKEEN_BUNDLED)}); PyKEEN would download it, and this benchmark runs offline")
    device = pick_device(config.device or recipe.train.device)
    rows = []
    for seed in seeds:
        echo(f"PyKEEN pipeline: {config.model} on PyKEEN's {name}, seed {seed}")
        result = pipeline(dataset=name, dataset_kwargs={"create_inverse_triples": True},
                          **pipeline_kwargs(config, seed=seed, device=device, progress=progress))
        mr = result.metric_results
        row = {"seed": seed, "train_seconds": round(result.train_seconds, 1)}
        row.update({k: round(float(mr.get_metric(f"both.realistic.{m}")), 4) for k, m in STRUCTURE_METRICS.items()})
        rows.append(row)
        echo("  " + "  ".join(f"{k} {v}" for k, v in row.items()))
    mean = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ["train_seconds", *STRUCTURE_METRICS]}
    return {"recipe": str(recipe_path), "dataset": name, "model": config.model,
            "params": config.model_dump(mode="json"), "create_inverse_triples": True, "rows": rows, "mean": mean,
            "pykeen_version": pykeen.get_version(), "device": str(device)}


def structure_table(result: dict, run_results: dict | None = None) -> str:
    """Markdown: PyKEEN alone (mean over seeds), and kgc's structure-only and fused rows of a run's results.json."""
    head = "| | MRR | H@1 | H@3 | H@10 |\n|---|---|---|---|---|\n"
    fmt = lambda name, m: f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in STRUCTURE_METRICS) + " |\n"  # noqa: E731
    seeds = len(result["rows"])
    out = head + fmt(f"PyKEEN alone: pipeline on its {result['dataset']} ({seeds} seed{'s' * (seeds > 1)})",
                     result["mean"])
    if run_results:
        def pick(block):
            return {k: float(block["both"]["realistic"][m]) for k, m in STRUCTURE_METRICS.items()}
        comps = run_results.get("kgc", {}).get("components")
        if comps:
            out += fmt("kgc: text only", pick(comps["text"]))
            fused = run_results["kgc"]["structure"]
            alpha = "alpha per relation" if fused.get("per_relation") else f"alpha {fused['alpha']}"
            out += fmt(f"kgc: structure only ({fused.get('model', result['model'])})", pick(comps["structure"]))
            out += fmt(f"kgc: fused ({alpha})", pick(run_results))
        else:
            out += fmt("kgc run", pick(run_results))
    return out.rstrip("\n")


# ---------------------------------------------------------------- kgc bench serve --add


def added_entities_request(run: Any, n: int, seed: int = 0) -> tuple[str, dict, str]:
    """(path, body, what it does) of the write ``kgc bench serve --add N`` makes while the clients query: ``n``
    entities to add, with texts as long as the graph's (an entity's name and description, renamed)."""
    graph = run.predictor.graph()
    rows = np.random.default_rng(seed).integers(0, graph.num_entities, n)
    entities = [{"id": f"kgc-bench-added-{i}", "name": f"{graph.names[e]} {i}"[:1000],
                 "description": (graph.descriptions[e] or "")[:10_000]} for i, e in enumerate(rows.tolist())]
    return "/entities", {"entities": entities}, f"adding {n} entities"


def tables() -> dict:
    """Markdown of the results, by kind, for :meth:`kgc.linkpred.task.LinkPredTask.bench_tables`."""
    from kgc.linkpred.bench.scale import scale_table

    return {"index": index_table, "structure": structure_table, "scale": scale_table}
