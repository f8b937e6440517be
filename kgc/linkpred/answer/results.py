"""A run's evaluations — by the text model, fused with the structural model, within the index's top K, over the
entities of an inductive split — from the run's predictor (model, structural model, α) and entity index (its
embeddings, its search), and their files written into the run as one transaction."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from kgc.errors import KGCError
from kgc.fileio import Transaction, tsv_text
from kgc.linkpred.evaluation.options import EvalOptions

if TYPE_CHECKING:
    from kgc.linkpred.answer.entities import EntityIndex
    from kgc.linkpred.answer.predictor import Predictor
    from kgc.linkpred.evaluation.ranking import Evaluation
    from kgc.training.run import RunDir


def evaluate_run(predictor: "Predictor", entities: "EntityIndex", split: str | None = None, *,
                 batch_size: int | None = None, progress: bool = False,
                 options: "EvalOptions | Mapping[str, Any] | None" = None,
                 echo=print) -> "tuple[Evaluation, str, str | None]":
    """(evaluation, split, kind of its results file: None, "text" or "inductive") of ``split`` (test or dev):
    filtered ranks, both directions, in PyKEEN's layout (``.results`` with a ``"kgc"`` block, ``.ranks``,
    ``.seconds``). A run with a structural model ranks by the fused score (α chosen on dev). ``entities_from`` (a
    KG-BERT folder, e.g. from ``kgc data inductive-split``) ranks its ``split`` triples over its own entities,
    unseen in training — ``candidates`` ``"split"`` (the entities of the split's triples, SimKGC's protocol) or
    ``"all"``; ``use_index`` ranks within the top ``top_k`` (100) of the run's index, re-scored exactly;
    ``text_only``: a run with a structural model ranked by its text model alone, as a run without one is (its
    ``eval.rerank`` applies). ``inductive``: the run's dataset's own inference graph (a GraIL split's
    ``inference/``: :mod:`kgc.data.grail`), every one of its entities a candidate; ``negatives``: GraIL's protocol
    instead of the full ranking — each triple against ``negatives`` - 1 sampled corruptions per side, drawn with
    ``seed`` (:mod:`kgc.linkpred.evaluation.sampled`), into ``results.inductive-<negatives>…``. Bad combinations of
    options are one KGCError, before the model is loaded (:class:`EvalOptions`' rules, and here those that read the
    run)."""
    from kgc.linkpred.evaluation.scoring import evaluate

    o = EvalOptions.of(options)  # keywords or the model: checked once, here
    rerank, entities_from, candidates, use_index, top_k = o.rerank, o.entities_from, o.candidates, o.use_index, o.top_k
    text_only, negatives, seed = o.text_only, o.negatives, o.seed
    split = split or "test"
    if split not in ("test", "dev"):
        raise KGCError(f"split {split!r}: choose test or dev")
    if o.inductive:
        entities_from, candidates = inference_folder(predictor), candidates or "all"
    recipe = predictor.recipe
    rr = recipe.eval.rerank.model_dump()
    if rerank is not None:
        rr["enabled"] = rerank
    bs = batch_size or recipe.eval.batch_size
    budget = recipe.eval.max_score_bytes
    if entities_from is not None:
        from kgc.linkpred.evaluation.inductive import inductive_graph

        graph, info = inductive_graph(entities_from, predictor.graph(), split=split, candidates=candidates or "split",
                                      long_text=recipe.data.long_text, warn=echo)
        if negatives is not None:
            from kgc.linkpred.evaluation.sampled import sampled_evaluate

            ev = sampled_evaluate(predictor.model_for(graph), graph, split, negatives=negatives, seed=seed,
                                  batch_size=bs, progress=progress)
        else:
            ev = evaluate(predictor.model_for(graph), graph, split, batch_size=bs, rerank=None, progress=progress,
                          max_score_bytes=budget)  # never re-ranked, whatever eval.rerank says
        ev.results["kgc"]["inductive"] = info
        return ev, split, evaluation_kind(ev.results["kgc"])
    graph = predictor.graph()
    if not len(graph.splits[split]):
        raise KGCError(f"{graph.source}: the {split} split has no triples to rank (train with testing= / "
                       "validation= factories, or a dataset with that split)")
    path = predictor.dir.path
    fused = predictor.fused
    wanted = getattr(recipe, "structure", None)  # the recipe fuses a structural model
    if wanted is not None and not fused and not text_only:  # never a text-only figure in its place, unsaid
        raise KGCError(f"{predictor.dir.structure}: missing or incomplete, though {path}'s recipe fuses a structural "
                       f"model ({wanted.model}); nothing was evaluated. Train it again with `kgc structure {path}`, "
                       f"or evaluate the text model alone with `kgc evaluate {path} --text-only`.")
    if text_only and not fused and wanted is None:
        raise KGCError(f"{path} has no structural model: its evaluation is the text model's already; "
                       "drop text_only (--text-only)")
    if fused and not text_only:
        if use_index or rerank:
            raise KGCError(f"{path} has a structural model: its evaluation fuses text and structure over "
                           "every entity; drop --use-index / --rerank, or rank by the text model alone with "
                           "--text-only")
        return evaluate_fused(predictor, entities, split, bs, progress), split, None
    search = None
    if use_index:
        search = (entities.open(deep=True), 100 if top_k is None else top_k)  # missing: the message says build it
    ev = evaluate(predictor.model(), graph, split, batch_size=bs, rerank=rr, progress=progress,
                  entity_table=entities.embeddings(), max_score_bytes=budget, search=search)
    if use_index:
        ev.results["kgc"]["search"]["index"] = entities.params()
    if text_only:
        ev.results["kgc"]["text_only"] = True  # the run's structural model left out
    return ev, split, "text" if text_only else None


def evaluation_kind(k: dict) -> str | None:
    """The kind of an evaluation's files (``results[.kind][.split].json``) from its ``kgc`` block: ``inductive``,
    ``inductive-50`` (GraIL's sampled protocol, 50 candidates), ``text`` (the text model alone) or None."""
    if k.get("inductive"):
        protocol = k.get("protocol")
        return f"inductive-{protocol['candidates']}" if protocol else "inductive"
    return "text" if k.get("text_only") else None


def inference_folder(predictor: "Predictor") -> Path:
    """The inference graph of the run's dataset (``FOLDER/inference``, as a GraIL split has), or one KGCError."""
    from kgc.data.catalog import find_dataset

    data = predictor.recipe.data
    folder, _ = find_dataset(data.dataset, data.path)
    inference = Path(folder) / "inference"
    if not (inference / "test.tsv").is_file():
        raise KGCError(f"{predictor.dir.path}: its dataset ({data.dataset}, {folder}) has no inference graph "
                       f"({inference}/test.tsv). --inductive is for a dataset that brings one (GraIL's splits: "
                       "data.dataset: grail-wn18rr-v1 … grail-fb237-v4); for another folder of unseen entities give "
                       "--entities-from FOLDER.")
    return inference


def evaluate_fused(predictor: "Predictor", entities: "EntityIndex", split: str, batch_size: int,
                   progress: bool) -> "Evaluation":
    """α on dev (the predictor's, chosen once), then ``split`` fused (the main result) with ``kgc.components``
    text-only (α = 1) and structure-only (α = 0), all ranked in one pass per split through the ranking protocol."""
    import numpy as np

    from kgc.linkpred.evaluation.scoring import entity_states, evaluate
    from kgc.linkpred.structure.pykeen import FORMULA, alpha_of, fused_scorer

    start = time.perf_counter()
    model, graph = predictor.model(), predictor.graph()
    structure = predictor.structure()
    budget = predictor.recipe.eval.max_score_bytes
    engine, table, *_ = entity_states(model, batch_size=batch_size, progress=progress,  # once, for dev and test;
                                      entity_table=entities.embeddings(),  # each split's evaluation
                                      heads=np.empty(0, dtype=np.int64))  # adds its heads' states
    choice = predictor.alpha_choice(batch_size=batch_size, progress=progress, engine=engine, entity_table=table)
    alpha = alpha_of(choice)
    ev = evaluate(model, graph, split, batch_size=batch_size, entity_table=table, progress=progress, engine=engine,
                  scorer=fused_scorer(structure, list(dict.fromkeys([alpha, 1.0, 0.0]))), max_score_bytes=budget)
    ev.seconds = time.perf_counter() - start
    ev.results["kgc"]["evaluation_seconds"] = round(ev.seconds, 3)
    ev.results["kgc"]["structure"] = {"model": structure.name, "alpha": choice["alpha"], "grid": choice["grid"],
                                      "formula": FORMULA, "params": structure.meta["params"],
                                      **{k: choice[k] for k in ("per_relation", "per_relation_dev_mrr")
                                         if k in choice}}
    ev.results["kgc"]["components"] = {"text": ev.variants[1.0], "structure": ev.variants[0.0]}
    return ev


def write_evaluation(run: "RunDir", ev: "Evaluation", split: str, kind: str | None = None) -> None:
    """``results[.kind][.split].json`` and ``ranks[…].tsv`` as one transaction: they always belong to one
    evaluation."""
    results, ranks = run.results(split, kind), run.table("ranks", split, kind)
    with Transaction(results.parent) as tx:
        tx.write_json(results.name, ev.results)
        tx.write_text(ranks.name, tsv_text(ev.ranks))
        tx.commit()
