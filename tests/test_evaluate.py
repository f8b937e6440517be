"""Filtered ranking with ties: against a brute-force reference and against pykeen's own filtering path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pykeen.evaluation import RankBasedEvaluator
from pykeen.evaluation.evaluator import create_sparse_positive_filter_, filter_scores_

from kgc.data.graph import KnowledgeGraph
from kgc.linkpred.evaluation.ranking import cosine_blocks, n_hop_neighbours, rank_queries as rank_blocks, record_ranks


def rank_queries(query_vectors, entity_table, queries, known, *, max_score_bytes=256 << 20, boost=None,
                 boost_weight=0.0, counts=None):
    """The ranking protocol on cosine scores (with SimKGC's boost where given)."""
    scores = cosine_blocks(query_vectors, entity_table, queries[:, 0], boost=boost, boost_weight=boost_weight)
    return rank_blocks(scores, queries, known, entity_table.size(0), max_score_bytes=max_score_bytes, counts=counts)


def score_and_rank(query_vectors, entity_table, graph, queries, *, evaluator, target, counts=None, **budget):
    known = graph.all_answers[graph.hr_keys(queries[:, 0], queries[:, 1])]
    record_ranks(evaluator, target, rank_queries(query_vectors, entity_table, queries, known, counts=counts, **budget),
                 graph.num_entities)

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


@pytest.fixture(scope="module", params=[None, 4 * E * 3, 4 * 7], ids=["whole", "3-rows", "7-entity-blocks"])
def setup(request):
    """Scored as whole rows, 3 rows at a time, and in blocks of 1 query × 7 entities (eval.max_score_bytes):
    every test below must hold for each."""
    budget = {} if request.param is None else {"max_score_bytes": request.param}
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
                       counts=counts, **budget)
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


@pytest.mark.parametrize("budget", [4 * 25 * 4, 4 * 5])
def test_blocked_ranks_with_rerank_boost_equal_the_dense_matrix(budget):
    """SimKGC's n-hop boost added block by block: the same ranks as boosting the dense score matrix."""
    import scipy.sparse as sp
    from pykeen.evaluation.ranks import Ranks

    rng = np.random.default_rng(3)
    n, dim = 40, 8
    table = torch.nn.functional.normalize(torch.as_tensor(rng.normal(size=(E, dim)), dtype=torch.float32), dim=1)
    table[7] = table[3]  # identical entities: exact ties
    q = torch.nn.functional.normalize(torch.as_tensor(rng.normal(size=(n, dim)), dtype=torch.float32), dim=1)
    queries = np.stack([rng.integers(0, E, n), rng.integers(0, R, n), rng.integers(0, E, n)], 1)
    queries[:5, 2] = 3
    known = sp.random(n, E, density=0.2, format="csr", random_state=4, dtype=np.float32)
    known.data[:] = 1
    boost = {int(h): rng.choice(E, size=6, replace=False) for h in np.unique(queries[:, 0])}
    dense = q @ table.t()
    for i, h in enumerate(queries[:, 0]):
        dense[i, torch.as_tensor(boost[int(h)])] += 0.05
    true = dense[torch.arange(n), torch.as_tensor(queries[:, 2])].unsqueeze(1).clone()
    rows, cols = known.nonzero()
    dense[torch.as_tensor(rows), torch.as_tensor(cols)] = float("nan")
    dense[torch.arange(n), torch.as_tensor(queries[:, 2])] = true[:, 0]
    ref = Ranks.from_scores(true, dense)
    got = rank_queries(q, table, queries, known, max_score_bytes=budget, boost=boost, boost_weight=0.05)
    for key in ("optimistic", "pessimistic", "realistic", "number_of_options"):
        torch.testing.assert_close(getattr(got, key), getattr(ref, key), msg=key)


