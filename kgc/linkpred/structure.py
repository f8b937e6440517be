"""Structure beside text: a PyKEEN model trained on the same train triples, its scores fused with the text's.

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

from typing import TYPE_CHECKING

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.fileio import write_json, write_tsv, write_with
from kgc.recipe import Recipe, StructureConfig

FOLDER = "structure"
FORMULA = ("fused = alpha * z(text cosine) + (1 - alpha) * z(structural score); z standardises each query's "
           "scores over all entities (mean 0, population std 1); alpha chosen on dev by filtered MRR")
EPS = 1e-12

if TYPE_CHECKING:  # pykeen loads when a structural model is trained or scored, not for `has_structure`
    from pykeen.evaluation.ranks import Ranks


def has_structure(run) -> bool:
    return (Path(run.path) / FOLDER / "model.pt").is_file()


def _factory(triples: np.ndarray, graph: KnowledgeGraph, inverse: bool = True):
    """kgc's ids as a PyKEEN factory. ``inverse``: PyKEEN adds (t, r⁻¹, h) for every triple, as kgc does — its
    LCWA loop otherwise trains tail prediction only (on UMLS, RotatE: 0.89 MRR on tails, 0.54 on heads)."""
    from pykeen.triples import TriplesFactory

    return TriplesFactory(mapped_triples=torch.as_tensor(np.asarray(triples), dtype=torch.long),
                          entity_to_id={e: i for i, e in enumerate(graph.entities)},
                          relation_to_id={r: i for i, r in enumerate(graph.relations)},
                          create_inverse_triples=inverse)


def pipeline_kwargs(config: StructureConfig, *, seed: int, device, progress: bool) -> dict:
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


def train_structure(config: StructureConfig, graph: KnowledgeGraph, run_dir: str | Path, *, seed: int = 0,
                    device: str = "auto", progress: bool = False, echo=print) -> dict:
    """Train ``config.model`` with PyKEEN's pipeline on ``graph``'s train triples (kgc's ids), evaluate it on dev
    (PyKEEN's filtered evaluation), save ``RUN/structure/{model.pt, meta.json}``; return the meta."""
    import pykeen
    from pykeen.pipeline import pipeline

    from kgc.training.common import pick_device

    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
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
    (folder / "alpha.json").unlink(missing_ok=True)  # chosen for the previous structural model
    echo(f"structural model trained in {seconds:.1f}s, dev MRR {meta['dev']['mrr']:.4f} (PyKEEN) → {folder}")
    return meta


def train_run_structure(run, *, config: StructureConfig | None = None, progress: bool = False, echo=print) -> dict:
    """``kgc structure RUN``: (re)train the structural part of an existing run (``config``: default the recipe's)."""
    recipe: Recipe = run.recipe
    config = config or recipe.structure
    if config is None:
        raise KGCError(f"{run.path}: its recipe has no `structure:` section. Give one with --set, e.g. "
                       f"`kgc structure {run.path} --set structure.model=RotatE`")
    return train_structure(config, run.graph(), run.path, seed=recipe.train.seed, device=recipe.train.device,
                           progress=progress, echo=echo)


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


def load_structure(run, device: str | torch.device = "cpu") -> Structure:
    import json

    folder = Path(run.path) / FOLDER
    if not (folder / "model.pt").is_file():
        raise KGCError(f"{run.path} has no structural model; train one with `kgc structure {run.path}`")
    model = torch.load(folder / "model.pt", map_location=device, weights_only=False).eval()
    return Structure(model=model, meta=json.loads((folder / "meta.json").read_text()))


def standardise(x: torch.Tensor) -> torch.Tensor:
    """(batch, n): each row to mean 0, population std 1 (NaN-free input)."""
    x = x.float()
    return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True, unbiased=False) + EPS)


def fused_scores(text: torch.Tensor, structural: torch.Tensor | None, alpha: float,
                 heads: np.ndarray | None = None, num_structural: int | None = None) -> torch.Tensor:
    """(batch, entities) α·z(text) + (1 − α)·z(structural). ``structural`` (batch, n ≤ entities) covers the
    first n entities; the others, and rows whose head is ≥ n, are z(text) alone."""
    zt = standardise(text)
    if structural is None or alpha == 1.0:
        return zt
    n = structural.size(1)
    zs = standardise(structural)
    out = zt.clone()
    out[:, :n] = alpha * zt[:, :n] + (1 - alpha) * zs
    if heads is not None:
        unseen = torch.as_tensor(np.asarray(heads) >= (num_structural or n))
        out[unseen] = zt[unseen]
    return out


