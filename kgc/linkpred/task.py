"""The link-prediction task: training (every train triple in both directions, SimKGC's loss, dev MRR) and
its hooks for the tools (recipe keys, run class, evaluation report, compare row).

The loop itself (optimiser, schedule, checkpoints, resume, metrics, curves) is
:func:`kgc.training.loop.train`, shared with C-STS.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, List, Optional

from pydantic import BaseModel, ConfigDict, Field

from kgc.linkpred.recipe import LinkPredRecipe
from kgc.recipe import Recipe
from kgc.training.task import ApiHooks, Counts, StepShape, Task, Training

if TYPE_CHECKING:  # imported where used: registering the task (every recipe's validation) stays light
    import numpy as np
    import torch

    from kgc.linkpred.loss import SimKGCLoss


def make_loss(recipe: Recipe) -> "SimKGCLoss":
    from kgc.linkpred.loss import SimKGCLoss

    return SimKGCLoss(**recipe.loss.model_dump())  # every field a keyword: one without is a TypeError, not dropped


class StepBatch:
    """One training step's batch made ready on the host (:func:`prepare_batch`, in the prefetch thread): the
    (head, relation, tail) rows, their ids in pinned memory, the query tower's inputs (the conditioner's
    :meth:`~kgc.conditioning.base.Conditioner.prepare`) and the tail tower's (tails, then heads; None when the
    loss reads them from its entity table)."""

    __slots__ = ("rows", "ids", "query", "entities")

    def __init__(self, rows, ids, query, entities) -> None:
        self.rows, self.ids, self.query, self.entities = rows, ids, query, entities

    def __len__(self) -> int:
        return len(self.rows)


def prepare_batch(model, criterion: "SimKGCLoss", batch: "np.ndarray") -> StepBatch:
    """Everything of a step that the host builds: token rows from the text bank (neighbour names of the other end
    left out), the bi-encoder's pairs, distinct rows, length groups, pinned copies. Nothing here reads the device."""
    import numpy as np
    import torch

    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    ids = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in
           (("heads", heads), ("rels", rels), ("tails", tails))}
    if model.device.type == "cuda":  # page-locked: copied to the GPU without the host waiting
        ids = {k: v.pin_memory() for k, v in ids.items()}
    query = model.prepare_queries(heads, rels, excludes=tails)
    entities = None if criterion.table_tails else model.prepare_entities(np.concatenate([tails, heads]),
                                                                         np.concatenate([heads, tails]))
    return StepBatch(batch, ids, query, entities)


def batch_loss(model, criterion: "SimKGCLoss", batch: "np.ndarray | StepBatch", train_keys: "torch.Tensor"):
    """The SimKGC loss of one batch of (head, relation, tail) rows (or a :class:`StepBatch` built ahead): both
    towers, then the objective. Nothing in it reads a value back from the device."""
    from kgc.encoding.backbone import to_device
    from kgc.profiling import section
    from kgc.training.common import autocast

    if not isinstance(batch, StepBatch):
        batch = prepare_batch(model, criterion, batch)
    graph, device = model.bank.graph, model.device
    b = len(batch)
    with autocast(device, model.precision):  # the encoders may run in bf16 (train.amp's choice) ...
        with section("query tower forward"):
            query = model.conditioner.forward_prepared(batch.query)  # (B, d)
        if batch.entities is None:  # tails and heads are rows of the loss's entity table: no tail tower here
            tail_vec = head_vec = None
        else:
            with section("tail tower forward"):
                ents = model.encode_prepared_entities(batch.entities)
            tail_vec, head_vec = ents[:b].float(), ents[b:].float()  # (B, d) each
    # ... the logits do not: a 0.02 margin on cosines scaled by 1/0.05 needs fp32
    ids = to_device(batch.ids, device)  # pinned: not waited for
    with section("loss"):
        return criterion(query.float(), tail_vec, head_vec, heads=ids["heads"], rels=ids["rels"],
                         tails=ids["tails"], train_keys=train_keys, num_entities=graph.num_entities,
                         num_relations2=2 * graph.num_relations)


RESULT_KEYS = [("MRR", "inverse_harmonic_mean_rank"), ("H@1", "hits_at_1"), ("H@3", "hits_at_3"),
               ("H@10", "hits_at_10"), ("MR", "arithmetic_mean_rank")]


def _latest_run(root: str | Path = "runs") -> Path:
    from kgc.linkpred.answer.run import find_latest_run

    return find_latest_run(root)