MEMORY_PROBE = """
import resource, sys
import numpy as np, scipy.sparse as sp, torch
from kgc.linkpred.evaluation.ranking import cosine_blocks, rank_queries as rank
torch.set_num_threads(1)
E, n, dim = 300_000, 512, 16
g = torch.Generator().manual_seed(0)
table = torch.nn.functional.normalize(torch.randn(E, dim, generator=g), dim=1)
q = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
queries = np.stack([np.arange(n), np.zeros(n, dtype=np.int64), np.arange(n) * 7], 1)
known = sp.csr_matrix((np.ones(5 * n), (np.repeat(np.arange(n), 5), np.arange(5 * n) * 11)), shape=(n, E))
rank_queries = lambda q, t, qs, k, **kw: rank(cosine_blocks(q, t, qs[:, 0]), qs, k, t.size(0), **kw)
rank_queries(q[:2], table, queries[:2], known[:2], max_score_bytes=4 << 20)  # warm up the kernels
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ranks = rank_queries(q, table, queries, known, max_score_bytes=int(sys.argv[1]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((peak - before) * 1024, float(ranks.realistic.mean()))
"""


def test_peak_memory_stays_within_the_score_budget():
    """300k entities × 512 queries would be a 614 MB dense score matrix: with eval.max_score_bytes = 4 MiB the
    peak resident memory grows by tens of MB at most (the same ranks); with a 1 GiB budget it grows by >500 MB."""
    import subprocess
    import sys

    def probe(budget: int) -> tuple[int, float]:
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(budget)], capture_output=True, text=True,
                             check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        grown, mean_rank = out.stdout.split()
        return int(grown), float(mean_rank)

    small, rank_small = probe(4 << 20)
    dense, rank_dense = probe(1 << 30)
    assert small < 40 << 20, f"peak grew {small / 2**20:.0f} MiB with a 4 MiB score budget"
    assert dense > 500 << 20  # the probe sees a dense matrix when one is formed
    assert rank_small == rank_dense


def test_answer_index_rows_equal_the_dense_key_matrix():
    """The filter index holds only the query keys that occur (Wikidata5M: E · 2R = 7.5e9 possible rows), and
    ``index[keys]`` gives the same rows as a sparse matrix with one row per possible key."""
    import scipy.sparse as sp

    from kgc.data.graph import AnswerIndex

    rng = np.random.default_rng(0)
    keys, answers = rng.integers(0, 300, 2000), rng.integers(0, 50, 2000)
    ref = sp.csr_matrix((np.ones(2000, dtype=bool), (keys, answers)), shape=(400, 50))
    index = AnswerIndex(keys, answers, 50)
    probe = np.concatenate([rng.integers(0, 400, 300), [0, 399, 299]])
    np.testing.assert_array_equal(index[probe].toarray(), ref[probe].toarray())
    assert len(index.keys) == len(np.unique(keys)) and index[np.array([], dtype=np.int64)].shape == (0, 50)


def test_ranks_within_an_index_top_k(setup):
    """--use-index: with an exact (flat) index and K = every entity, the ranks are the exact ones; with K = 3
    a retrieved gold keeps its exact optimistic rank and a missed gold ranks after every unfiltered hit."""
    import faiss

    from kgc.linkpred.evaluation.ranking import rank_retrieved

    graph, queries, scores, _ = setup
    index = faiss.IndexFlatIP(E)
    index.add(np.eye(E, dtype=np.float32))
    for target, q in queries.items():
        vectors = torch.as_tensor(scores[target])
        known = graph.all_answers[graph.hr_keys(q[:, 0], q[:, 1])]
        exact = rank_queries(vectors, torch.eye(E), q, known)
        _, everything = index.search(scores[target], E)
        full = rank_retrieved(vectors, torch.eye(E), q, known, everything)
        for key in ("optimistic", "pessimistic", "realistic", "number_of_options"):
            torch.testing.assert_close(getattr(full, key), getattr(exact, key), msg=key)
        k = 3 + int(np.diff(known.indptr).max())
        _, top = index.search(scores[target], k)
        counts = {}
        part = rank_retrieved(vectors, torch.eye(E), q, known, top, counts)
        found = (top == q[:, 2:3]).any(1)
        assert 0 < found.sum() < len(q) and counts["gold_missed"] == (~found).sum()
        np.testing.assert_array_equal(part.optimistic[found].numpy(), exact.optimistic[found].numpy())
        for i in np.flatnonzero(~found):
            unfiltered = [e for e in top[i] if e not in set(known[i].indices)]
            assert part.optimistic[i] == part.pessimistic[i] == len(unfiltered) + 1
            assert exact.pessimistic[i] >= len(unfiltered) + 1  # exact search: every unfiltered hit scored >= the gold
