"""The SimKGC objective against a hand-written element-by-element reference (3×3 case)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hypothesis import given, settings
from hypothesis import strategies as st

from kgc.linkpred.loss import SimKGCLoss, false_negative_mask, false_negative_mask_all, is_known

E, R2 = 6, 2  # entities, relations incl. inverses


def key(h, r, t):
    return (h * R2 + r) * E + t


# known train triples (h, r, t): rows 0 and 1 share their gold tail 3; (2, 1, 2) makes head 2 an answer of
# its own query (self-negative masked); (0, 0, 5) makes pre-batch tail 5 a false negative for row 0.
TRAIN = [(0, 0, 3), (1, 0, 3), (2, 1, 4), (2, 1, 2), (0, 0, 5), (1, 0, 1)]
TRAIN_KEYS = torch.tensor(sorted(key(*t) for t in TRAIN))
HEADS, RELS, TAILS = [0, 1, 2], [0, 0, 1], [3, 3, 4]


def unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float64), dim=-1)


Q = unit([1.0, 0.2, 0.0], [0.3, 1.0, 0.1], [0.2, -0.4, 1.0])
T = unit([0.9, 0.1, 0.2], [0.1, 0.8, -0.3], [0.0, -0.2, 1.0])
H = unit([0.5, 0.5, 0.1], [0.2, 0.9, 0.0], [0.1, 0.1, 1.0])
P = unit([1.0, 0.0, 0.1], [0.3, -0.1, 0.9])  # pre-batch tails
P_IDS = [5, 4]


def cos(a, b):
    return float(sum(x * y for x, y in zip(a.tolist(), b.tolist())))


def reference(gamma, tau, w_pre, *, symmetric=True):
    known = set(TRAIN)
    rows = []
    block = [[0.0] * 3 for _ in range(3)]
    for i in range(3):
        row = []
        for j in range(3):
            if i == j:
                v = (cos(Q[i], T[j]) - gamma) / tau
            elif TAILS[j] == TAILS[i] or (HEADS[i], RELS[i], TAILS[j]) in known:
                v = -1e4
            else:
                v = cos(Q[i], T[j]) / tau
            block[i][j] = v
            row.append(v)
        for k in range(2):
            masked = P_IDS[k] == TAILS[i] or (HEADS[i], RELS[i], P_IDS[k]) in known
            row.append(-1e4 if masked else cos(Q[i], P[k]) / tau * w_pre)
        masked = (HEADS[i], RELS[i], HEADS[i]) in known
        row.append(-1e4 if masked else cos(Q[i], H[i]) / tau)
        rows.append(row)

    def ce(logits, gold):
        return -logits[gold] + math.log(sum(math.exp(x - max(logits)) for x in logits)) + max(logits)

    loss = sum(ce(rows[i], i) for i in range(3)) / 3
    if symmetric:
        loss += sum(ce([block[i][j] for i in range(3)], j) for j in range(3)) / 3
    return loss, rows


def run_loss(crit):
    return crit(Q, T, H, heads=torch.tensor(HEADS), rels=torch.tensor(RELS), tails=torch.tensor(TAILS),
                train_keys=TRAIN_KEYS, num_entities=E, num_relations2=R2)


@pytest.mark.parametrize("symmetric", [True, False])
def test_loss_matches_hand_computation(symmetric):
    crit = SimKGCLoss(temperature=0.05, margin=0.02, pre_batch=2, pre_batch_weight=0.5, self_negative=True,
                      symmetric=symmetric).double()
    crit.load_queue_state([(P.numpy(), np.array(P_IDS))], torch.device("cpu"))
    expected, rows = reference(0.02, 0.05, 0.5, symmetric=symmetric)
    # the masks under test really bite in this case
    assert rows[0][1] == -1e4 and rows[1][0] == -1e4  # same tail
    assert rows[0][3] == -1e4 and rows[2][4] == -1e4  # pre-batch: known answer / same tail
    assert rows[2][5] == -1e4 and rows[0][5] != -1e4  # self-negative masked only where the head is an answer
    got = run_loss(crit)
    assert got.item() == pytest.approx(expected, rel=1e-6)  # log(1/τ) is stored in fp32


def test_temperature_is_learnable_and_clamped():
    crit = SimKGCLoss(temperature=0.05, pre_batch=0).double()
    loss = run_loss(crit)
    loss.backward()
    assert crit.log_inv_t.grad is not None and crit.log_inv_t.grad.abs().item() > 0
    with torch.no_grad():
        crit.log_inv_t.fill_(math.log(1e6))  # τ = 1e-6, far below the floor
    crit.clamp_()  # what the training loop does after every optimiser step
    assert crit.temperature == pytest.approx(0.01)


def test_temperature_at_its_bound_keeps_its_gradient():
    """Clamped after the step (as CLIP), not in the forward pass: at the floor the gradient still flows, so an
    optimiser step can bring τ back up; the clamp then holds it within [min, max]."""
    crit = SimKGCLoss(temperature=0.01, min_temperature=0.01, pre_batch=0).double()
    assert crit.log_inv_t.item() == pytest.approx(math.log(100))
    loss = run_loss(crit)
    loss.backward()
    grad = crit.log_inv_t.grad.item()
    assert grad != 0  # with the clamp inside the forward pass this was exactly 0
    opt = torch.optim.SGD([crit.log_inv_t], lr=1.0)
    opt.step()
    moved = crit.log_inv_t.item()
    crit.clamp_()
    if grad > 0:  # the step lowered 1/τ: τ rose above the floor and stays there
        assert moved < math.log(100) and crit.log_inv_t.item() == pytest.approx(moved)
    else:  # pushed below the floor: clamped back to it
        assert crit.log_inv_t.item() == pytest.approx(math.log(100))
    out = SimKGCLoss(temperature=5.0, max_temperature=1.0, pre_batch=0)  # a start outside the range is clamped
    assert out.temperature == pytest.approx(1.0)


def test_prebatch_queue_keeps_last_k_and_never_random():
    crit = SimKGCLoss(pre_batch=2).double()
    assert crit.queue == []  # no random warm-up vectors
    for _ in range(3):
        run_loss(crit)
    assert len(crit.queue) == 2


def test_false_negative_mask_matches_loops():
    g = torch.Generator().manual_seed(0)
    ents, r2 = 7, 4
    heads, rels, gold = (torch.randint(0, n, (20,), generator=g) for n in (ents, r2, ents))
    cands = torch.randint(0, ents, (15,), generator=g)
    triples = {(int(a), int(b), int(c)) for a, b, c in torch.randint(0, 7, (40, 3), generator=g) if b < r2}
    keys = torch.tensor(sorted((h * r2 + r) * ents + t for h, r, t in triples))
    mask = false_negative_mask(heads * r2 + rels, gold, cands, keys, ents)
    for i in range(20):
        for j in range(15):
            bad = int(cands[j]) == int(gold[i]) or (int(heads[i]), int(rels[i]), int(cands[j])) in triples
            assert bool(mask[i, j]) == (not bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(1, 12), st.integers(0, 60), st.integers(0, 2**31 - 1))
def test_the_masks_by_binary_search_equal_isin(ents, r2, b, n_train, seed):
    """is_known is torch.isin on a sorted key list; the all-entity mask is the per-candidate mask over arange(E)
    (repeated queries, queries with no known answer, an empty train set included)."""
    g = torch.Generator().manual_seed(seed)
    hr = torch.randint(0, ents * r2, (b,), generator=g)
    gold = torch.randint(0, ents, (b,), generator=g)
    train = torch.unique(torch.randint(0, ents * r2 * ents, (n_train,), generator=g))
    keys = torch.randint(0, ents * r2 * ents, (b, 5), generator=g)
    assert torch.equal(is_known(keys, train), torch.isin(keys, train))
    reference = ~((gold.unsqueeze(1) == torch.arange(ents)) | torch.isin(hr.unsqueeze(1) * ents + torch.arange(ents), train))
    assert torch.equal(false_negative_mask(hr, gold, torch.arange(ents), train, ents), reference)
    assert torch.equal(false_negative_mask_all(hr, gold, train, ents), reference)


def numpy_reference(*, tau: float, gamma: float = 0.02, w_pre: float = 0.5, in_batch: bool = True,
                    mask: bool = True, symmetric: bool = True) -> tuple[float, np.ndarray]:
    """The loss written out with numpy matrices: logits ``[in-batch (3×3) | pre-batch (3×2) | self (3×1)]``,
    cross-entropy by log-sum-exp, plus the transposed in-batch block's cross-entropy (symmetric)."""
    q, t, h, p = (x.numpy() for x in (Q, T, H, P))
    known = set(TRAIN)
    off_diagonal = ~np.eye(3, dtype=bool)
    block = (q @ t.T - gamma * np.eye(3)) / tau  # margin on the positives only
    if not in_batch:  # no in-batch negatives: every off-diagonal logit is masked, whatever the masks say
        block[off_diagonal] = -1e4
    elif mask:
        false_neg = np.array([[TAILS[j] == TAILS[i] or (HEADS[i], RELS[i], TAILS[j]) in known for j in range(3)]
                              for i in range(3)])
        block[false_neg & off_diagonal] = -1e4
    pre = q @ p.T / tau * w_pre
    if mask:
        pre[np.array([[P_IDS[k] == TAILS[i] or (HEADS[i], RELS[i], P_IDS[k]) in known for k in range(2)]
                      for i in range(3)])] = -1e4
    self_neg = (q * h).sum(1) / tau  # masked where the head is a known answer of its own query, always
    self_neg[np.array([(HEADS[i], RELS[i], HEADS[i]) in known for i in range(3)])] = -1e4
    logits = np.concatenate([block, pre, self_neg[:, None]], axis=1)

    def cross_entropy(x: np.ndarray) -> float:  # gold = the diagonal (row i's positive is column i)
        top = x.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
        return float(np.mean(lse - x[np.arange(3), np.arange(3)]))

    loss = cross_entropy(logits) + (cross_entropy(block.T) if symmetric else 0.0)
    return loss, logits


