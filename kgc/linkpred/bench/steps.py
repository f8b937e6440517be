"""``kgc bench inputs``: the host's share of a training step (:func:`bench_inputs`): a batch's inputs built one
entity at a time, as before in the step, and as ``task.prepare`` builds them a step ahead, checked equal; then steps
with a tiny BERT, inputs in the step against prefetched (:mod:`kgc.linkpred.bench.commands` describes the command).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from kgc.data.formats import load_graph
from kgc.encoding.backbone import resolve_backbone
from kgc.errors import KGCError
from kgc.profiling import collect
from kgc.recipe import load_recipe
from kgc.training.common import make_optimizer
from kgc.training.task import task_class


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