def _filtered_ranks(scores: torch.Tensor, queries: np.ndarray, known) -> Ranks:
    """Filtered ranks of a dense (batch, entities) score block: known answers other than the gold become NaN
    (:func:`kgc.linkpred.evaluate.mask_known_`, as ``rank_queries`` does), then pykeen's ``Ranks.from_scores``."""
    from pykeen.evaluation.ranks import Ranks

    from kgc.linkpred.evaluate import mask_known_

    answers = queries[:, 2]
    scores = mask_known_(scores.clone(), known, answers)
    true = scores[torch.arange(len(queries)), torch.as_tensor(answers)].unsqueeze(1)
    return Ranks.from_scores(true_score=true, all_scores=scores)


@torch.no_grad()
def evaluate_grid(model, graph: KnowledgeGraph, structure: Structure, split: str, alphas: list[float], *,
                  batch_size: int = 256, entity_table: torch.Tensor | None = None, progress: bool = False,
                  engine=None):
    """Filtered evaluation of ``split`` (both directions) for every α at once: the query vectors and the
    structural scores are computed once per batch. ``engine``: a :class:`QueryEngine` to reuse (its entity and
    relation states are computed once, for dev and test alike). Returns ({α: pykeen results}, {α: rows})."""
    from pykeen.evaluation import RankBasedEvaluator

    from kgc.linkpred.evaluate import query_directions, rank_rows, record_ranks
    from kgc.linkpred.model import QueryEngine

    if structure.num_entities != graph.num_entities:
        raise KGCError(f"the structural model knows {structure.num_entities} entities, the graph has "
                       f"{graph.num_entities}; retrain it with `kgc structure RUN`")
    model.eval()
    engine = engine or QueryEngine(model, batch_size=batch_size, progress=progress, entity_table=entity_table)
    if entity_table is None:
        entity_table = engine.entity_table if engine.entity_table is not None else model.entity_table(batch_size)
    table = entity_table.to(model.device)
    directions = query_directions(graph, graph.splits[split])
    evaluators = {a: RankBasedEvaluator(filtered=True, clear_on_finalize=False) for a in alphas}
    for target, queries in directions.items():
        for s in range(0, len(queries), batch_size):
            chunk = queries[s: s + batch_size]
            text = (engine(chunk[:, 0], chunk[:, 1]).float() @ table.t()).cpu()  # (batch, entities)
            struct = structure.scores(chunk[:, 0], chunk[:, 1])  # (batch, entities)
            known = graph.all_answers[graph.hr_keys(chunk[:, 0], chunk[:, 1])]
            for a in alphas:
                record_ranks(evaluators[a], target, _filtered_ranks(fused_scores(text, struct, a), chunk, known),
                             graph.num_entities)
    results = {a: ev.finalize().to_dict() for a, ev in evaluators.items()}
    rows = {a: rank_rows(ev, directions, graph) for a, ev in evaluators.items()}
    return results, rows


def _mrr(result: dict) -> float:
    return float(result["both"]["realistic"]["inverse_harmonic_mean_rank"])


def _structure_id(run) -> float:
    import json

    return json.loads((Path(run.path) / FOLDER / "meta.json").read_text())["trained_at"]


def choose_alpha(run, model, graph, structure: Structure, *, batch_size: int = 256, entity_table=None,
                 progress: bool = False, engine=None) -> dict:
    """α by dev MRR over ``structure.alphas`` (stored in ``structure/alpha.json``; reused while the structural
    model is the same). Returns {alpha, grid: [{alpha, dev_mrr}], model}."""
    import json

    path = Path(run.path) / FOLDER / "alpha.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("structure_trained_at") == _structure_id(run):
            return stored
    alphas = list(StructureConfig(**structure.meta["params"]).alphas)
    results, _ = evaluate_grid(model, graph, structure, "dev", alphas, batch_size=batch_size,
                               entity_table=entity_table, progress=progress, engine=engine)
    grid = [{"alpha": a, "dev_mrr": round(_mrr(results[a]), 5)} for a in alphas]
    best = max(grid, key=lambda g: (g["dev_mrr"], g["alpha"]))
    choice = {"alpha": best["alpha"], "grid": grid, "model": structure.name, "formula": FORMULA,
              "structure_trained_at": _structure_id(run)}
    write_json(path, choice)
    return choice


