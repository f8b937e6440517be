"""Structure beside text: a PyKEEN model trained on the same train triples (or rules mined from them,
``structure.model: rules``: :mod:`kgc.linkpred.structure.rules`), its scores fused with the text's.

Text models cannot tell ``person17`` from ``person42`` (Kinships: names carry no meaning); a structural
model learns them from the graph alone. A run whose recipe has a ``structure:`` section trains one through
``pykeen.pipeline.pipeline`` at the end of ``kgc train`` (or alone: ``kgc structure RUN``), with kgc's own
entity and relation ids, and saves it in ``RUN/structure/`` (``model.pt``: the pickled PyKEEN model;
``meta.json``: its settings, train seconds, dev metrics, PyKEEN version).

Fusion, per query q = (h, r, ?) and every entity e (r ≥ R, kgc's inverse relation, is PyKEEN's head
prediction of relation r − R, through PyKEEN's inverse relation: ``predict_h``)::

    z(x)_e      = (x_e − mean_e' x_e') / (std_e' x_e' + 1e-12)      (over all entities, per query, unfiltered)
    fused(q, e) = α · z(cos(g(h | r), f(e)))_e + (1 − α) · z(s_pykeen(h, r, e))_e

α = 1 is the text model alone, α = 0 the structural model alone (z is monotone per query, so each
component keeps its own ranks). α is chosen on dev from ``structure.alphas`` by filtered dev MRR (ties:
the larger α) and stored in ``structure/alpha.json``. Entities the structural model never saw (added with
``kgc index --add``), or a query head it never saw, fall back to z(text) alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.fileio import write_json, write_with
from kgc.linkpred.structure.options import FusionOptions, PykeenOptions  # noqa: F401  (its options: kgc.linkpred.structure.options)

FORMULA = ("fused = alpha * z(text cosine) + (1 - alpha) * z(structural score); z standardises each query's "
           "scores over all entities (mean 0, population std 1); alpha chosen on dev by filtered MRR")
EPS = 1e-12


def has_structure(folder: Path) -> bool:
    """``folder`` (a run's ``structure/``) holds a trained structural model: the ``meta.json`` each kind writes
    last (or, as before kinds, PyKEEN's model.pt or the mined rules)."""
    from kgc.linkpred.structure.rules import RULES_FILE

    folder = Path(folder)
    return any((folder / name).is_file() for name in ("meta.json", "model.pt", RULES_FILE))


def _factory(triples: np.ndarray, graph: KnowledgeGraph, inverse: bool = True):
    """kgc's ids as a PyKEEN factory. ``inverse``: PyKEEN adds (t, r⁻¹, h) for every triple, as kgc does — its
    LCWA loop otherwise trains tail prediction only (on UMLS, RotatE: 0.89 MRR on tails, 0.54 on heads)."""
    from pykeen.triples import TriplesFactory

    return TriplesFactory(mapped_triples=torch.as_tensor(np.asarray(triples), dtype=torch.long),
                          entity_to_id={e: i for i, e in enumerate(graph.entities)},
                          relation_to_id={r: i for i, r in enumerate(graph.relations)},
                          create_inverse_triples=inverse)


def pipeline_kwargs(config: PykeenOptions, *, seed: int, device, progress: bool) -> dict:
    """``pykeen.pipeline.pipeline`` keyword arguments for ``config`` (everything but the triples)."""
    kwargs = {}
    if config.training_loop == "slcwa":
        kwargs.update(negative_sampler="basic", negative_sampler_kwargs={"num_negs_per_pos": config.negatives})
    if config.loss is not None:
        kwargs["loss"] = config.loss
        if config.loss_kwargs:
            kwargs["loss_kwargs"] = dict(config.loss_kwargs)
    return dict(model=config.model, model_kwargs={"embedding_dim": config.dim, **config.model_kwargs},
                optimizer="Adam", optimizer_kwargs={"lr": config.lr}, training_loop=config.training_loop,
                training_kwargs={"num_epochs": config.epochs, "batch_size": config.batch_size, "use_tqdm": progress,
                                 "use_tqdm_batch": False},  # one bar, by epoch
                evaluation_kwargs={"use_tqdm": False, "batch_size": config.batch_size}, random_seed=seed,
                device=device, **kwargs)


def train_pykeen(config: PykeenOptions, graph: KnowledgeGraph, folder: Path, *, seed: int = 0,
                 device: str = "auto", progress: bool = False, echo=print) -> dict:
    """Train ``config.model`` with PyKEEN's pipeline on ``graph``'s train triples (kgc's ids), evaluate it on dev
    (PyKEEN's filtered evaluation), save ``RUN/structure/{model.pt, meta.json}``; return the meta."""
    import pykeen
    from pykeen.pipeline import pipeline

    from kgc.training.common import pick_device
    dev = pick_device(config.device or device)
    seed = config.seed if config.seed is not None else seed
    echo(f"training the structural model {config.model} (dim {config.dim}, {config.epochs} epochs) with PyKEEN "
         f"on {len(graph.splits['train'])} train triples")
    start = time.perf_counter()
    result = pipeline(training=_factory(graph.splits["train"], graph), testing=_factory(graph.splits["dev"], graph),
                      **pipeline_kwargs(config, seed=seed, device=dev, progress=progress))
    seconds = time.perf_counter() - start
    model = result.model.cpu().eval()
    write_with(folder / "model.pt", lambda p: torch.save(model, p))
    mr = result.metric_results
    meta = {"model": type(model).__name__, "params": config.model_dump(mode="json"), "seed": seed,
            "train_seconds": round(result.train_seconds, 2), "seconds": round(seconds, 2),
            "losses": [round(float(x), 5) for x in result.losses],
            "dev": {"mrr": float(mr.get_metric("both.realistic.inverse_harmonic_mean_rank")),
                    "hits_at_10": float(mr.get_metric("both.realistic.hits_at_10")),
                    "filtered_with": "train and dev (PyKEEN's pipeline; kgc evaluate also filters test triples)"},
            "entities": graph.num_entities, "relations": graph.num_relations, "device": str(dev),
            "pykeen_version": pykeen.get_version(), "trained_at": time.time()}
    write_json(folder / "meta.json", meta)
    echo(f"structural model trained in {seconds:.1f}s, dev MRR {meta['dev']['mrr']:.4f} (PyKEEN)")
    return meta


def train_rules(config: FusionOptions, graph: KnowledgeGraph, folder: Path, *, echo=print) -> dict:
    """``structure.model: rules``: mine, save and rank dev with the rules alone (kgc's filtered protocol)."""
    from kgc.linkpred.structure.rules import mine, rule_summary

    model, seconds = mine(config, graph, folder, echo=echo)
    meta = {"model": "rules", "params": config.model_dump(mode="json"), "seed": None,
            "train_seconds": round(seconds, 2), "seconds": round(seconds, 2), "rules": len(model.rules),
            "entities": graph.num_entities, "relations": graph.num_relations, "device": "cpu",
            "trained_at": time.time()}
    structure = RuleStructure(model=model, meta=meta)
    if len(graph.splits.get("dev", ())):
        start = time.perf_counter()
        result = rank_structure(structure, graph, "dev")
        meta["dev"] = {"mrr": mrr(result), "hits_at_10": float(result["both"]["realistic"]["hits_at_10"]),
                       "hits_at_1": float(result["both"]["realistic"]["hits_at_1"]),
                       "seconds": round(time.perf_counter() - start, 2),
                       "filtered_with": "train, dev and test (kgc's protocol; rules alone, ties ranked realistically)"}
    write_json(folder / "meta.json", meta)
    for line in rule_summary(model, graph):
        echo(f"  {line}")
    dev = f", dev MRR {meta['dev']['mrr']:.4f} alone" if "dev" in meta else ""
    lengths = np.bincount([len(x.body) for x in model.rules], minlength=2)[1:]
    by_length = f" (of length {', '.join(str(i + 1) for i in range(len(lengths)))}: " \
                f"{', '.join(str(int(n)) for n in lengths)})" if len(lengths) > 1 else ""
    echo(f"{len(model.rules)} rules mined in {seconds:.1f}s{by_length}{dev}")
    return meta


@dataclass
class Structure:
    """A trained PyKEEN model over the first ``num_entities`` entity ids of a kgc graph."""
    model: torch.nn.Module
    meta: dict

    @property
    def num_entities(self) -> int:
        return int(self.meta["entities"])

    @property
    def num_relations(self) -> int:
        return int(self.meta["relations"])

    @property
    def name(self) -> str:
        return self.meta["model"]

    @property
    def alphas(self) -> list[float]:
        return list(self.meta["params"].get("alphas") or FusionOptions().alphas)

    @torch.no_grad()
    def scores(self, heads: np.ndarray, rels: np.ndarray) -> torch.Tensor:
        """(batch, structural entities) PyKEEN scores of (head, relation in 0..2R-1, ?): tail prediction for
        r < R, head prediction of relation r − R (``predict_h``: (t, r⁻¹, ?) in PyKEEN) for kgc's inverse relations."""
        heads, rels = np.asarray(heads, dtype=np.int64), np.asarray(rels, dtype=np.int64)
        r = self.num_relations
        if (heads >= self.num_entities).any():
            raise KGCError("the structural model has no embedding for entities added after it was trained")
        out = torch.empty(len(heads), self.num_entities)
        dev = self.model.device
        tail = rels < r
        if tail.any():
            hr = torch.as_tensor(np.stack([heads[tail], rels[tail]], 1), device=dev)
            out[torch.as_tensor(tail)] = self.model.predict_t(hr).float().cpu()
        if (~tail).any():
            rt = torch.as_tensor(np.stack([rels[~tail] - r, heads[~tail]], 1), device=dev)
            # predict_h: through the inverse relation when PyKEEN trained with inverse triples (f(t, r⁻¹, ·))
            out[torch.as_tensor(~tail)] = self.model.predict_h(rt).float().cpu()
        return out


class RuleStructure(Structure):
    """Mined rules (:class:`kgc.linkpred.structure.rules.RuleModel`) in the place of a PyKEEN model."""

    @torch.no_grad()
    def scores(self, heads: np.ndarray, rels: np.ndarray) -> torch.Tensor:
        """(batch, structural entities) rule scores of (head, relation in 0..2R-1, ?)."""
        return self.model.scores(heads, rels)


def rank_structure(structure: Structure, graph: KnowledgeGraph, split: str, *, batch_size: int = 256) -> dict:
    """The structural model alone on ``split`` (both directions, filtered, realistic ranks): PyKEEN's metrics."""
    from kgc.linkpred.evaluation.ranking import rank_dense

    return rank_dense(graph, graph.splits[split], lambda q: structure.scores(q[:, 0], q[:, 1]),
                      batch_size=batch_size).finalize().to_dict()


def load_pykeen(folder: Path, meta: dict, device: str | torch.device, fix: str) -> Structure:
    """The PyKEEN model of ``folder/model.pt``."""
    try:
        model = torch.load(folder / "model.pt", map_location=device, weights_only=False).eval()
    except Exception as exc:  # truncated file, pickle error: torch raises many kinds
        raise KGCError(f"{folder / 'model.pt'}: unreadable ({str(exc).splitlines()[0][:200]}). {fix}") from None
    return Structure(model=model, meta=meta)


def standardise(x: torch.Tensor) -> torch.Tensor:
    """(batch, n): each row to mean 0, population std 1 (NaN-free input)."""
    x = x.float()
    return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True, unbiased=False) + EPS)


