"""Rules counted from the train graph: a structural scorer that learns in seconds (``structure.model: rules``).

Closed path rules in the form AnyBURL (Meilicke et al., IJCAI 2019) learns them, mined exhaustively instead of
sampled, over kgc's 2R relations (``r + R`` is ``r`` read backwards, so a rule for relation ``r + R`` answers head
prediction)::

    length 1:   r(x, y) ⇐ b(x, y)                   (b ≠ r; b = r + R is symmetry: r(x, y) ⇐ r(y, x))
    length 2:   r(x, y) ⇐ b1(x, z) ∧ b2(z, y)
    length 3:   r(x, y) ⇐ b1(x, z1) ∧ b2(z1, z2) ∧ b3(z2, y)    (``structure.rule_length: 3``)

over the train triples in both directions, with the variables of a body bound to distinct entities (AnyBURL's
object identity: x ≠ y, z ≠ x, z ≠ y; self-loops are in no body, and a length-3 walk that comes back to x or
passes through y is no path, :func:`paths`). A rule's
confidence is AnyBURL's ``support / (body + k)``: ``body`` the (x, y) pairs its body connects, ``support`` those of them that also hold
``r(x, y)``, and ``k`` (``structure.rule_unseen``, 5) pairs added to the denominator so that a rule seen twice
does not score 1. Rules with support ≥ ``structure.rule_min_support`` and confidence ≥
``structure.rule_min_confidence`` are kept.

A query (h, r, ?) scores every entity e by the rules for r whose body reaches e from h (the head itself never):

    noisy_or (default):  s(e) = 1 − Π_{rules ρ reaching e} (1 − conf(ρ))
    max:                 s(e) = max_{rules ρ reaching e} conf(ρ)       (AnyBURL's max aggregation, without its
                                                                        lexicographic tie-breaking)

Entities no rule reaches score 0, so rules alone rank most entities in one tie; fused with the text model
(:mod:`kgc.linkpred.structure.pykeen`: α·z(text) + (1 − α)·z(rules), α on dev) the text orders what the rules leave
tied. Departures from AnyBURL, on purpose: no rules with constants, and every rule counted exhaustively instead of
sampled — a length-2 body is one sparse product per pair of relation ids, (2R)² of them, each looked up at every
train triple: 2.5 s for WN18RR's 22 ids, 4.5 s for UMLS's 92, but hours for FB15k-237's 474 (there
``structure.rule_length: 1`` keeps the cost linear); a length-3 body is one product more on its length-2 prefix,
(2R)³ of them (WN18RR's 10,648; on a graph of many relations, hours). The bodies walk the train triples only (as
the PyKEEN models see them).

Saved in ``RUN/structure/``: ``rules.tsv`` (one rule per line, readable: relation, body, support, body pairs,
confidence), ``edges.npy`` (the train triples the bodies walk, both directions), ``meta.json``.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from kgc.errors import KGCError
from kgc.fileio import write_npy, write_tsv
from kgc.linkpred.structure.options import RulesOptions  # noqa: F401  (its options: kgc.linkpred.structure.options)

AGGREGATIONS = ("noisy_or", "max")
TABLE_BYTES = 64 << 20  # every relation's (entities, entities) float32 score table kept below this (UMLS: 13 MB)
RULES_FILE, EDGES_FILE = "rules.tsv", "edges.npy"
COLUMNS = ["relation", "body", "support", "body_pairs", "confidence", "relation_id", "body_ids"]


@dataclass(frozen=True)
class Rule:
    """``relation(x, y) ⇐ body[0](x, z1) ∧ body[1](z1, y) …`` over relation ids in 0..2R-1."""
    relation: int
    body: tuple[int, ...]
    support: int
    body_pairs: int
    confidence: float


def adjacency(edges: np.ndarray, num_entities: int, num_relations2: int) -> list[sp.csr_matrix]:
    """One boolean (entities, entities) CSR matrix per relation id in 0..2R-1: A_r[x, y] = 1 iff (x, r, y) is
    in ``edges`` ((n, 3), both directions) and x ≠ y (a self-loop is in no rule's body)."""
    out = []
    edges = edges[edges[:, 0] != edges[:, 2]]  # no self-loops: paths x → z → y have z ≠ x and z ≠ y
    for r in range(num_relations2):
        m = edges[edges[:, 1] == r]
        a = sp.csr_matrix((np.ones(len(m), dtype=np.float32), (m[:, 0], m[:, 2])), shape=(num_entities,) * 2)
        a.data[:] = 1.0  # duplicates summed: back to 0/1
        out.append(a)
    return out


def _pairs(matrix: sp.spmatrix) -> sp.csr_matrix:
    """``matrix`` as 0/1 pairs with x ≠ y."""
    m = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
    m.setdiag(0)
    m.eliminate_zeros()
    m.data[:] = 1.0
    return m


def paths(a: list[sp.csr_matrix], body: tuple[int, ...], rows: np.ndarray | None = None,
          at: list[sp.csr_matrix] | None = None) -> sp.csr_matrix:
    """(len(rows), entities) counts of ``body``'s paths from each x in ``rows`` (every entity when None) to each
    y with its variables distinct: x → z1 → … → y through ``a`` (the matrices of :func:`adjacency`, which have
    no self-loops); y = x is no path (its entries are 0).

    Length 1 and 2: the walks are the paths (no self-loop: z1 ≠ x, z1 ≠ y). Length 3, x → z1 → z2 → y: of the
    walks, those with z2 = x and those with z1 = y are taken out by inclusion–exclusion,

        A1·A2·A3 − diag(A1·A2)·A3 − A1·diag(A2·A3) + A1 ∘ A2ᵀ ∘ A3

    (z1 ≠ x, z2 ≠ z1 and y ≠ z2 hold without it), so a length-3 body connects the pairs AnyBURL's object
    identity lets it connect. ``at``: the transposes of ``a``, when kept (a length-3 body needs two)."""
    take = (lambda m: m) if rows is None else (lambda m: m[rows])
    first = sp.csr_matrix(take(a[body[0]]), dtype=np.float64)
    if len(body) < 3:
        out = first
        for b in body[1:]:
            out = out @ a[b]
    elif len(body) == 3:
        a2, a3 = (a[b].astype(np.float64, copy=False) for b in body[1:])
        a2t, a3t = (sp.csr_matrix(a[b].T) if at is None else at[b] for b in body[1:])
        out = _three(first, a2, a3, a2t, a3t, take)
    else:
        raise KGCError(f"a rule body of length {len(body)}: rules of length 1, 2 or 3 are mined")
    out = sp.coo_matrix(out)
    keep = out.col != (out.row if rows is None else np.asarray(rows)[out.row])  # y ≠ x
    return sp.csr_matrix((out.data[keep], (out.row[keep], out.col[keep])), shape=out.shape)


def _prefix_terms(first: sp.csr_matrix, a2: sp.csr_matrix, a2t: sp.csr_matrix, take, prefix=None):
    """What a length-3 body's count takes from its first two relations alone, computed once for every last
    relation: ``first @ a2`` (``prefix`` when already computed), A1 ∘ A2ᵀ at the rows (the walks x → z1 → x,
    entry by z1) and diag(A1·A2) at the rows, their sums."""
    prefix = first @ a2 if prefix is None else prefix
    back = sp.csr_matrix(first.multiply(sp.csr_matrix(take(a2t))))
    return prefix, back, sp.diags(np.asarray(back.sum(axis=1)).ravel())


def _three(first: sp.csr_matrix, a2: sp.csr_matrix, a3: sp.csr_matrix, a2t: sp.csr_matrix, a3t: sp.csr_matrix,
           take, terms=None) -> sp.csr_matrix:
    """:func:`paths` of a length-3 body (x ≠ y not yet cleared) from its row-restricted first matrix, the other
    two and their transposes (``terms``: :func:`_prefix_terms` of the first two, when already computed)."""
    prefix, back, d12 = _prefix_terms(first, a2, a2t, take) if terms is None else terms
    d23 = np.asarray(a2.multiply(a3t).sum(axis=1)).ravel()  # diag(A2·A3): walks y → z2 → y
    a3r = sp.csr_matrix(take(a3))
    out = prefix @ a3 - d12 @ a3r - first @ sp.diags(d23) + back.multiply(a3r)
    out = sp.csr_matrix(out)
    out.data[np.abs(out.data) < 0.5] = 0  # counts: exact integers, cleared where every walk revisited x or y
    out.eliminate_zeros()
    return out


def _bodies(a: list[sp.csr_matrix], max_length: int):
    """(body, pairs) of every body of length ≤ ``max_length``, one at a time (a length-2 body is one product; a
    length-3 body one more on its length-2 prefix, kept while its last relations are tried)."""
    for b, m in enumerate(a):
        yield (b,), _pairs(m)
    if max_length < 2:
        return
    a64 = [m.astype(np.float64) for m in a]
    a64t = [sp.csr_matrix(m.T) for m in a64] if max_length == 3 else []
    for b1, m1 in enumerate(a64):
        for b2, m2 in enumerate(a64):
            if not (m1.nnz and m2.nnz):
                continue
            prefix = m1 @ m2
            yield (b1, b2), _pairs(prefix)
            if max_length == 3 and prefix.nnz:
                terms = _prefix_terms(m1, m2, a64t[b2], lambda m: m, prefix)  # shared by every last relation
                for b3, m3 in enumerate(a64):
                    if m3.nnz:
                        yield (b1, b2, b3), _pairs(_three(m1, m2, m3, a64t[b2], a64t[b3], lambda m: m, terms))


def mine_rules(edges: np.ndarray, num_entities: int, num_relations2: int, *, max_length: int = 2,
               min_support: int = 2, unseen: float = 5.0, min_confidence: float = 0.01,
               max_per_relation: int | None = None) -> list[Rule]:
    """Every closed path rule of length ≤ ``max_length`` (1, 2 or 3) over ``edges`` ((n, 3) triples, both
    directions) with support ≥ ``min_support`` and confidence ``support / (body + unseen)`` ≥
    ``min_confidence`` (the best ``max_per_relation`` per relation, when given); sorted by relation, then
    confidence (highest first). A body's support for every relation at once: its pairs looked up at the train
    triples' (head, tail)."""
    if max_length not in (1, 2, 3):
        raise KGCError(f"structure.rule_length={max_length}: rules of length 1, 2 or 3 are mined")
    edges = np.unique(np.asarray(edges, dtype=np.int64).reshape(-1, 3), axis=0)
    a = adjacency(edges, num_entities, num_relations2)
    heads, rels, tails = edges[:, 0], edges[:, 1], edges[:, 2]
    rules = []
    for body, pairs in _bodies(a, max_length):
        if not pairs.nnz:
            continue
        hit = np.asarray(pairs[heads, tails]).ravel() > 0  # the train triples whose (h, t) the body connects
        support = np.bincount(rels[hit], minlength=num_relations2)
        for r in np.flatnonzero(support >= min_support):
            confidence = int(support[r]) / (pairs.nnz + unseen)
            if body != (r,) and confidence >= min_confidence:  # not r(x, y) ⇐ r(x, y)
                rules.append(Rule(int(r), body, int(support[r]), int(pairs.nnz), confidence))
    rules.sort(key=lambda x: (x.relation, -x.confidence, x.body))
    if max_per_relation is not None:
        rules = [x for _, group in groupby(rules, key=lambda x: x.relation) for x in list(group)[:max_per_relation]]
    return rules


class RuleModel:
    """Mined rules applied to the train graph: :meth:`scores` (batch, entities) like a PyKEEN structural
    model's, over the first ``num_entities`` entity ids."""

    def __init__(self, rules: list[Rule], edges: np.ndarray, num_entities: int, num_relations2: int,
                 aggregation: str = "noisy_or") -> None:
        if aggregation not in AGGREGATIONS:
            raise KGCError(f"structure.rule_aggregation={aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
        self.rules, self.edges, self.aggregation = rules, edges, aggregation
        self.num_entities = int(num_entities)
        self.adj = adjacency(edges, num_entities, num_relations2)
        self.adj_t = [sp.csr_matrix(m.T) for m in self.adj] if any(len(r.body) == 3 for r in rules) else None
        self.by_relation: dict[int, list[Rule]] = {}
        for rule in rules:
            self.by_relation.setdefault(rule.relation, []).append(rule)
        # a small graph keeps each relation's whole (entities, entities) score table once computed: an evaluation
        # asks for one relation in many batches, and every row of the table is what those batches would compute
        self.tables: dict[int, np.ndarray] | None = \
            {} if self.num_entities ** 2 * 4 * max(1, num_relations2) <= TABLE_BYTES else None

    def reached(self, rule: Rule, heads: np.ndarray) -> sp.csr_matrix:
        """(len(heads), entities) 0/1-or-more: the entities ``rule``'s body reaches from each head (its paths,
        :func:`paths`)."""
        return paths(self.adj, rule.body, np.asarray(heads), self.adj_t)

    def _rows(self, relation: int, heads: np.ndarray) -> np.ndarray:
        """(len(heads), entities) float32 scores of (head, ``relation``, ?): each row its rules' aggregate."""
        acc = np.zeros((len(heads), self.num_entities), dtype=np.float64)
        for rule in self.by_relation.get(relation, []):
            hit = self.reached(rule, heads).tocoo()  # canonical: one entry per (row, entity)
            if self.aggregation == "noisy_or":
                acc[hit.row, hit.col] += np.log1p(-min(rule.confidence, 1 - 1e-9))
            else:
                np.maximum.at(acc, (hit.row, hit.col), rule.confidence)
        block = -np.expm1(acc) if self.aggregation == "noisy_or" else acc
        block[np.arange(len(heads)), heads] = 0.0
        return block.astype(np.float32)

    @torch.no_grad()
    def scores(self, heads: np.ndarray, rels: np.ndarray) -> torch.Tensor:
        """(batch, entities) rule scores of (head, relation in 0..2R-1, ?), in [0, 1]; the head itself 0.

        On a graph small enough (``TABLE_BYTES`` for every relation's table), a relation's rows are computed
        for every head at its first query and kept: the same rows, computed once per relation."""
        heads, rels = np.asarray(heads, dtype=np.int64), np.asarray(rels, dtype=np.int64)
        if (heads >= self.num_entities).any():
            raise KGCError("the mined rules know no edges of entities added after they were mined")
        out = np.zeros((len(heads), self.num_entities), dtype=np.float32)
        for r in np.unique(rels):
            idx = np.flatnonzero(rels == r)
            if self.tables is None:
                out[idx] = self._rows(int(r), heads[idx])
                continue
            table = self.tables.get(int(r))
            if table is None:
                table = self.tables[int(r)] = self._rows(int(r), np.arange(self.num_entities))
            out[idx] = table[heads[idx]]
        return torch.from_numpy(out)

    def explain(self, head: int, relation: int, entity: int, limit: int = 5) -> list[Rule]:
        """The rules (highest confidence first) whose body reaches ``entity`` from ``head`` under ``relation``."""
        fired = [rule for rule in self.by_relation.get(int(relation), [])
                 if self.reached(rule, np.array([head]))[0, entity] > 0]
        return fired[:limit]

    # ------------------------------------------------------------------ files

    def save(self, folder: Path, labels) -> None:
        """``rules.tsv`` (``labels(rel_id) -> str`` names the relations) and ``edges.npy`` in ``folder``."""
        folder = Path(folder)
        rows = [{"relation": labels(r.relation), "body": " ∘ ".join(labels(b) for b in r.body),
                 "support": r.support, "body_pairs": r.body_pairs, "confidence": f"{r.confidence:.6f}",
                 "relation_id": r.relation, "body_ids": ",".join(map(str, r.body))} for r in self.rules]

        write_tsv(folder / RULES_FILE, rows, COLUMNS)
        write_npy(folder / EDGES_FILE, self.edges.astype(np.int32))

    @classmethod
    def load(cls, folder: Path, meta: dict, fix: str) -> "RuleModel":
        """The rules saved in ``folder``; a damaged file is one KGCError naming it (and ``fix``)."""
        folder = Path(folder)
        rules = []
        path = folder / RULES_FILE
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f, delimiter="\t")
                if reader.fieldnames != COLUMNS:
                    raise ValueError(f"columns {reader.fieldnames}, expected {COLUMNS}")
                for line, row in enumerate(reader, start=2):
                    try:
                        rules.append(Rule(int(row["relation_id"]), tuple(int(b) for b in row["body_ids"].split(",")),
                                          int(row["support"]), int(row["body_pairs"]), float(row["confidence"])))
                    except (TypeError, ValueError, AttributeError):
                        raise ValueError(f"line {line} is not a rule kgc wrote") from None
            edges = np.load(folder / EDGES_FILE, allow_pickle=False).astype(np.int64)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise KGCError(f"{folder}: the mined rules are unreadable ({str(exc).splitlines()[0][:200]}). {fix}") \
                from None
        entities, relations2 = int(meta["entities"]), 2 * int(meta["relations"])
        if edges.ndim != 2 or edges.shape[1] != 3 or (len(edges) and (
                edges.min() < 0 or edges[:, [0, 2]].max() >= entities or edges[:, 1].max() >= relations2)) or any(
                not 0 <= r.relation < relations2 or any(not 0 <= b < relations2 for b in r.body) for r in rules):
            raise KGCError(f"{folder}: the mined rules do not fit a graph of {entities} entities and "
                           f"{relations2 // 2} relations. {fix}")
        return cls(rules, edges, entities, relations2, aggregation=meta["params"].get("rule_aggregation", "noisy_or"))


def mine_graph(config: RulesOptions, graph) -> tuple[list[Rule], np.ndarray]:
    """``graph``'s train rules mined with ``config``'s ``rule_*`` options, and the edges they were mined from
    (train, both directions)."""
    edges = graph.both_directions("train")
    rules = mine_rules(edges, graph.num_entities, 2 * graph.num_relations, max_length=config.rule_length,
                       min_support=config.rule_min_support, unseen=config.rule_unseen,
                       min_confidence=config.rule_min_confidence, max_per_relation=config.rule_max_per_relation)
    return rules, edges


def mine(config, graph, folder: Path, *, echo=print) -> tuple["RuleModel", float]:
    """Mine ``graph``'s train rules with ``config`` (a StructureConfig), save them in ``folder``; return the
    model and the seconds it took."""
    start = time.perf_counter()
    echo(f"mining rules of length ≤ {config.rule_length} from {len(graph.splits['train'])} train triples "
         f"({2 * graph.num_relations} relations with the inverses)")
    rules, edges = mine_graph(config, graph)
    seconds = time.perf_counter() - start
    model = RuleModel(rules, edges, graph.num_entities, 2 * graph.num_relations, config.rule_aggregation)
    model.save(folder, graph.relation_label)
    return model, seconds


def rule_summary(model: RuleModel, graph, top: int = 1) -> list[str]:
    """Per relation: how many rules, and the best ``top`` of them, readable."""
    lines = []
    for r in range(2 * graph.num_relations):
        rules = model.by_relation.get(r, [])
        best = "; ".join(f"{' ∘ '.join(graph.relation_label(b) for b in x.body)} ({x.confidence:.3f})"
                         for x in rules[:top])
        lines.append(f"{graph.relation_label(r)}: {len(rules)} rule(s){', best: ' + best if best else ''}")
    return lines
