"""The SimKGC objective against a hand-written element-by-element reference (3×3 case)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kgc.linkpred.loss import SimKGCLoss, false_negative_mask

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
    assert crit.temperature == pytest.approx(0.01)


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