def configured(temperature: float, **options) -> SimKGCLoss:
    crit = SimKGCLoss(temperature=temperature, margin=0.02, pre_batch=2, pre_batch_weight=0.5, self_negative=True,
                      **options).double()
    crit.load_queue_state([(P.numpy(), np.array(P_IDS))], torch.device("cpu"))
    return crit


def test_numpy_reference_agrees_with_the_loop_reference():
    for symmetric in (True, False):
        assert numpy_reference(tau=0.05, symmetric=symmetric)[0] == pytest.approx(
            reference(0.02, 0.05, 0.5, symmetric=symmetric)[0], rel=1e-12)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_without_in_batch_negatives(symmetric, tau):
    """in_batch=False: each query sees its positive, the pre-batch tails and its head; the other rows' tails are
    masked (and the symmetric term is then zero: each column holds its positive alone)."""
    expected, logits = numpy_reference(tau=tau, in_batch=False, symmetric=symmetric)
    assert (logits[:, :3][~np.eye(3, dtype=bool)] == -1e4).all()
    np.testing.assert_array_equal(logits[:, 3:], numpy_reference(tau=tau)[1][:, 3:])  # pre-batch, self: as before
    got = run_loss(configured(tau, in_batch=False, symmetric=symmetric)).item()
    assert got == pytest.approx(expected, rel=1e-6)
    with_in_batch = numpy_reference(tau=tau, symmetric=symmetric)[0]
    assert got < with_in_batch and abs(got - with_in_batch) > 10 * 1e-6 * got  # the dropped negatives mattered
    if symmetric:  # the transposed block adds nothing
        assert got == pytest.approx(numpy_reference(tau=tau, in_batch=False, symmetric=False)[0], rel=1e-6)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_without_false_negative_masks(symmetric, tau):
    """mask_false_negatives=False: same-tail rows and known answers count as negatives, in-batch and pre-batch;
    only the self-negative keeps its mask (a head that answers its own query)."""
    expected, logits = numpy_reference(tau=tau, mask=False, symmetric=symmetric)
    masked = numpy_reference(tau=tau, symmetric=symmetric)[1]
    assert masked[0, 1] == -1e4 and logits[0, 1] != -1e4  # row 0 and 1 share their gold tail
    assert masked[0, 3] == -1e4 and logits[0, 3] != -1e4  # pre-batch tail 5 is a known answer of row 0
    assert logits[2, 5] == -1e4 and logits[1, 5] == -1e4  # the self-negative masks stay
    got = run_loss(configured(tau, mask_false_negatives=False, symmetric=symmetric)).item()
    assert got == pytest.approx(expected, rel=1e-6)
    with_masks = numpy_reference(tau=tau, symmetric=symmetric)[0]
    assert got > with_masks and abs(got - with_masks) > 10 * 1e-6 * got  # the unmasked false negatives cost