HEADLINE = {"mrr": "inverse_harmonic_mean_rank", "hits@1": "hits_at_1", "hits@3": "hits_at_3", "hits@10": "hits_at_10"}


class ExplainRequest(BaseModel):
    """``POST /explain`` on a link-prediction run: the head's tokens under each relation (``kgc explain``)."""
    model_config = ConfigDict(extra="forbid")
    head: Optional[str] = Field(None, description="the head entity (id, name or text)")
    relations: List[str] = Field([], description="relations (default every relation)")
    inverse: bool = Field(False, description="the inverse direction of the relations")


def format_table(results: dict) -> str:
    """Realistic-rank metrics by side (tail, head, both), as ``kgc evaluate`` prints them."""
    lines = ["side   " + "".join(f"{name:>9}" for name, _ in RESULT_KEYS)]
    for side in ("tail", "head", "both"):
        vals = results[side]["realistic"]
        lines.append(f"{side:<7}" + "".join(f"{vals[k]:>9.4f}" if k != "arithmetic_mean_rank" else f"{vals[k]:>9.2f}"
                                            for _, k in RESULT_KEYS))
    return "\n".join(lines)


class _GraphMarkers:
    """A class attribute read at each access as the registered graph formats' markers
    (:func:`kgc.data.catalog.graph_markers`): a format registered later is known too, and the task's registration
    imports no reader."""

    def __get__(self, obj, owner=None) -> tuple[str, ...]:
        from kgc.data.catalog import graph_markers

        return graph_markers()


