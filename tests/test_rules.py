"""Rules counted from the train graph (structure.model: rules): mined and applied as a brute force over paths
would, saved and read back, fused with the text scores through `kgc train` / `kgc structure` / `kgc evaluate`."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest
import torch

from kgc.errors import KGCError
from kgc.linkpred.structure.rules import Rule, RuleModel, mine_rules
from tests.conftest import cli as kgc


def _random_edges(seed: int, entities: int = 14, relations: int = 3, triples: int = 45) -> np.ndarray:
    """(n, 3) train triples in both directions over 2R relation ids (r + R: r read backwards)."""
    rng = np.random.default_rng(seed)
    t = np.stack([rng.integers(0, entities, triples), rng.integers(0, relations, triples),
                  rng.integers(0, entities, triples)], 1)
    t = t[t[:, 0] != t[:, 2]]
    sym = t[t[:, 1] == 0]  # relation 0 mostly symmetric, so length-1 rules have something to find
    t = np.concatenate([t, sym[:, ::-1][: len(sym) * 2 // 3]])
    return np.concatenate([t, np.stack([t[:, 2], t[:, 1] + relations, t[:, 0]], 1)])


def _brute_rules(edges: np.ndarray, r2: int, min_support: int, unseen: float, min_conf: float) -> dict:
    """{(relation, body): (support, body pairs)} by enumerating paths in Python sets."""
    facts = {(int(h), int(r), int(t)) for h, r, t in edges}
    by_rel = {r: {(h, t) for h, rr, t in facts if rr == r} for r in range(r2)}
    bodies = {(b,): {(x, y) for x, y in by_rel[b] if x != y} for b in range(r2)}
    for b1, b2 in itertools.product(range(r2), repeat=2):
        bodies[(b1, b2)] = {(x, y) for x, z in by_rel[b1] for z2, y in by_rel[b2] if z == z2 and x != y}
    out = {}
    for body, pairs in bodies.items():
        for r in range(r2):
            if body == (r,) or not pairs:
                continue
            support = len(pairs & by_rel[r])
            if support >= min_support and support / (len(pairs) + unseen) >= min_conf:
                out[(r, body)] = (support, len(pairs))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mined_rules_equal_a_brute_force_count(seed):
    edges = _random_edges(seed)
    rules = mine_rules(edges, 14, 6, min_support=1, unseen=2.0, min_confidence=0.05)
    want = _brute_rules(edges, 6, 1, 2.0, 0.05)
    assert {(x.relation, x.body): (x.support, x.body_pairs) for x in rules} == want
    assert all(x.confidence == pytest.approx(x.support / (x.body_pairs + 2.0)) for x in rules)
    # sorted by relation, then confidence; the cap keeps each relation's best
    assert [x.relation for x in rules] == sorted(x.relation for x in rules)
    capped = mine_rules(edges, 14, 6, min_support=1, unseen=2.0, min_confidence=0.05, max_per_relation=2)
    for r in range(6):
        assert [x for x in capped if x.relation == r] == [x for x in rules if x.relation == r][:2]


def _simple_paths(facts: set, head: int, body: tuple[int, ...]) -> dict:
    """{end: number of paths} of ``body`` from ``head`` whose variables are pairwise distinct (AnyBURL's object
    identity), by enumeration."""
    nxt: dict = {}
    for x, r, t in facts:
        nxt.setdefault((x, r), []).append(t)
    out: dict = {}
    stack = [(head, 0, {head})]
    while stack:
        node, depth, seen = stack.pop()
        if depth == len(body):
            out[node] = out.get(node, 0) + 1
            continue
        stack.extend((t, depth + 1, seen | {t}) for t in nxt.get((node, body[depth]), []) if t not in seen)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_length_3_rules_equal_a_brute_force_over_paths_with_distinct_variables(seed):
    """rule_length 3: every body's pairs are those a path with x, z1, z2, y pairwise distinct connects (the
    walks that come back to x or pass through y taken out), counted and applied as the enumeration does."""
    from kgc.linkpred.structure.rules import adjacency, paths

    edges = _random_edges(seed, entities=9, relations=2, triples=30)
    facts = {(int(h), int(r), int(t)) for h, r, t in edges}
    a = adjacency(np.unique(edges, axis=0), 9, 4)
    for body in itertools.product(range(4), repeat=3):
        got = paths(a, body).toarray()
        rows = paths(a, body, np.array([5, 0, 5])).toarray()
        for h in range(9):
            want = np.zeros(9)
            for e, n in _simple_paths(facts, h, body).items():
                want[e] = n
            assert got[h] == pytest.approx(want), (body, h)
        assert rows == pytest.approx(got[[5, 0, 5]])
    # mining: the length-2 rules as before, and each length-3 rule's support and body pairs by enumeration
    rules = mine_rules(edges, 9, 4, max_length=3, min_support=1, unseen=1.0, min_confidence=0.0)
    short = mine_rules(edges, 9, 4, max_length=2, min_support=1, unseen=1.0, min_confidence=0.0)
    assert [x for x in rules if len(x.body) < 3] == short
    by_rel = {r: {(h, t) for h, rr, t in facts if rr == r} for r in range(4)}
    want = {}
    for body in itertools.product(range(4), repeat=3):
        pairs = {(h, e) for h in range(9) for e in _simple_paths(facts, h, body) if e != h}
        for r in range(4):
            support = len(pairs & by_rel[r])
            if support:
                want[(r, body)] = (support, len(pairs))
    assert {(x.relation, x.body): (x.support, x.body_pairs) for x in rules if len(x.body) == 3} == want
    assert any(len(x.body) == 3 for x in rules)
    # applied: noisy-or over the rules whose simple paths reach the entity
    model = RuleModel(rules, edges, 9, 4)
    heads, rels = np.repeat(np.arange(9), 4), np.tile(np.arange(4), 9)
    got = model.scores(heads, rels)
    ends = {(h, x.body): _simple_paths(facts, h, x.body) for h in range(9) for x in rules}
    for i, (h, r) in enumerate(zip(heads, rels)):
        want_row = np.zeros(9)
        for e in range(9):
            confs = [x.confidence for x in rules if x.relation == r and ends[(h, x.body)].get(e)]
            if confs and e != h:
                want_row[e] = 1 - math.prod(1 - c for c in confs)
        assert got[i].numpy() == pytest.approx(want_row, abs=1e-6), (h, r)
    with pytest.raises(KGCError, match="length 1, 2 or 3"):
        mine_rules(edges, 9, 4, max_length=4)


def test_a_length_3_rule_by_hand():
    """sib(x, y) ⇐ sib(x, z1) ∧ parent(z1, p) ∧ parent⁻¹(p, y): a walk through y itself is no path."""
    from kgc.linkpred.structure.rules import adjacency, paths

    # parent (0): 1→3, 2→3, 4→5; sib (1): 0–1, 1–0; R = 2, so 2 is parent⁻¹ and 3 sib⁻¹
    fwd = np.array([[1, 0, 3], [2, 0, 3], [4, 0, 5], [0, 1, 1], [1, 1, 0]])
    edges = np.concatenate([fwd, np.stack([fwd[:, 2], fwd[:, 1] + 2, fwd[:, 0]], 1)])
    a = adjacency(edges, 6, 4)
    got = paths(a, (1, 0, 2)).toarray()
    # 0 → 1 → 3 → 2 is a path (0, 1, 3, 2 distinct); 0 → 1 → 3 → 1 passes y = z1 (no path); 1 → 0 has no parent
    assert got[0].tolist() == [0, 0, 1, 0, 0, 0] and got[1:].sum() == 0
    # parent ∘ parent⁻¹ ∘ parent: 1 → 3 → 2 → 3 comes back to z1 = y (no path), 1 → 3 → 1 → 3 to x (no path)
    assert paths(a, (0, 2, 0)).nnz == 0
    # the walks count both: A1·A2·A3 has them
    assert (a[0] @ a[2] @ a[0]).nnz > 0


def test_a_symmetric_relation_by_hand():
    # sim: 0-1, 1-0, 2-3, 3-2, 4-5 (5-4 missing); R = 1, so id 1 is "sim read backwards"
    fwd = np.array([[0, 0, 1], [1, 0, 0], [2, 0, 3], [3, 0, 2], [4, 0, 5]])
    edges = np.concatenate([fwd, np.stack([fwd[:, 2], fwd[:, 1] + 1, fwd[:, 0]], 1)])
    rules = {(x.relation, x.body): x for x in mine_rules(edges, 6, 2, max_length=1, min_support=1, unseen=5)}
    sym = rules[(0, (1,))]  # sim(x, y) ⇐ sim(y, x): body pairs (1,0) (0,1) (3,2) (2,3) (5,4); 4 of them hold
    assert (sym.support, sym.body_pairs) == (4, 5) and sym.confidence == pytest.approx(4 / 10)
    model = RuleModel(list(rules.values()), edges, 6, 2)
    s = model.scores(np.array([5, 0]), np.array([0, 0]))  # (5, sim, ?): 4, by the rule; (0, sim, ?): 1
    assert s[0, 4] == pytest.approx(0.4) and s[0].sum() == pytest.approx(0.4)
    assert s[1, 1] == pytest.approx(0.4) and s[1, 0] == 0  # never the head itself
    assert model.explain(5, 0, 4) == [sym] and model.explain(5, 0, 3) == []


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "rows"])
@pytest.mark.parametrize("aggregation", ["noisy_or", "max"])
def test_scores_equal_a_brute_force_over_paths(aggregation, tables):
    """Both ways of scoring: a small graph's per-relation tables (every head's row at the first query of a
    relation, kept), and a large graph's rows computed for the batch's heads alone."""
    edges = _random_edges(7, entities=12, triples=40)
    rules = mine_rules(edges, 12, 6, min_support=1, unseen=1.0, min_confidence=0.0)
    model = RuleModel(rules, edges, 12, 6, aggregation=aggregation)
    assert model.tables == {} and RuleModel([], edges, 5000, 6).tables is None  # 5000² × 4 B × 6 > TABLE_BYTES
    if not tables:
        model.tables = None  # as on a graph whose tables would pass TABLE_BYTES
    facts = {(int(h), int(r), int(t)) for h, r, t in edges}
    heads = np.repeat(np.arange(12), 6)
    rels = np.tile(np.arange(6), 12)
    got = model.scores(heads, rels)
    for i, (h, r) in enumerate(zip(heads, rels)):
        want = np.zeros(12)
        confs = {e: [] for e in range(12)}
        for rule in (x for x in rules if x.relation == r):
            ends = {h}
            for b in rule.body:
                ends = {t for (x, rr, t) in facts for e in ends if x == e and rr == b}
            for e in ends:
                confs[e].append(rule.confidence)
        for e, cs in confs.items():
            if cs and e != h:
                want[e] = max(cs) if aggregation == "max" else 1 - math.prod(1 - c for c in cs)
        assert got[i].numpy() == pytest.approx(want, abs=1e-6), (h, r)
    assert model.tables is None or sorted(model.tables) == list(range(6))
    assert torch.equal(model.scores(heads[::-1].copy(), rels[::-1].copy()), got.flip(0))  # the kept tables: same rows


def test_saved_rules_read_back_and_damage_is_named(tmp_path):
    edges = _random_edges(3)
    rules = mine_rules(edges, 14, 6, min_support=1)
    model = RuleModel(rules, edges, 14, 6)
    model.save(tmp_path, lambda r: f"rel{r}")
    meta = {"entities": 14, "relations": 3, "params": {"rule_aggregation": "noisy_or"}}
    back = RuleModel.load(tmp_path, meta, "fix it")
    assert back.rules == [Rule(x.relation, x.body, x.support, x.body_pairs, round(x.confidence, 6)) for x in rules]
    q = (np.arange(14), np.full(14, 2))
    assert torch.allclose(back.scores(*q), model.scores(*q), atol=1e-5)
    with pytest.raises(KGCError, match="entities added"):
        model.scores(np.array([14]), np.array([0]))
    lines = (tmp_path / "rules.tsv").read_text().splitlines()
    (tmp_path / "rules.tsv").write_text("\n".join(lines[:2] + ["rel0\tx\tmany"]) + "\n")
    with pytest.raises(KGCError, match=r"rules.*unreadable.*line 3.*fix it"):
        RuleModel.load(tmp_path, meta, "fix it")
    model.save(tmp_path, lambda r: f"rel{r}")
    with pytest.raises(KGCError, match="do not fit a graph of 10 entities"):
        RuleModel.load(tmp_path, {**meta, "entities": 10}, "fix it")


@pytest.fixture(scope="module")
def rules_run(tiny_bert, tmp_path_factory, data_home):
    from tests.test_structure import train_fused

    run, out = train_fused(tiny_bert, tmp_path_factory.mktemp("rules"), {
        "model": "rules", "alphas": [0.0, 0.5, 0.9, 1.0], "alpha_per": "relation", "alpha_min_queries": 8,
        "rule_max_per_relation": 10})
    assert "rules mined" in out
    assert re.search(r"rules mined in [\d.]+s \(of length 1, 2: \d+, \d+\)", out), out[-400:]
    return run


def test_alpha_per_relation_is_each_relations_best_on_dev(rules_run):
    from kgc.linkpred.evaluation.scoring import evaluate
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.linkpred.structure.kinds import load_structure
    from kgc.linkpred.structure.pykeen import RelationAlphas, alpha_of, choose_alpha, fused_scorer

    run = LinkPredRun(rules_run, device="cpu", echo=None)
    model, graph, st = run.predictor.model(), run.predictor.graph(), load_structure(run.dir.structure)
    choice = choose_alpha(run.dir.structure, model, graph, st)
    grid = [0.0, 0.5, 0.9, 1.0]
    per = {a: evaluate(model, graph, "dev", scorer=fused_scorer(st, [a])).ranks for a in grid}  # one α at a time
    own = 0
    for r, chosen in enumerate(choice["per_relation"]):
        label = graph.relation_label(r)
        rows = {a: [1 / x["rank"] for x in per[a] if x["relation"] == label] for a in grid}
        assert chosen["relation"] == label and chosen["queries"] == len(rows[0.0])
        if len(rows[0.0]) >= 8:
            own += 1
            best = max(grid, key=lambda a: (np.mean(rows[a]), a))
            assert chosen["alpha"] == best, label
        else:
            assert chosen["alpha"] == choice["alpha"]  # too few dev queries: the one α
    assert own >= 5
    picked = [choice["per_relation"][int(rel)]["alpha"] for rel in graph.both_directions("dev")[:, 1]]
    by_query = {a: [1 / x["rank"] for x in per[a]] for a in grid}
    assert choice["per_relation_dev_mrr"] == pytest.approx(
        np.mean([by_query[a][i] for i, a in enumerate(picked)]), abs=1e-5)
    # on test, each query ranks as under its relation's α alone
    alpha = alpha_of(choice)
    assert isinstance(alpha, RelationAlphas)
    fused = evaluate(model, graph, "test", scorer=fused_scorer(st, [alpha])).ranks
    single = {a: evaluate(model, graph, "test", scorer=fused_scorer(st, [a])).ranks for a in set(alpha.alphas)}
    rels = graph.both_directions("test")[:, 1]
    assert [x["rank"] for x in fused] == pytest.approx(
        [single[alpha.alphas[int(r)]][i]["rank"] for i, r in enumerate(rels)])


def test_rules_fused_through_the_cli(rules_run):
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.linkpred.structure.kinds import load_structure
    from kgc.linkpred.structure.pykeen import rank_structure

    meta = json.loads((rules_run / "structure" / "meta.json").read_text())
    assert meta["model"] == "rules" and meta["rules"] > 0 and 0 < meta["dev"]["mrr"] <= 1
    out = kgc("evaluate", rules_run, "--no-progress")
    assert "structure only (rules)" in out.stdout and "alpha per relation" in out.stdout
    res = json.loads((rules_run / "results.json").read_text())
    assert res["kgc"]["structure"]["model"] == "rules" and len(res["kgc"]["structure"]["per_relation"]) == 92
    # α = 0 is the rules alone, ranked by the same protocol as rank_structure
    run = LinkPredRun(rules_run, device="cpu", echo=None)
    alone = rank_structure(load_structure(run.dir.structure), run.predictor.graph(), "test")
    mrr = lambda d: d["both"]["realistic"]["inverse_harmonic_mean_rank"]  # noqa: E731
    assert mrr(res["kgc"]["components"]["structure"]) == pytest.approx(mrr(alone), abs=1e-6)
    # --text-only: the text model alone, into results.text.json; the fused results stay
    text = kgc("evaluate", rules_run, "--text-only", "--no-rerank", "--no-progress")
    assert "the text model alone" in text.stdout and "results.text.json" in text.stdout
    assert mrr(json.loads((rules_run / "results.text.json").read_text())) == pytest.approx(
        mrr(res["kgc"]["components"]["text"]), abs=1e-6)
    assert json.loads((rules_run / "results.json").read_text()) == res
    pred = kgc("predict", rules_run, "--head", "acquired_abnormality", "--relation", "location_of", "--top-k", "5",
               "--json", "--no-progress")
    assert len(json.loads(pred.stdout)["predictions"]) == 5
    # back to a PyKEEN model: the rules' files go
    kgc("structure", rules_run, "--set", "structure.model=DistMult", "--set", "structure.dim=4",
        "--set", "structure.epochs=1", "--no-progress")
    assert not (rules_run / "structure" / "rules.tsv").exists() and (rules_run / "structure" / "model.pt").exists()
    bad = kgc("structure", rules_run, "--set", "structure.rule_aggregation=sum", check=False)
    assert bad.returncode != 0 and "rule_aggregation" in bad.stdout + bad.stderr


def test_a_structural_model_is_replaced_whole_or_not_at_all(rules_run, monkeypatch):
    """train_structure hands the kind a new empty folder that replaces structure/ when it is done: a training that
    fails half-way (a file written, then an error) leaves the previous model's files as they were, and no staged
    folder behind."""
    import kgc
    from kgc.linkpred.structure.kinds import PykeenKind, train_structure
    from kgc.recipe import resolve_recipe

    folder = rules_run / "structure"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert "meta.json" in before

    def half_way(self, config, graph, into, **options):
        (into / "model.pt").write_bytes(b"half")
        raise RuntimeError("the structural model's training failed")

    monkeypatch.setattr(PykeenKind, "train", half_way)
    config = resolve_recipe({"task": "linkpred", "structure": {"model": "TransE", "dim": 4, "epochs": 1}}).structure
    with pytest.raises(RuntimeError, match="training failed"):
        train_structure(config, kgc.load(rules_run, echo=None).predictor.graph(), folder, echo=lambda m: None)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in rules_run.iterdir() if "structure" in p.name] == ["structure"]  # nothing staged left


def test_bench_rules_compares_tables_and_rows_on_the_same_scores(tmp_path):
    from tests.conftest import TOY_TEST, write_toy

    recipe = tmp_path / "toy_rules.yaml"
    recipe.write_text(f"name: toy_rules\ndata: {{dataset: {write_toy(tmp_path / 'TOY')}}}\n"
                      "structure: {model: rules, rule_min_support: 1}\n")
    out = kgc("bench", "rules", recipe, "--split", "test", "--batch-size", "2", "--out", tmp_path / "b.json")
    assert "tables over rows" in out.stdout and "the scores equal" in out.stdout
    got = json.loads((tmp_path / "b.json").read_text())
    assert got["rules"] > 0 and got["queries"] == 2 * len(TOY_TEST)
    assert set(got["seconds"]) == {"tables", "rows"} and got["speedup"] > 0
    assert "choose one of" in kgc("bench", "rules", recipe, "--split", "nope", check=False).stderr
