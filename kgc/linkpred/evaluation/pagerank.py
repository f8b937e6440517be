"""A structural floor for inductive splits: personalized PageRank from the query's entity over the known graph.

On GraIL's splits an answer is usually near its query's entity in the inference graph, so a ranking by proximity
alone — no training, no relation, no text — is the shortcut a learned model must beat. The known graph (the
inference graph's ``train`` split) is read as undirected, each edge once; the walk restarts at the query's entity
with probability ``alpha`` at each step (power iteration, ``iterations`` steps from the restart vector). The score
of a candidate is its visiting probability; unreachable entities tie at 0 (realistic ranks).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from kgc.data.graph import KnowledgeGraph

ALPHA, ITERATIONS = 0.15, 30


def transition(graph: KnowledgeGraph) -> sp.csr_matrix:
    """The walk's row-stochastic (entities, entities) matrix over the known graph, undirected (an entity without
    an edge stays where it is)."""
    n = graph.num_entities
    t = graph.splits["train"]
    rows, cols = np.concatenate([t[:, 0], t[:, 2]]), np.concatenate([t[:, 2], t[:, 0]])
    a = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    a.data[:] = 1.0  # each edge once, whatever its relations
    alone = np.flatnonzero(np.asarray(a.sum(axis=1)).ravel() == 0)
    a = a + sp.csr_matrix((np.ones(len(alone)), (alone, alone)), shape=(n, n))
    degree = np.asarray(a.sum(axis=1)).ravel()
    return sp.diags(1.0 / degree) @ a


def pagerank_scores(p: sp.csr_matrix, sources: np.ndarray, *, alpha: float = ALPHA,
                    iterations: int = ITERATIONS) -> torch.Tensor:
    """(len(sources), entities) visiting probabilities of walks restarting at each source."""
    n = p.shape[0]
    restart = np.zeros((len(sources), n))
    restart[np.arange(len(sources)), sources] = 1.0
    x = restart.copy()
    pt = p.T.tocsr()
    for _ in range(iterations):
        x = alpha * restart + (1 - alpha) * (pt @ x.T).T
    return torch.from_numpy(x.astype(np.float32))