def fused_scores(text: torch.Tensor, structural: torch.Tensor | None, alpha: "float | torch.Tensor",
                 heads: np.ndarray | None = None, num_structural: int | None = None) -> torch.Tensor:
    """(batch, entities) α·z(text) + (1 − α)·z(structural); ``alpha`` one number or (batch, 1), one per row.
    ``structural`` (batch, n ≤ entities) covers the first n entities; the others, and rows whose head is ≥ n,
    are z(text) alone."""
    zt = standardise(text)
    if structural is None or (not isinstance(alpha, torch.Tensor) and alpha == 1.0):
        return zt
    n = structural.size(1)
    zs = standardise(structural)
    out = zt.clone()
    out[:, :n] = alpha * zt[:, :n] + (1 - alpha) * zs
    if heads is not None:
        unseen = torch.as_tensor(np.asarray(heads) >= (num_structural or n))
        out[unseen] = zt[unseen]
    return out


@dataclass(frozen=True)
class RelationAlphas:
    """One α per query relation (ids 0..2R-1, inverses included), chosen on dev (``structure.alpha_per:
    relation``): a variant of :class:`FusedScores` like a single α."""
    alphas: tuple[float, ...]

    def rows(self, rels: np.ndarray) -> torch.Tensor:
        """(batch, 1) the α of each query's relation."""
        return torch.tensor([self.alphas[int(r)] for r in np.asarray(rels)], dtype=torch.float32).unsqueeze(1)

    def __str__(self) -> str:
        return "per relation"

    def __repr__(self) -> str:
        return f"RelationAlphas({len(self.alphas)} relations)"


