"""The entity table's loss past a size (kgc/linkpred/loss.py): chunked, it is the whole table's loss (value and
gradients) without ever forming the (B, E) block; sampled (``loss.table_sample``), it scores n uniformly drawn rows
with the log-Q correction log(E/n): the whole table's loss when n = E, an unbiased estimate of the table's
partition sum otherwise."""

from __future__ import annotations

import math

import pytest
import torch

from kgc.linkpred import loss as loss_module
from kgc.linkpred.loss import SimKGCLoss

E, R2, D, B = 53, 6, 8, 7  # entities, relations with inverses, width, batch


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


def problem(seed: int = 0):
    """A batch, a table and sorted train keys (hr·E + t) with several known answers per query."""
    g = torch.Generator().manual_seed(seed)
    heads = torch.randint(0, E, (B,), generator=g)
    rels = torch.randint(0, R2, (B,), generator=g)
    tails = torch.randint(0, E, (B,), generator=g)
    tails[1] = tails[0]  # a repeated tail: masked in the in-batch block
    heads[2] = tails[4]  # a head that is another row's tail: masked in the table
    hr = heads * R2 + rels
    extra = torch.randint(0, E, (B, 3), generator=g)  # 3 more known answers per query
    keys = torch.cat([hr * E + tails, (hr.unsqueeze(1) * E + extra).flatten(),
                      torch.tensor([int(hr[3]) * E + int(heads[3])])])  # query 3's head is a known answer
    table = unit(torch.randn(E, D, generator=g, dtype=torch.float64))
    query = unit(torch.randn(B, D, generator=g, dtype=torch.float64))
    tail = unit(torch.randn(B, D, generator=g, dtype=torch.float64))
    head = unit(torch.randn(B, D, generator=g, dtype=torch.float64))
    return dict(heads=heads, rels=rels, tails=tails, train_keys=torch.unique(keys), num_entities=E,
                num_relations2=R2), table, query, tail, head


def loss_and_grads(crit: SimKGCLoss, *, table_tails: bool, seed: int = 0, mapped: bool = True):
    """The loss and its gradients w.r.t. the queries, log 1/τ and (through a tail map) the table."""
    ids, table, query, tail, head = problem(seed)
    query = query.clone().requires_grad_(True)
    tmap = torch.nn.Linear(D, D, dtype=torch.float64)
    with torch.no_grad():
        tmap.weight.copy_(torch.eye(D) + 0.1 * torch.randn(D, D, generator=torch.Generator().manual_seed(1)))
        tmap.bias.zero_()
    crit.set_table(table)
    if mapped:
        crit.set_table_map(tmap)
    args = (query, None, None) if table_tails else (query, tail, head)
    value = crit(*args, **ids)
    value.backward()
    return value.detach(), query.grad, crit.log_inv_t.grad, (tmap.weight.grad if mapped else None)


def make(**options) -> SimKGCLoss:
    base = dict(temperature=0.05, margin=0.02, table_negatives=10, self_negative=True, symmetric=True)
    return SimKGCLoss(**{**base, **options}).double()


@pytest.mark.parametrize("table_tails", [False, True])
@pytest.mark.parametrize("weight", [1.0, 2.5])
def test_chunked_table_equals_the_whole_table(table_tails, weight):
    """Chunks of 7 columns (8 chunks, the last short) give the whole (B, E) block's loss and gradients."""
    whole = loss_and_grads(make(table_tails=table_tails, self_negative_weight=weight), table_tails=table_tails)
    chunked = loss_and_grads(make(table_tails=table_tails, self_negative_weight=weight, table_chunk=7),
                             table_tails=table_tails)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    assert whole[3].abs().sum() > 0  # the table's map does get a gradient


def test_chunks_never_form_the_whole_block(monkeypatch):
    """Each chunk's scores are (B, ≤ chunk), recomputed (not kept) in the backward pass."""
    shapes = []
    real = loss_module._chunk_logsumexp

    def spy(query, table, inv_t, start, end, *rest):
        shapes.append((query.size(0), end - start))
        return real(query, table, inv_t, start, end, *rest)

    monkeypatch.setattr(loss_module, "_chunk_logsumexp", spy)
    loss_and_grads(make(table_tails=True, table_chunk=10), table_tails=True)
    forward = [(B, 10)] * 5 + [(B, 3)]
    assert shapes[:6] == forward and sorted(shapes[6:]) == sorted(forward)  # again in the backward pass


@pytest.mark.parametrize("table_tails", [False, True])
def test_a_sample_of_the_whole_table_is_the_whole_table(table_tails):
    """table_sample = E: every row once, correction log(E/E) = 0: the whole table's loss and gradients."""
    whole = loss_and_grads(make(table_tails=table_tails), table_tails=table_tails)
    sampled = loss_and_grads(make(table_tails=table_tails, table_sample=E, table_chunk=16), table_tails=table_tails)
    for a, b in zip(whole, sampled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_sampled_rows_have_the_expected_shapes_and_correction(monkeypatch):
    """n = 20 of 53 rows, drawn without replacement, sorted, each logit shifted by log(53/20); chunks of 8."""
    seen = []
    real = loss_module._chunk_logsumexp

    def spy(query, table, inv_t, start, end, ids, *rest):
        seen.append((end - start, ids, rest[-1]))
        return real(query, table, inv_t, start, end, ids, *rest)

    monkeypatch.setattr(loss_module, "_chunk_logsumexp", spy)
    torch.manual_seed(0)
    value, qgrad, tgrad, _ = loss_and_grads(make(table_tails=True, table_sample=20, table_chunk=8),
                                            table_tails=True, mapped=False)
    forward = seen[:3]
    assert [w for w, _, _ in forward] == [8, 8, 4]
    ids = forward[0][1]
    assert ids.shape == (20,) and ids.unique().numel() == 20 and bool((ids.diff() > 0).all()) and int(ids.max()) < E
    assert all(s == pytest.approx(math.log(E / 20)) for _, _, s in forward)
    assert value.isfinite() and qgrad.shape == (B, D) and qgrad.abs().sum() > 0 and tgrad is not None


def test_the_corrected_sample_estimates_the_tables_partition_sum_without_bias():
    """E[Σ_{e∈S} exp(s_e + log(E/n))] = Σ_e exp(s_e): over 200 draws the mean is within 2 % of the whole sum (its
    standard error here is about 0.4 %)."""
    ids, table, query, _, _ = problem(3)
    crit = make(table_tails=False, table_sample=12, table_chunk=100)
    crit.set_table(table)
    hr = ids["heads"] * R2 + ids["rels"]
    common = dict(hr=hr, tails=ids["tails"], heads=ids["heads"], tails_all=ids["tails"],
                  train_keys=ids["train_keys"], num_entities=E)
    inv_t = torch.tensor(0.5, dtype=torch.float64)  # a mild temperature: the sum is not one row's alone
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: on a busy machine two threads wait on each other (30 ms a call, not 0.4)
    try:
        with torch.no_grad():
            draws = torch.stack([crit._table_logsumexp(query, table, inv_t, **common).exp() for _ in range(200)])
            crit.table_sample = None
            full = crit._table_logsumexp(query, table, inv_t, **common).exp()
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(draws.mean(0), full, rtol=0.02, atol=0)


def test_table_sample_needs_the_table():
    from kgc.errors import KGCError
    from kgc.recipe import validate_recipe

    with pytest.raises(KGCError, match=r"loss.table_sample=4096 samples rows of the entity table: set "
                                       r"loss.table_negatives=N"):
        validate_recipe({"task": "linkpred", "loss": {"table_sample": 4096}}, source="r.yaml")