@pytest.mark.parametrize("tau", [0.05, 0.2])
def test_fixed_temperature(tau):
    """learn_temperature=False: the same loss at that τ, no gradient reaches τ, and an optimiser step keeps it."""
    fixed = SimKGCLoss(temperature=tau, learn_temperature=False, pre_batch=0).double()
    learned = SimKGCLoss(temperature=tau, learn_temperature=True, pre_batch=0).double()
    assert not fixed.log_inv_t.requires_grad and learned.log_inv_t.requires_grad
    queries = [Q.clone().requires_grad_(True) for _ in range(2)]
    losses = []
    for crit, q in zip((fixed, learned), queries):
        loss = crit(q, T, H, heads=torch.tensor(HEADS), rels=torch.tensor(RELS), tails=torch.tensor(TAILS),
                    train_keys=TRAIN_KEYS, num_entities=E, num_relations2=R2)
        loss.backward()
        losses.append(loss.item())
    # by hand: no pre-batch queue (pre_batch=0), so the logits are the in-batch block and the self-negative
    q, t, h = (x.numpy() for x in (Q, T, H))
    inv_t = np.exp(np.float64(np.float32(np.log(1 / tau))))  # log(1/τ) is stored in fp32
    block = (q @ t.T - 0.02 * np.eye(3)) * inv_t
    block[0, 1] = block[1, 0] = -1e4  # rows 0 and 1 share their gold tail (3)
    self_neg = (q * h).sum(1) * inv_t
    self_neg[[1, 2]] = -1e4  # heads 1 and 2 are known answers of their own queries: (1, 0, 1), (2, 1, 2)
    logits = np.concatenate([block, self_neg[:, None]], 1)
    ce = lambda x: float(np.mean(np.log(np.exp(x).sum(1)) - np.diag(x)))  # noqa: E731  (|x| ≤ 1/τ: no overflow)
    expected = ce(logits) + ce(block.T)
    assert losses[0] == pytest.approx(expected, rel=1e-6) and losses[1] == losses[0]
    assert fixed.log_inv_t.grad is None and learned.log_inv_t.grad is not None
    torch.testing.assert_close(queries[0].grad, queries[1].grad)  # the same loss surface for the encoder
    opt = torch.optim.SGD(list(fixed.parameters()) + [queries[0]], lr=1.0)
    opt.step()
    assert fixed.temperature == pytest.approx(tau, rel=1e-6)