class LinkPredTask(Task):
    name = "linkpred"
    title = "link prediction"
    unit = "triples"
    metric = "dev_mrr"
    dev_metrics = {"dev_mrr": "maximize", "dev_hits_at_1": "maximize", "dev_hits_at_3": "maximize",
                   "dev_hits_at_10": "maximize", "dev_head_above_gold": "minimize"}
    recipe_class = LinkPredRecipe
    splits = ("test", "dev")
    compare_columns = ["recipe", "conditioner", "pooling", "MRR", "H@1", "H@3", "H@10", "head above gold", "dev MRR",
                       "trainable params", "total params", "train triples/s", "train seconds", "eval seconds",
                       "query seconds", "cache bytes"]
    compare_metric = "MRR"
    dataset_files = _GraphMarkers()  # any registered graph format's folder (kgc.data.formats reads them)
    export_description = "link-prediction towers (a run trained with task: linkpred)"
    training: ClassVar[type[Training]]  # LinkPredTraining, below

    @classmethod
    def run_class(cls):
        from kgc.linkpred.answer.run import LinkPredRun

        return LinkPredRun

    @classmethod
    def public_names(cls):
        from kgc.registry import lazy

        return {"LinkPredRun": lazy("kgc.linkpred.answer.run:LinkPredRun"),
                "Answers": lazy("kgc.linkpred.answer.topk:Answers"),
                "QueryOptions": lazy("kgc.linkpred.answer.query:QueryOptions")}

    @classmethod
    def evaluation_options(cls):
        from kgc.linkpred.evaluation.options import EvalOptions

        return EvalOptions

    @classmethod
    def api_hooks(cls):
        """``latest_run``: the newest link-prediction run under ./runs (``kgc.load()``, ``kgc predict`` without one)."""
        return ApiHooks(latest_run=_latest_run)

    @classmethod
    def workload(cls, recipe: Recipe, counts, *, batch: int, global_batch: int) -> StepShape:
        """The query tower runs once per triple (plus the batch's distinct relations for conditioners that encode
        them apart), the tail tower twice (tails, and heads for the self-negative) unless ``loss.table_tails``
        reads both from the entity table; the scores: the batch's tails (both ways with ``loss.symmetric``), the
        self-negative, the pre-batch queue and the table's columns (its sample, formed ``table_chunk`` at a time)."""
        from kgc.conditioning.base import conditioner_class

        cond = conditioner_class(recipe.model.conditioner)
        lo, shared = recipe.loss, recipe.model.shared_towers
        entities = counts.entities if counts is not None else 0
        relations = 2 * counts.relations if counts is not None else 0
        conds = min(1.0, relations / batch) if (cond.encodes_conditions and relations) else (
            1.0 if cond.encodes_conditions else 0.0)
        tail_runs = not lo.table_tails
        tail_trains = tail_runs or shared
        table_columns = min(entities, lo.table_sample or entities, lo.table_chunk) if lo.table_negatives else 0
        return StepShape(query_sequences=1.0 + conds, other_sequences=2.0 if tail_runs else 0.0,
                         other_trains=tail_trains, towers=1 if shared else 2,
                         trainable_towers=1 if shared else (2 if tail_trains else 1),
                         score_columns=(global_batch * (2 if lo.symmetric else 1) + 1 + lo.pre_batch * global_batch
                                        + table_columns),
                         table_rows=entities if lo.table_negatives else 0, queue_rows=lo.pre_batch * global_batch,
                         texts=2 * entities + relations)

    tune_space = {"train.lr": {"low": 1e-5, "high": 1e-3, "log": True},
                  "loss.temperature": {"low": 0.02, "high": 0.1, "log": True}, "loss.margin": {"low": 0.0, "high": 0.05}}

    @classmethod
    def headline(cls, results: dict) -> dict:
        """Both directions, realistic ranks: MRR and Hits@1/3/10."""
        both = results.get("both", {}).get("realistic") if isinstance(results.get("both"), dict) else None
        if not isinstance(both, dict):
            return super().headline(results)
        return {name: both[key] for name, key in HEADLINE.items() if key in both}

    @classmethod
    def explain_request(cls):
        return ExplainRequest

    @classmethod
    def export(cls, run, out: Path, *, format: str | None = None) -> dict:
        """The towers as sentence-transformers (default) or Hugging Face folders (:mod:`kgc.linkpred.export`)."""
        from kgc.linkpred.export import FORMATS, export_towers

        return export_towers(run, out, format=format or FORMATS[0])

    @classmethod
    def bench_commands(cls):
        from kgc.linkpred.bench.commands import commands

        return commands()

    @classmethod
    def bench_tables(cls):
        from kgc.linkpred.bench.commands import tables

        return tables()

    @classmethod
    def bench_write_request(cls, run, n: int, seed: int = 0):
        from kgc.linkpred.bench.workload import added_entities_request

        return added_entities_request(run, n, seed)

    @classmethod
    def check_data(cls, recipe: Recipe, dataset=None, *, strict: bool = False):
        """A :class:`kgc.data.check.DataReport`: counts, unseen entities and relations, shared or empty texts,
        texts longer than ``data.max_tokens`` (the backbone's tokenizer), the files found and the fallbacks taken."""
        from kgc.data.catalog import find_dataset
        from kgc.data.check import check_graph
        from kgc.data.formats import read_graph
        from kgc.data.texts import SpecialTokens, tokenize
        from kgc.encoding.backbone import load_tokenizer, resolve_backbone

        d = recipe.data
        folder, _ = find_dataset(str(dataset)) if dataset is not None else find_dataset(d.dataset, d.path)
        graph = read_graph(folder, long_text=d.long_text)
        tokenizer = load_tokenizer(resolve_backbone(recipe.model.backbone))
        extra = SpecialTokens.from_tokenizer(tokenizer).n_single
        lengths = tokenize(tokenizer, graph.full_texts, graph.num_entities).lengths + extra  # in chunks, as arrays
        report = check_graph(graph, allow_unseen_relations=d.allow_unseen_relations).with_lengths(lengths, d.max_tokens)
        report = cls._check_inference(Path(folder), graph, report)
        return report.strict() if strict else report

    @staticmethod
    def _check_inference(folder: Path, graph, report):
        """A dataset that brings an inference graph (``folder/inference``, a GraIL split's): its counts, every
        entity with a text, and the entities it shares with the training graph (the published WN18RR v3 shares 8:
        a warning naming them)."""
        from dataclasses import replace

        from kgc.data.check import Finding
        from kgc.data.formats import read_graph

        if not (folder / "inference" / "test.tsv").is_file():
            return report
        ind = read_graph(folder / "inference", long_text=False)
        shared = sorted(set(graph.entities) & set(ind.entities))
        t = {s: len(ind.splits[s]) for s in ("train", "dev", "test")}
        found = [Finding("note", f"inference graph {folder / 'inference'}: {ind.num_entities:,} entities, every one "
                                 f"with a text; {t['train']:,} known triples, {t['dev']:,} dev and {t['test']:,} test "
                                 "queries (kgc evaluate RUN --inductive)")]
        if shared:
            found.append(Finding("warning", f"{len(shared)} entities of the inference graph are in the training graph "
                                            f"too ({', '.join(shared[:5])}{', …' if len(shared) > 5 else ''}): as the "
                                            "split was published; an inductive figure counts them as unseen"))
        else:
            found.append(Finding("note", "the training and inference graphs share no entity"))
        return replace(report, findings=report.findings + found)

    @classmethod
    def check_triples_welcome(cls) -> None:
        pass

    @classmethod
    def with_triples(cls, recipe: Recipe, folder: Path, data, **parts) -> Recipe:
        from kgc.data.from_pykeen import write_kgbert

        counts = write_kgbert(folder, data, **parts)
        where = str(folder.resolve())
        recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"dataset": where, "path": where})})
        if not counts["dev"]:  # nothing to validate on: the final weights are the model
            recipe = recipe.model_copy(update={"eval": recipe.eval.model_copy(
                update={"validate_every_epoch": False, "validate_every_steps": None})})
        return recipe

    @classmethod
    def report(cls, run, evaluation, split: str) -> list[str]:
        r = evaluation.results
        k = r["kgc"]
        lines = []
        if k.get("inductive"):
            info = k["inductive"]
            protocol = k.get("protocol")
            how = (f"each against {protocol['negatives']} sampled negatives (GraIL's protocol, seed {protocol['seed']})"
                   if protocol else "filtered")
            lines.append(f"inductive {info['folder']} {split}: {len(evaluation.ranks)} queries over {info['entities']} "
                         f"entities ({info['candidates']}), {how}, realistic ranks ({evaluation.seconds:.1f}s)")
        else:
            search = k["search"]
            how = "" if search is None else (f", within the top {search['top_k']} of its {search['index']['type']} "
                                             f"index (gold not retrieved for {search['gold_missed']:.1%})")
            alone = ", the text model alone (its structural model left out)" if k.get("text_only") else ""
            lines.append(f"{k['dataset']} {split}: {len(evaluation.ranks)} queries, filtered, realistic ranks{how}"
                         f"{alone} ({evaluation.seconds:.1f}s)")
        fused = k.get("structure")
        if fused:  # a run with a structural model: both components, then the fused result
            for name, part in (("text only", "text"), (f"structure only ({fused['model']})", "structure")):
                lines += [f"{name}:", format_table(k["components"][part])]
            grid = ", ".join(f"{g['alpha']}: {g['dev_mrr']:.4f}" for g in fused["grid"])
            if fused.get("per_relation"):
                each = ", ".join(f"{p['relation']} {p['alpha']}" for p in fused["per_relation"])
                lines.append(f"fused, alpha per relation (dev MRR {fused['per_relation_dev_mrr']:.4f}; one alpha "
                             f"for all: {grid}; chosen: {each}):")
            else:
                lines.append(f"fused, alpha = {fused['alpha']} (dev MRR by alpha: {grid}):")
        from kgc.linkpred.answer.results import evaluation_kind

        kind = evaluation_kind(k)
        lines += [format_table(r), f"wrote {run.dir.results(split, kind)} and {run.dir.table('ranks', split, kind)}"]
        return lines

    @classmethod
    def compare_row(cls, run, results: dict, summary: dict, seconds: float) -> dict:
        both = results["both"]["realistic"]
        return {"MRR": both["inverse_harmonic_mean_rank"], "H@1": both["hits_at_1"], "H@3": both["hits_at_3"],
                "H@10": both["hits_at_10"], "head above gold": results["kgc"].get("head_above_gold"),
                "train triples/s": summary["triples_per_s"],
                "train seconds": round(seconds, 1), "dev MRR": summary.get("best_dev_mrr"),
                "query seconds": results["kgc"].get("query_encoding_seconds")}

