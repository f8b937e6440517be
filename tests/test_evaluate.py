"""Filtered ranking with ties: against a brute-force reference and against pykeen's own filtering path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pykeen.evaluation import RankBasedEvaluator
from pykeen.evaluation.evaluator import create_sparse_positive_filter_, filter_scores_

from kgc.data.graph import KnowledgeGraph
from kgc.linkpred.evaluate import n_hop_neighbours, score_and_rank

E, R = 25, 3


def random_graph(seed: int = 0) -> KnowledgeGraph:
    rng = np.random.default_rng(seed)
    triples = np.unique(np.stack([rng.integers(0, E, 400), rng.integers(0, R, 400), rng.integers(0, E, 400)], 1), axis=0)
    rng.shuffle(triples)
    splits = {"train": triples[:250], "dev": triples[250:280], "test": triples[280:330]}
    return KnowledgeGraph(entities=[f"e{i}" for i in range(E)], names=[f"e{i}" for i in range(E)],
                          descriptions=[""] * E, relations=[f"r{i}" for i in range(R)],
                          relation_texts=[f"r{i}" for i in range(R)], splits=splits)


def brute_force_ranks(graph, queries, scores):
    """Loop over every candidate: filtered optimistic / pessimistic / realistic ranks (1-based)."""
    allq = np.concatenate([graph.both_directions(s) for s in ("train", "dev", "test")])
    known = {}
    for h, r, a in allq:
        known.setdefault((h, r), set()).add(a)
    out = []
    for (h, r, a), row in zip(queries, scores):
        gold = row[a]
        cands = [e for e in range(E) if e == a or e not in known[(h, r)]]
        better = sum(1 for e in cands if row[e] > gold)
        equal = sum(1 for e in cands if row[e] == gold)  # includes the gold itself
        out.append((better + 1, better + equal, (better + 1 + better + equal) / 2))
    return np.array(out)


@pytest.fixture(scope="module")
def setup():
    graph = random_graph()
    rng = np.random.default_rng(1)
    test = graph.splits["test"]
    queries = {"tail": test, "head": np.stack([test[:, 2], test[:, 1] + R, test[:, 0]], 1)}
    # one decimal place: many deliberate ties
    scores = {k: np.round(rng.random((len(test), E)), 1).astype(np.float32) for k in queries}
    ours = RankBasedEvaluator(filtered=True, clear_on_finalize=False)
    counts = {}
    for target, q in queries.items():
        score_and_rank(torch.as_tensor(scores[target]), torch.eye(E), graph, q, evaluator=ours, target=target,
                       counts=counts)
    ours.head_above_gold = counts["head_above_gold"]
    return graph, queries, scores, ours


def test_head_above_gold_counts_queries_whose_own_head_outscores_the_answer(setup):
    graph, queries, scores, ours = setup
    allq = np.concatenate([graph.both_directions(s) for s in ("train", "dev", "test")])
    known = {(h, r, a) for h, r, a in allq}
    ref = sum(1 for target in queries for (h, r, a), row in zip(queries[target], scores[target])
              if h != a and (h, r, h) not in known and row[h] > row[a])  # a filtered head never counts
    assert ref > 0 and ours.head_above_gold == ref


def test_ranks_match_brute_force(setup):
    graph, queries, scores, ours = setup
    for target in ("tail", "head"):
        ref = brute_force_ranks(graph, queries[target], scores[target])
        got = {t: np.concatenate(ours.ranks[(target, t)]) for t in ("optimistic", "pessimistic", "realistic")}
        assert (ref[:, 1] > ref[:, 0]).any(), "the case must contain ties"
        np.testing.assert_array_equal(got["optimistic"], ref[:, 0])
        np.testing.assert_array_equal(got["pessimistic"], ref[:, 1])
        np.testing.assert_allclose(got["realistic"], ref[:, 2])


def test_results_equal_pykeen_on_same_scores(setup):
    graph, queries, scores, ours = setup
    test = graph.splits["test"]
    all_pos = torch.as_tensor(np.concatenate([graph.splits[s] for s in ("train", "dev", "test")]))
    theirs = RankBasedEvaluator(filtered=True)
    for target, column in (("tail", 2), ("head", 0)):
        batch = torch.as_tensor(test)
        s = torch.as_tensor(scores[target]).clone()
        pos_filter, _ = create_sparse_positive_filter_(hrt_batch=batch, all_pos_triples=all_pos, filter_col=column)
        true = s[torch.arange(len(batch)), batch[:, column]][:, None].clone()
        s = filter_scores_(scores=s, filter_batch=pos_filter)
        s[torch.arange(len(batch)), batch[:, column]] = true[:, 0]
        theirs.process_scores_(batch, target, s, true_scores=true)
    a, b = ours.finalize().to_dict(), theirs.finalize().to_dict()
    for side in ("head", "tail", "both"):
        for rank_type in ("realistic", "optimistic", "pessimistic"):
            for metric, value in b[side][rank_type].items():
                assert a[side][rank_type][metric] == pytest.approx(value, nan_ok=True), (side, rank_type, metric)
    # the layout people read: pykeen's keys
    mrr = a["both"]["realistic"]["inverse_harmonic_mean_rank"]
    ref = np.concatenate([brute_force_ranks(graph, queries[t], scores[t])[:, 2] for t in ("tail", "head")])
    assert mrr == pytest.approx(np.mean(1 / ref))
    assert a["tail"]["realistic"]["hits_at_10"] == pytest.approx(
        np.mean(brute_force_ranks(graph, queries["tail"], scores["tail"])[:, 2] <= 10))


def test_n_hop_neighbours_bfs():
    graph = random_graph(3)
    adj = {e: set() for e in range(E)}
    for h, _, t in graph.splits["train"]:
        adj[h].add(t)
        adj[t].add(h)
    for head in (0, 5, 7):
        frontier, seen = {head}, {head}
        for _ in range(2):
            frontier = {n for f in frontier for n in adj[f]} - seen
            seen |= frontier
        assert set(n_hop_neighbours(graph, np.array([head]), 2)[head].tolist()) == seen