# the entity table (loss.table_negatives): every entity's tail-tower vector, no gradient
TABLE = unit([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.6, 0.6, 0.2], [0.9, 0.2, 0.1], [0.1, -0.3, 0.9], [0.4, 0.1, 0.8])


def test_entity_table_negatives_match_hand_computation():
    """The table block, by hand: for query i every entity e scores cos(q_i, t_e) / τ, except the gold, the other
    known train answers of (h_i, r_i) and the batch's own tails (3, 4: in the in-batch block with gradients)."""
    known = set(TRAIN)
    tau, gamma = 0.05, 0.02
    crit = SimKGCLoss(temperature=tau, margin=gamma, pre_batch=0, self_negative=True, symmetric=False,
                      table_negatives=10).double()
    crit.set_table(TABLE)
    _, rows = reference(gamma, tau, 0.5, symmetric=False)
    rows = [r[:3] + r[5:] for r in rows]  # no pre-batch block here: in-batch, then self-negative
    table_rows = []
    for i in range(3):
        block = []
        for e in range(E):
            masked = e == TAILS[i] or (HEADS[i], RELS[i], e) in known or e in TAILS
            block.append(-1e4 if masked else cos(Q[i], TABLE[e]) / tau)
        table_rows.append(block)
    assert table_rows[0][5] == -1e4 and table_rows[1][1] == -1e4  # known answers (0,0,5), (1,0,1) masked
    assert table_rows[2][0] != -1e4 and table_rows[2][3] == table_rows[0][4] == -1e4  # batch tails masked

    def ce(logits, gold):
        m = max(logits)
        return -logits[gold] + m + math.log(sum(math.exp(x - m) for x in logits))

    # row layout: in-batch (3), table (E), self-negative (1)
    expected = sum(ce(rows[i][:3] + table_rows[i] + rows[i][3:], i) for i in range(3)) / 3
    got = run_loss(crit)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert crit.table.requires_grad is False  # no gradient reaches the table
    state = crit.training_state()  # it travels in checkpoints
    other = SimKGCLoss(table_negatives=10).double()
    other.load_training_state(state, torch.device("cpu"))
    torch.testing.assert_close(other.table, TABLE)
    legacy = SimKGCLoss()  # a checkpoint from before the table: a bare queue list
    legacy.load_training_state([], torch.device("cpu"))
    assert legacy.table is None and legacy.queue == []