def evaluate_run_fused(run, split: str = "test", *, device="cpu", batch_size: int | None = None,
                       progress: bool = False):
    """``kgc evaluate`` for a run with a structural part: α on dev, then ``split`` fused (the main result in
    PyKEEN's layout) with ``kgc.components`` text-only (α = 1) and structure-only (α = 0)."""
    from kgc.linkpred.evaluate import Evaluation
    from kgc.linkpred.index import load_embeddings
    from kgc.linkpred.model import QueryEngine

    start = time.perf_counter()
    model, graph = run.load(device)
    structure = load_structure(run, device)
    bs = batch_size or run.recipe.eval.batch_size
    cached = load_embeddings(run, model)
    table = None if cached is None else torch.from_numpy(cached)
    engine = QueryEngine(model, batch_size=bs, progress=progress, entity_table=table)  # one for dev and test
    if table is None:
        table = engine.entity_table if engine.entity_table is not None else model.entity_table(bs, progress=progress)
    choice = choose_alpha(run, model, graph, structure, batch_size=bs, entity_table=table, progress=progress,
                          engine=engine)
    alpha = choice["alpha"]
    alphas = list(dict.fromkeys([alpha, 1.0, 0.0]))
    results, rows = evaluate_grid(model, graph, structure, split, alphas, batch_size=bs, entity_table=table,
                                  progress=progress, engine=engine)
    seconds = time.perf_counter() - start
    main = dict(results[alpha])
    main["kgc"] = {"split": split, "triples": int(len(graph.splits[split])), "queries": len(rows[alpha]),
                   "entities": graph.num_entities, "dataset": graph.source, "evaluation_seconds": round(seconds, 3),
                   "search": None, "rerank": None,
                   "structure": {"model": structure.name, "alpha": alpha, "grid": choice["grid"], "formula": FORMULA,
                                 "params": structure.meta["params"]},
                   "components": {"text": results[1.0], "structure": results[0.0]}}
    suffix = "" if split == "test" else f".{split}"
    write_json(run.path / f"results{suffix}.json", main)
    write_tsv(run.path / f"ranks{suffix}.tsv", rows[alpha])
    return Evaluation(results=main, ranks=rows[alpha], seconds=seconds)


@torch.no_grad()
def predict_fused(run, model, graph: KnowledgeGraph, *, head: str, relation: str, top_k: int = 10,
                  inverse: bool = False, filter_known: bool = False):
    """``kgc predict`` for a run with a structural part: every entity (added ones too, text alone for them)
    ranked by the fused score, α from ``structure/alpha.json`` (chosen on dev first when missing)."""
    from kgc.linkpred.predict import Prediction

    structure = load_structure(run)
    base_graph = run.graph()
    alpha = choose_alpha(run, model, base_graph, structure, batch_size=run.recipe.eval.batch_size)["alpha"]
    h = graph.find_entity(head)
    r = graph.find_relation(relation) + (graph.num_relations if inverse else 0)
    table = torch.from_numpy(np.load(Path(run.path) / "index" / "entities.npy")).float()  # graph rows, then added
    q = model.encode_queries([h], [r]).float().cpu()  # (1, dim)
    text = q @ table.t()  # (1, entities incl. added)
    struct = structure.scores([h], [r]) if h < structure.num_entities else None
    scores = fused_scores(text, struct, alpha, heads=np.array([h]), num_structural=structure.num_entities)[0]
    if filter_known and h < base_graph.num_entities:
        known = graph.all_answers[graph.hr_keys(np.array([h]), np.array([r]))].indices
        scores[torch.as_tensor(known[known < len(scores)])] = float("-inf")
    order = torch.argsort(scores, descending=True)[:top_k]
    preds = [Prediction(i + 1, graph.entities[e], graph.full_texts[e], float(scores[e]))
             for i, e in enumerate(order.tolist()) if torch.isfinite(scores[e])]
    return h, r, preds, alpha