class LinkPredTraining(Training):
    """Every train triple in both directions, SimKGC's loss (:mod:`kgc.linkpred.loss`), dev MRR."""

    def __init__(self, recipe: Recipe, *, graph=None) -> None:
        """``graph``: the recipe's data already read (``kgc bench train`` builds one task per mode over it)."""
        import torch

        from kgc.data.check import check_graph
        from kgc.data.formats import load_graph

        super().__init__(recipe)
        d = recipe.data
        self.graph = graph if graph is not None else load_graph(d.dataset, path=d.path, long_text=d.long_text)
        self.data_report = check_graph(self.graph, allow_unseen_relations=d.allow_unseen_relations)
        self.data_report.raise_errors()  # before a run directory exists
        self.examples = self.graph.both_directions("train")  # (2n, 3): every triple in both directions
        self.b = min(recipe.train.batch_size, len(self.examples))
        self.train_keys = torch.as_tensor(self.graph.train_keys)
        self.fixed_table: "torch.Tensor | None" = None  # the loss's table when the tail tower does not train
        self.steps_per_epoch = max(1, len(self.examples) // self.b)  # drop_last, as SimKGC
        self.can_validate = len(self.graph.splits["dev"]) > 0
        self.counts = Counts(examples=len(self.examples), batch=self.b, entities=self.graph.num_entities,
                             relations=self.graph.num_relations)

    def build_model(self, backbone_folder: Path, *, pretrained: bool = True):
        from kgc.linkpred.model import build_model

        model, tokenizer = build_model(self.recipe, self.graph, backbone_folder, pretrained=pretrained)
        if self.recipe.loss.table_tails and not self.recipe.model.shared_towers:
            for p in model.tail_encoder.parameters():  # nothing reaches it: its table is computed once
                p.requires_grad_(False)
        # kgc data check's report of the training data, with the texts' token lengths from the model's bank
        bank = model.bank
        lengths = bank.base.lengths + bank.special.n_single
        self.summary = self.data_report.with_lengths(lengths, self.recipe.data.max_tokens).lines()
        return model, tokenizer

    def make_loss(self, device: "torch.device") -> "SimKGCLoss":
        self.train_keys = self.train_keys.to(device)
        return make_loss(self.recipe)

    def epoch_batches(self, epoch: int) -> "list[np.ndarray]":
        import torch

        seed = self.recipe.train.seed + epoch
        order = torch.randperm(len(self.examples), generator=torch.Generator().manual_seed(seed)).numpy()
        return [self.examples[order[i * self.b: (i + 1) * self.b]] for i in range(self.steps_per_epoch)]

    def prepare(self, model, criterion, batch):
        return prepare_batch(model, criterion, batch)

    def batch_loss(self, model, criterion, batch):
        return batch_loss(model, criterion, batch, self.train_keys)

    def validate(self, model):
        from kgc.linkpred.evaluation.scoring import evaluate

        ev = evaluate(model, self.graph, "dev", batch_size=self.recipe.eval.batch_size,
                      max_triples=self.recipe.eval.dev_queries, seed=self.recipe.train.seed, progress=False,
                      # a tail tower that does not train: its table (through the tail map), not a re-encode
                      entity_table=None if self.fixed_table is None else model.map_table(self.fixed_table),
                      max_score_bytes=self.recipe.eval.max_score_bytes)
        mrr, h10 = ev.metric(), ev.metric(key="hits_at_10")
        return ({"dev_mrr": mrr, "dev_hits_at_1": ev.metric(key="hits_at_1"), "dev_hits_at_3": ev.metric(key="hits_at_3"),
                 "dev_hits_at_10": h10, "dev_head_above_gold": ev.results["kgc"]["head_above_gold"],
                 "dev_seconds": round(ev.seconds, 2)},
                f"dev MRR {mrr:.4f}  H@10 {h10:.4f}")

    def before_step(self, model, criterion, step: int) -> None:
        """``loss.table_negatives`` N: every N steps (from step 0) every entity's tail-tower embedding, in eval mode
        and without gradient (evaluation-time texts), becomes the loss's table of negatives (a tail tower that does
        not train, ``loss.table_tails`` without shared towers, gives the same table every time: it is computed once,
        and a resumed run reads it from the checkpoint)."""
        every = self.recipe.loss.table_negatives
        frozen = not any(p.requires_grad for p in model.tail_encoder.parameters())
        criterion.set_table_map(model.tail_map)  # the loss maps its table (the tail tower's outputs) with gradients
        if every and step % every == 0 and not (frozen and criterion.table is not None):  # a frozen tower: once
            was = model.training
            model.eval()
            criterion.set_table(model.entity_table(self.recipe.eval.batch_size, mapped=False)
                                .to(self.train_keys.device))
            model.train(was)
        self.fixed_table = criterion.table if frozen else None  # the same tensor, no copy: read by validate

    def after_training(self, run_dir: Path, *, progress: bool, echo) -> None:
        if self.recipe.structure is None:
            return
        from kgc.linkpred.structure.kinds import train_structure
        from kgc.training.run import RunDir

        train_structure(self.recipe.structure, self.graph, RunDir(run_dir).structure, seed=self.recipe.train.seed,
                        device=self.recipe.train.device, progress=progress, echo=echo)


LinkPredTask.training = LinkPredTraining