@pytest.mark.parametrize("symmetric", [True, False])
def test_table_tails_is_one_softmax_over_every_entity(symmetric):
    """loss.table_tails, by hand: the batch's tails are rows of the table (no tail tower), so row i is the in-batch
    block against TABLE[tails] (margin on the gold, same-tail and known answers masked) followed by the table block
    (gold, known answers and the batch's tails masked) — every entity exactly once, the head's own row included as
    the self-negative (no separate column). The symmetric term reads the in-batch block column-wise. Gradients
    reach the queries only."""
    known = set(TRAIN)
    tau, gamma = 0.05, 0.02
    crit = SimKGCLoss(temperature=tau, margin=gamma, pre_batch=0, self_negative=True, symmetric=symmetric,
                      table_negatives=10, table_tails=True).double()
    crit.set_table(TABLE)
    rows, block = [], [[0.0] * 3 for _ in range(3)]
    for i in range(3):
        row = []
        for j in range(3):
            if i == j:
                v = (cos(Q[i], TABLE[TAILS[j]]) - gamma) / tau
            elif TAILS[j] == TAILS[i] or (HEADS[i], RELS[i], TAILS[j]) in known:
                v = -1e4
            else:
                v = cos(Q[i], TABLE[TAILS[j]]) / tau
            block[i][j] = v
            row.append(v)
        for e in range(E):
            masked = e == TAILS[i] or (HEADS[i], RELS[i], e) in known or e in TAILS
            row.append(-1e4 if masked else cos(Q[i], TABLE[e]) / tau)
        rows.append(row)
    # every entity once per row: 3 batch columns + the 6 table columns less the 2 distinct batch tails
    assert all(sum(v != -1e4 for v in row[3:]) + 2 <= E for row in rows)
    assert rows[0][3 + 0] != -1e4 and rows[2][3 + 2] == -1e4  # head 0 is a negative of its own query; head 2 an answer

    def ce(logits, gold):
        m = max(logits)
        return -logits[gold] + m + math.log(sum(math.exp(x - m) for x in logits))

    expected = sum(ce(rows[i], i) for i in range(3)) / 3
    if symmetric:
        expected += sum(ce([block[i][j] for i in range(3)], j) for j in range(3)) / 3
    q = Q.clone().requires_grad_(True)
    got = crit(q, None, None, heads=torch.tensor(HEADS), rels=torch.tensor(RELS), tails=torch.tensor(TAILS),
               train_keys=TRAIN_KEYS, num_entities=E, num_relations2=R2)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    got.backward()
    assert q.grad is not None and q.grad.abs().sum() > 0 and crit.table.grad is None


