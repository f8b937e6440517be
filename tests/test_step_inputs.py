"""A training step that never makes a GPU wait, checked on the CPU (issue 50):

* the step's inputs built on the arrays (``SpecialTokens.wrap_pair_pad``) equal the row-by-row ones;
* distinct rows by hash are exact (a collision falls back to ``np.unique``); length groups cover every row;
* length groups (no work on padding) give the padded path's loss and gradients within 1e-5 in fp32, on UMLS batches
  (``train.length_bucket: auto`` resolves to 8 on a GPU, to the padded path on a CPU);
* prefetched training (inputs built in a thread, a step ahead) trains bit for bit as the plain loop;
* nothing in a step (forward, loss, backward, clipping, fused AdamW) would read a value back from a GPU
  (:func:`kgc.profiling.count_syncs`), where the list path did;
* a compiled encoder (``train.compile``) equals the eager one within 1e-4.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT


# ------------------------------------------------------------------ the inputs, on the arrays


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1000, 1100), max_size=60), st.lists(st.integers(1000, 1100),
                                                                                   max_size=12)),
                min_size=1, max_size=20),
       st.integers(5, 64))
def test_pairs_built_on_the_arrays_equal_the_rows_built_one_by_one(tokenizer_special, rows, max_len):
    from kgc.data.ragged import Ragged

    sp = tokenizer_special
    a, b = [r[0] for r in rows], [r[1] for r in rows]
    ref = sp.pad([sp.wrap_pair(x, y, max_len) for x, y in rows])
    new = sp.wrap_pair_pad(Ragged.from_lists(a), Ragged.from_lists(b), max_len)
    for key in ref:
        assert torch.equal(ref[key], new[key]), key


@pytest.fixture(scope="module")
def tokenizer_special(tokenizer):
    from kgc.data.texts import SpecialTokens

    return SpecialTokens.from_tokenizer(tokenizer)


def test_distinct_rows_are_exact_even_when_hashes_collide(monkeypatch):
    from kgc.encoding import inputs

    rng = np.random.default_rng(0)
    key = rng.integers(0, 5, (400, 6))
    key[100:200] = key[:100]
    for mix in (inputs._MIX, np.zeros_like(inputs._MIX)):  # zeros: every row hashes alike, the exact way runs
        monkeypatch.setattr(inputs, "_MIX", mix)
        first, inverse = inputs.distinct_rows(key)
        _, ref_inverse = np.unique(key, axis=0, return_inverse=True)
        assert len(first) == len(np.unique(key, axis=0))
        np.testing.assert_array_equal(key[first][inverse], key)  # every row maps to its own copy
        assert len(set(map(tuple, key[first]))) == len(first)  # no copy twice
        assert (first == np.sort(first)).all() or len(first) == len(set(first))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=300), st.sampled_from([None, 0, 4, 8, 16]),
       st.integers(1, 40))
def test_length_groups_cover_every_row_at_a_width_from_a_fixed_set(lengths, bucket, min_rows):
    from kgc.encoding.inputs import group_widths

    lengths = np.sort(np.asarray(lengths))
    groups = group_widths(lengths, bucket, 50, min_rows)
    ends = [e for e, _ in groups]
    assert ends == sorted(ends) and ends[-1] == len(lengths) and len(set(ends)) == len(ends)
    start = 0
    for end, width in groups:
        assert lengths[start:end].max() <= width <= 50
        if bucket:
            assert width % bucket == 0 or width == 50
            assert end - start >= min_rows or len(groups) == 1 or end == len(lengths)
        start = end
    if not bucket:
        assert groups == [(len(lengths), int(lengths.max()))]


def test_built_inputs_hold_each_distinct_row_once_in_groups_that_map_back():
    from kgc.encoding.inputs import build_inputs

    rng = np.random.default_rng(1)
    n, width = 512, 50
    lengths = rng.integers(3, width + 1, n)
    ids = rng.integers(1000, 2000, (n, width)) * (np.arange(width) < lengths[:, None])
    ids[256:] = ids[:256]  # every row twice
    lengths[256:] = lengths[:256]
    batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(
        (np.arange(width) < lengths[:, None]).astype(np.int64)), "token_type_ids": torch.zeros(n, width, dtype=torch.long)}
    got = build_inputs(batch, bucket=8, cap=50)
    assert got.distinct == len(np.unique(ids, axis=0)) and got.rows == n
    assert got.tokens < 0.7 * got.padded_tokens  # the point: far less padding than the batch's longest for all
    rows = torch.cat([torch.nn.functional.pad(g["input_ids"], (0, width - g["input_ids"].shape[1]))
                      for g in got.groups])
    assert torch.equal(rows[got.inverse], batch["input_ids"])
    assert all(w % 8 == 0 or w == 50 for w in got.widths)


# ------------------------------------------------------------------ the step


def _umls_task(tiny_bert, data_home, *sets):
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "umls_biencoder.yaml",
                         [f"model.backbone={tiny_bert}", "train.batch_size=256", "encoder.trainable_layers=all", *sets])
    task = LinkPredTraining(recipe)
    model, _ = task.build_model(tiny_bert)
    return task, model, task.make_loss(torch.device("cpu"))


def _loss_and_grads(task, model, criterion, batch):
    model.zero_grad(set_to_none=True)
    criterion.zero_grad(set_to_none=True)
    loss = task.batch_loss(model, criterion, task.prepare(model, criterion, batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in list(model.named_parameters()) + list(criterion.named_parameters())
             if p.grad is not None}
    return loss.detach(), grads


def test_length_groups_give_the_padded_loss_and_gradients(tiny_bert, data_home):
    task, model, criterion = _umls_task(tiny_bert, data_home)
    model.eval()  # dropout off: the two paths draw their masks over other row arrangements
    for batch in task.epoch_batches(0)[:3]:
        results = {}
        for bucket in (None, 8):
            for encoder in model.encoders:
                encoder.length_bucket = bucket
            results[bucket] = _loss_and_grads(task, model, criterion, batch)
        (loss_pad, g_pad), (loss_grp, g_grp) = results[None], results[8]
        prepared = task.prepare(model, criterion, batch)
        widths = prepared.query.widths + prepared.entities.widths
        assert len(widths) > 2  # the batch was really cut into groups
        torch.testing.assert_close(loss_grp, loss_pad, atol=1e-5, rtol=0)
        assert g_pad.keys() == g_grp.keys() and len(g_pad) > 10
        for name in g_pad:
            torch.testing.assert_close(g_grp[name], g_pad[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_prepared_step_equals_the_list_path(tiny_bert, data_home):
    """The bi-encoder's pairs built on the arrays and encoded from prepared inputs give the loss of the path that
    builds a list per row (encode_queries → route → encode_unique)."""
    import numpy as np

    from kgc.encoding.backbone import to_device

    task, model, criterion = _umls_task(tiny_bert, data_home)
    model.eval()
    batch = task.epoch_batches(0)[0]
    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    query = model.encode_queries(heads, rels, excludes=tails)
    prepared = task.prepare(model, criterion, batch)
    torch.testing.assert_close(model.conditioner.forward_prepared(prepared.query), query, atol=1e-6, rtol=0)
    ents = model.encode_entities(np.concatenate([tails, heads]), np.concatenate([heads, tails]))
    torch.testing.assert_close(model.encode_prepared_entities(prepared.entities), ents, atol=1e-6, rtol=0)
    assert torch.equal(to_device(prepared.ids, torch.device("cpu"))["heads"], torch.as_tensor(heads))


def test_nothing_in_a_step_would_wait_for_the_gpu(tiny_bert, data_home):
    from kgc.profiling import count_syncs
    from kgc.training.common import make_optimizer

    task, model, criterion = _umls_task(tiny_bert, data_home)
    model.train()
    for encoder in model.encoders:
        encoder.length_bucket = 8  # as on a GPU (auto): length groups, some of them without padding
    optimizer = make_optimizer([model, criterion], 1e-3, 1e-4, fused=True)  # as on a GPU: AdamW's fused kernel
    params = [p for p in list(model.parameters()) + list(criterion.parameters()) if p.requires_grad]
    for batch in task.epoch_batches(0)[:2]:
        prepared = task.prepare(model, criterion, batch)  # the prefetch thread's work: the host's, on purpose
        task.before_step(model, criterion, 0)
        with count_syncs() as syncs:
            loss = task.batch_loss(model, criterion, prepared)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 10.0)
            optimizer.step()
            criterion.after_step()
        assert dict(syncs) == {}
    # the counter sees what it should: the list path reads the condition index back (tolist), the loss figure reads
    with count_syncs() as syncs:
        model.encode_queries(batch[:8, 0], batch[:8, 1], excludes=batch[:8, 2])
        criterion.figures()
    assert syncs["read back: Tensor.tolist"] >= 1 and syncs["read back: Tensor.__float__"] == 1


def test_prefetched_training_is_the_plain_training(tiny_bert, tmp_path, data_home):
    import kgc
    from tests.conftest import write_toy
    from tests.test_cli_smoke import toy_recipe

    toy = write_toy(tmp_path / "TOY")
    losses, weights = {}, {}
    for ahead in (False, True):
        recipe = toy_recipe(tmp_path / f"r{ahead}.yaml", tiny_bert, toy, {"conditioner": "biencoder"},
                            epochs=2, max_steps=6, prefetch=ahead)
        run = kgc.train(recipe, tmp_path / f"run{ahead}", progress=False, echo=None)
        rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
        losses[ahead] = [r["loss"] for r in rows if "loss" in r]
        weights[ahead] = torch.load(run.path / "best.pt", map_location="cpu", weights_only=False)
    assert len(losses[True]) == 6 and losses[True] == losses[False]
    state = {k: v for k, v in weights[True].items() if isinstance(v, dict)}
    assert state
    for part, tensors in state.items():
        for name, value in tensors.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, weights[False][part][name]), (part, name)


def test_the_prefetcher_keeps_order_raises_in_place_and_stops():
    from kgc.training.prefetch import Prefetcher

    made = []
    feed = Prefetcher(range(10), lambda x: made.append(x) or x * x, depth=2)
    assert list(feed) == [x * x for x in range(10)]

    def bad(x):
        if x == 3:
            raise ValueError("item 3")
        return x

    got = []
    with pytest.raises(ValueError, match="item 3"):
        for value in Prefetcher(range(10), bad):
            got.append(value)
    assert got == [0, 1, 2]
    made.clear()
    feed = Prefetcher(range(10_000), lambda x: made.append(x) or x, depth=2)
    for value in feed:
        if value == 5:
            break
    feed.close()
    assert len(made) < 20 and not any(t.name == "kgc-prefetch" and t.is_alive() for t in threading.enumerate())
    assert list(Prefetcher(range(4), lambda x: -x, enabled=False)) == [0, -1, -2, -3]


# ------------------------------------------------------------------ compiled


@pytest.mark.slow
def test_a_compiled_encoder_equals_the_eager_one(tiny_bert):
    from kgc.encoding.backbone import TextEncoder, load_backbone

    encoder = TextEncoder(load_backbone(tiny_bert)).eval()
    encoder.length_bucket, encoder.length_cap = 64, 64  # one width: one graph to build (tens of seconds on a CPU)
    rng = np.random.default_rng(2)
    batches = []
    for n in (96, 70):  # two row counts: the rows are dynamic, no second graph
        lengths = rng.integers(3, 40, n)
        mask = (np.arange(40) < lengths[:, None]).astype(np.int64)
        batches.append({"input_ids": torch.from_numpy(rng.integers(1000, 2000, (n, 40)) * mask),
                        "attention_mask": torch.from_numpy(mask), "token_type_ids": torch.zeros(n, 40, dtype=torch.long)})
    weights = torch.from_numpy(rng.standard_normal((96, encoder.dim)).astype(np.float32))  # a loss: <out, w>
    eager = []
    for batch in batches:
        out = encoder.encode_unique(batch)
        (out * weights[: len(out)]).sum().backward()
        eager.append((out.detach(), {n: p.grad.clone() for n, p in encoder.named_parameters()}))
        encoder.zero_grad(set_to_none=True)
    encoder.compile()
    for batch, (ref, ref_grads) in zip(batches, eager):
        out = encoder.encode_unique(batch)
        (out * weights[: len(out)]).sum().backward()
        torch.testing.assert_close(out.detach(), ref, atol=1e-4, rtol=0)
        for name, p in encoder.named_parameters():
            torch.testing.assert_close(p.grad, ref_grads[name], atol=1e-4, rtol=1e-3,
                                       msg=lambda m, name=name: f"{name}: {m}")
        encoder.zero_grad(set_to_none=True)