def alpha_of(choice: dict) -> "float | RelationAlphas":
    """The α a stored choice (``alpha.json``) fuses with: one for every query, or one per relation."""
    per = choice.get("per_relation")
    return RelationAlphas(tuple(float(x["alpha"]) for x in per)) if per else float(choice["alpha"])


class FusedScores:
    """The scorer of fused text + structure scores for every α in ``alphas`` at once (the query vectors and
    the structural scores are computed once per chunk). z standardises over every entity, so each chunk is
    scored densely: :meth:`max_rows` keeps its rows within the evaluation's score budget."""

    def __init__(self, table: torch.Tensor, structure: Structure, alphas: list[float]) -> None:
        self.table, self.structure, self.variants = table, structure, list(alphas)

    def blocks(self, query_vectors, queries):
        text = (query_vectors.float() @ self.table.t()).cpu()  # (batch, entities)
        struct = self.structure.scores(queries[:, 0], queries[:, 1])  # (batch, entities)
        out = {}
        for a in self.variants:
            fused = fused_scores(text, struct, a.rows(queries[:, 1]) if isinstance(a, RelationAlphas) else a)
            out[a] = lambda r0, r1, c0, c1, f=fused: f[r0:r1, c0:c1].clone()
        return out

    def max_rows(self, n_entities, max_score_bytes):
        return max(1, max_score_bytes // (4 * n_entities * (2 + len(self.variants))))


def fused_scorer(structure: Structure, alphas: list[float]):
    """``evaluate(..., scorer=fused_scorer(structure, alphas))``: rank by the fused scores of every α."""
    return lambda table: FusedScores(table, structure, alphas)


def mrr(result: dict) -> float:
    return float(result["both"]["realistic"]["inverse_harmonic_mean_rank"])


def choose_alpha(folder: Path, model, graph: KnowledgeGraph, structure: Structure, *, batch_size: int = 256,
                 entity_table=None, progress: bool = False, engine=None, max_score_bytes: int | None = None) -> dict:
    """α by dev MRR over ``structure.alphas`` (stored in ``structure/alpha.json``; reused while the structural
    model is the same). Returns {alpha, grid: [{alpha, dev_mrr}], model}."""
    from kgc.linkpred.evaluation.scoring import evaluate
    from kgc.training.run import read_json

    if structure.num_entities != graph.num_entities:
        raise KGCError(f"the structural model knows {structure.num_entities} entities, the graph has "
                       f"{graph.num_entities}; retrain it with `kgc structure {Path(folder).parent}`")
    path = Path(folder) / "alpha.json"
    if path.is_file():
        stored = read_json(path, f"Delete it; `kgc evaluate {Path(folder).parent}` chooses alpha again.")
        if isinstance(stored, dict) and stored.get("structure_trained_at") == structure.meta.get("trained_at"):
            return stored
    alphas = structure.alphas
    extra = {} if max_score_bytes is None else {"max_score_bytes": max_score_bytes}
    ev = evaluate(model, graph, "dev", batch_size=batch_size, entity_table=entity_table, progress=progress,
                  engine=engine, scorer=fused_scorer(structure, alphas), **extra)
    grid = [{"alpha": a, "dev_mrr": round(mrr(ev.variants[a]), 5)} for a in alphas]
    best = max(grid, key=lambda g: (g["dev_mrr"], g["alpha"]))
    choice = {"alpha": best["alpha"], "grid": grid, "model": structure.name, "formula": FORMULA,
              "structure_trained_at": structure.meta.get("trained_at")}
    params = structure.meta.get("params", {})
    if params.get("alpha_per") == "relation":
        choice.update(per_relation_alphas(ev, graph, alphas, best["alpha"], params.get("alpha_min_queries", 50)))
    write_json(path, choice)
    return choice


def per_relation_alphas(ev, graph: KnowledgeGraph, alphas: list[float], fallback: float, min_queries: int) -> dict:
    """``structure.alpha_per: relation``: for each query relation (inverses apart) the α of the grid with the
    best dev MRR over that relation's dev queries (ties: the larger α); a relation with fewer than
    ``min_queries`` dev queries keeps ``fallback`` (the one α of the grid). Returns {per_relation: [{relation,
    alpha, queries}] for ids 0..2R-1, per_relation_dev_mrr}."""
    rels = ev.query_relations  # (queries,) relation id of each dev query, in ev's order
    recip = {a: 1.0 / ev.variant_ranks[a] for a in alphas}
    per, total = [], np.zeros(len(rels))
    for r in range(2 * graph.num_relations):
        mine = rels == r
        a = fallback
        if mine.sum() >= min_queries:
            a = max(alphas, key=lambda x: (float(recip[x][mine].mean()), x))
        per.append({"relation": graph.relation_label(r), "alpha": a, "queries": int(mine.sum())})
        total[mine] = recip[a][mine]
    return {"per_relation": per, "per_relation_dev_mrr": round(float(total.mean()), 5) if len(total) else None}


@torch.no_grad()
def predict_fused(query_vector: torch.Tensor, table: torch.Tensor, structure: Structure,
                  alpha: "float | RelationAlphas", *, head: int, relation: int) -> torch.Tensor:
    """(entities,) fused scores of one query over every entity of ``table`` (added ones too: text alone for
    them; a head the structural model never saw: text alone)."""
    if isinstance(alpha, RelationAlphas):
        alpha = alpha.alphas[int(relation)]
    text = query_vector.float().cpu().reshape(1, -1) @ table.t()  # (1, entities incl. added)
    struct = structure.scores([head], [relation]) if head < structure.num_entities else None
    return fused_scores(text, struct, alpha, heads=np.array([head]), num_structural=structure.num_entities)[0]