def test_table_tails_needs_the_table():
    crit = SimKGCLoss(table_negatives=10, table_tails=True).double()
    with pytest.raises(RuntimeError, match="entity table must be set"):
        crit(Q, None, None, heads=torch.tensor(HEADS), rels=torch.tensor(RELS), tails=torch.tensor(TAILS),
             train_keys=TRAIN_KEYS, num_entities=E, num_relations2=R2)


@pytest.mark.parametrize("table_tails", [False, True])
def test_self_negative_weight_adds_log_w_to_the_heads_logit(table_tails):
    """loss.self_negative_weight w: the head's logit (the self-negative column; with table_tails its own row of
    the table) gets + log w, as if the head were w negatives; w = 1 is SimKGC's loss exactly."""
    w = 4.0
    kwargs = dict(temperature=0.05, margin=0.02, pre_batch=0, symmetric=False)
    if table_tails:
        kwargs.update(table_negatives=10, table_tails=True)
    plain, weighted = (SimKGCLoss(**kwargs, self_negative_weight=x).double() for x in (1.0, w))
    for crit in (plain, weighted):
        crit.set_table(TABLE) if table_tails else None
    seen, real_ce = {}, F.cross_entropy

    def capture(crit, name):
        def ce(logits, target, **_):
            seen[name] = logits.detach().clone()
            return real_ce(logits, target)
        return ce

    args = (Q, None, None) if table_tails else (Q, T, H)
    for name, crit in (("plain", plain), ("weighted", weighted)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(F, "cross_entropy", capture(crit, name))
            crit(*args, heads=torch.tensor(HEADS), rels=torch.tensor(RELS), tails=torch.tensor(TAILS),
                 train_keys=TRAIN_KEYS, num_entities=E, num_relations2=R2)
    diff = seen["weighted"] - seen["plain"]
    expected = torch.zeros_like(diff)
    for i, h in enumerate(HEADS):
        col = 3 + h if table_tails else diff.size(1) - 1  # the head's table row, or the self-negative column
        if seen["plain"][i, col] != -1e4:  # a masked head (a known answer: row 2) stays masked
            expected[i, col] = math.log(w)
    assert seen["plain"][2, (3 + 2) if table_tails else -1] == -1e4
    torch.testing.assert_close(diff, expected)


def test_every_loss_option_is_a_keyword_of_the_loss():
    """The recipe's loss: section and SimKGCLoss's keywords are one set: a field the loss does not take would be
    dropped silently if kgc filtered them (it does not: make_loss passes every field, and a stray one is a
    TypeError)."""
    from kgc.linkpred.loss import SimKGCLoss
    from kgc.linkpred.task import make_loss
    from kgc.recipe import load_recipe

    recipe = load_recipe(None, ["loss.margin=0.05", "loss.pre_batch=0"])
    assert set(recipe.loss.model_fields) == set(SimKGCLoss.__init__.__kwdefaults__)
    loss = make_loss(recipe)
    assert loss.margin == 0.05
