"""Link prediction's ``kgc bench`` commands as data (:class:`kgc.harness.BenchCommand`): what each measures, its
parameters and how its result is shown. ``kgc bench`` and ``kgc.api.bench`` are generated from them; the measuring
functions live in the package's other modules (:mod:`~kgc.linkpred.bench.speed`, ``steps``, ``retrieval``,
``structure``, ``precision``, ``grail``, ``scale``) and are imported only when a benchmark runs (this module imports neither torch nor numpy: ``kgc --help`` stays light)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from kgc.errors import KGCError
from kgc.registry import lazy
from kgc.harness import SIGNATURE, BenchCommand, Param

SPEED = "kgc.linkpred.bench.speed"
STEPS = "kgc.linkpred.bench.steps"
RETRIEVAL = "kgc.linkpred.bench.retrieval"
STRUCTURE = "kgc.linkpred.bench.structure"
SETS = Param("overrides", "repeat", [], ("--set",), "a recipe key, e.g. --set train.lr=3e-5 (repeatable)")
PROGRESS = Param("progress", "flag", True, ("--progress/--no-progress",), "progress bars")


def _recipe(example: str) -> Param:
    return Param("recipe_path", "path", help=f"e.g. {example}", required=True)


COMMANDS = (
    BenchCommand(
        "inference", lazy(f"{SPEED}:bench_inference"),
        "Answer every test query (both directions) per conditioner, entity embeddings cached.",
        (Param("dataset", "str", SIGNATURE, ("--dataset",)),
         Param("conditioners", "repeat", [], ("--conditioner",), "repeatable (default: every registered one); "
               "options after a colon, e.g. router:cross_attend=top,router_layers=2"),
         Param("limit", "int", SIGNATURE, ("--limit",), "only the first N test triples"), SETS, PROGRESS),
        show=lazy(f"{__name__}:show_inference")),
    BenchCommand(
        "train", lazy(f"{SPEED}:bench_train"),
        "Training triples/s: full fine-tuning vs the top n layers over the layer cache.",
        (_recipe("recipes/wn18rr_csr.yaml"),
         Param("trainable_layers", "int", SIGNATURE, ("--trainable-layers",)),
         Param("steps", "int", SIGNATURE, ("--steps",)), Param("batch_size", "int", SIGNATURE, ("--batch-size",)), SETS,
         Param("full", "flag", SIGNATURE, ("--full/--no-full",), "--no-full: only the top-n row (a recipe's own pace), "
                                                             "no speed-up"))),
    BenchCommand(
        "precision", lazy("kgc.linkpred.bench.precision:bench_precision"),
        "fp32 and bf16 side by side, alternating: the matrix rate at the model's shapes (the limit), training "
        "triples/s and the share of the limit a step reaches, entities and queries encoded per second, and with "
        "--mrr-steps the test MRR after equal steps; the CPU's model and flags.",
        (_recipe("recipes/umls_biencoder.yaml"), Param("steps", "int", SIGNATURE, ("--steps",), "steps per block", min=1),
         Param("rounds", "int", SIGNATURE, ("--rounds",), "blocks each way, alternating", min=1),
         Param("entities", "int", SIGNATURE, ("--entities",), "entities encoded each way", min=1),
         Param("queries", "int", SIGNATURE, ("--queries",), "test queries answered each way", min=1),
         Param("mrr_steps", "int", SIGNATURE, ("--mrr-steps",), "train the recipe this many steps in fp32 and in bf16 and "
                                                        "compare their test MRR (0: not)", min=0),
         Param("profile", "flag", SIGNATURE, ("--profile/--no-profile",), "the top operators of a step each way "
                                                                      "(torch.profiler)"),
         Param("emulated", "flag", SIGNATURE, ("--emulated/--no-emulated",), "time bf16 on a CPU without bf16 "
               "hardware too (emulated there: many times slower; by default only its matrix rate)"), SETS)),
    BenchCommand(
        "grail", lazy("kgc.linkpred.bench.grail:bench_grail"),
        "GraIL's inductive splits: each trained on its training graph, its inference graph ranked both ways (every "
        "entity; 50 sampled candidates), beside PageRank, rules mined on the inference graph and text + rules; "
        "seconds and query cost. Writes RUNS/inductive.json and RUNS/inductive.md.",
        (_recipe("recipes/grail_wn18rr.yaml"),
         Param("splits", "strs", SIGNATURE, ("--splits",), "comma-separated (default: the four of the recipe's graph; "
                                                      "make bench-grail runs all eight)"),
         Param("runs", "path", Path("runs/grail"), ("--runs",), "a folder for the runs (a finished one is reused) "
                                                                "and the table"),
         Param("negatives", "int", SIGNATURE, ("--negatives",), "candidates per side in GraIL's protocol", min=2),
         Param("seed", "int", SIGNATURE, ("--seed",), "the draws' seed", min=0), SETS, PROGRESS)),
    BenchCommand(
        "loss", lazy(f"{SPEED}:bench_loss"),
        "The objective alone: false-negative masks by binary search (training's) against torch.isin, s/step.",
        (_recipe("recipes/wn18rr_laptop.yaml"), Param("steps", "int", SIGNATURE, ("--steps",), min=1),
         Param("batch_size", "int", SIGNATURE, ("--batch-size",), "default: the recipe's"), SETS)),
    BenchCommand(
        "inputs", lazy(f"{STEPS}:bench_inputs"),
        "The host's share of a training step: a batch's inputs one entity at a time, as built before in the step, "
        "and prepared a step ahead; then steps with a tiny BERT, inputs in the step against prefetched.",
        (_recipe("recipes/wn18rr_biencoder.yaml"), Param("steps", "int", SIGNATURE, ("--steps",), min=1),
         Param("batch_size", "int", SIGNATURE, ("--batch-size",), "default: the recipe's"), SETS)),
    BenchCommand(
        "rules", lazy(f"{STRUCTURE}:bench_rules"),
        "Mined rules scoring a split's queries: per-relation tables (small graphs) against per-batch rows, s.",
        (_recipe("recipes/umls_biencoder.yaml (its data: and structure: sections, structure.model=rules)"),
         Param("split", "str", SIGNATURE, ("--split",), "test, dev or train: whose queries are scored"),
         Param("batch_size", "int", SIGNATURE, ("--batch-size",), min=1), SETS)),
    BenchCommand(
        "structure", lazy(f"{STRUCTURE}:bench_structure"),
        "PyKEEN alone on its own copy of the dataset (its pipeline, the recipe's structure: settings): test MRR and "
        "Hits@k beside kgc's structure-only and fused rows.",
        (Param("recipe_path", "path", help="a recipe with a structure: section, on a dataset PyKEEN ships (umls, "
                                           "kinships, nations)", required=True),
         Param("seeds", "ints", SIGNATURE, ("--seeds",), "comma-separated seeds; the table shows the mean", min=0),
         Param("run", "path", None, ("--run",), "a run of the recipe, evaluated: its text, structure and fused rows "
                                                "beside PyKEEN's"), SETS, PROGRESS),
        adapt=lazy(f"{__name__}:structure_arguments"), show=lazy(f"{__name__}:show_structure")),
    BenchCommand(
        "index", lazy(f"{RETRIEVAL}:bench_index"),
        "Index types on synthetic clustered unit vectors: build time, size, queries/s, recall@10 vs exact.",
        (Param("entities", "int", SIGNATURE, ("--entities",), min=1), Param("dim", "int", SIGNATURE, ("--dim",), min=1),
         Param("queries", "int", SIGNATURE, ("--queries",), min=1),
         Param("types", "strs", SIGNATURE, ("--types",), "comma-separated index types"),
         Param("nprobe", "ints", SIGNATURE, ("--nprobe",), "ivf, ivfpq: the values to sweep"),
         Param("ef_search", "ints", SIGNATURE, ("--ef-search",), "hnsw: the values to sweep"),
         Param("rescore", "ints", SIGNATURE, ("--rescore",), "ivfpq, sq: the exact re-scoring factors to sweep (1: the "
                                                          "compressed vectors' scores)"),
         Param("nlist", "int", None, ("--nlist",), "ivf, ivfpq (default 4·√entities)"),
         Param("hnsw_m", "int", None, ("--hnsw-m",)), Param("ef_construction", "int", None, ("--ef-construction",)),
         Param("pq_bytes", "int", None, ("--pq-bytes",)),
         Param("sq_codes", "str", None, ("--sq-codes",), "sq: fp16, bf16 or 8bit (default fp16)"),
         Param("train_size", "int", None, ("--train-size",)),
         Param("clusters", "int", SIGNATURE, ("--clusters",), "Gaussian clusters in the synthetic set", min=1),
         Param("seed", "int", SIGNATURE, ("--seed",)),
         Param("threads", "int", SIGNATURE, ("--threads",), "FAISS threads (default: every core)", min=1),
         Param("repeats", "int", SIGNATURE, ("--repeats",), "searches per setting; the fastest counts", min=1)),
        adapt=lazy(f"{__name__}:index_arguments"), show=lazy(f"{__name__}:show_index")),
    BenchCommand(
        "scale", lazy("kgc.linkpred.bench.scale:bench_scale"),
        "The whole path at each size: generate a graph, then check, tokenise, train a few steps, index, evaluate, "
        "serve (head by name) and add entities, each stage its own process: wall time, peak RSS, bytes per entity, "
        "growth.",
        (Param("recipe_file", "path", None, help="the same as --recipe (e.g. recipes/wikidata5m_biencoder.yaml)"),
         Param("entities", "ints", SIGNATURE, ("--entities",), "comma-separated sizes, e.g. "
                                                                   "50000,500000,5000000"),
         Param("work", "path", SIGNATURE, ("--work",), "folder for the graphs, runs and logs (default: a temporary one)"),
         Param("keep", "flag", SIGNATURE, ("--keep",), "keep each size's graph, run and logs (a later bench in the same "
                                                   "--work reuses the graphs)"),
         Param("queries", "int", SIGNATURE, ("--queries",), "test (and dev) triples of the generated graphs: evaluated in "
                                                       "both directions", min=1),
         Param("requests", "int", SIGNATURE, ("--requests",), "head-by-name requests to the server, every fourth misspelt "
                                                        "(did you mean)", min=1),
         Param("add", "int", SIGNATURE, ("--add",), "entities added at the end (kgc index --add)", min=1),
         Param("model", "str", "tiny", ("--model",), "tiny: a random 2-layer, 32-wide BERT made in the work folder; "
                                                     "else a model name or folder"),
         Param("steps", "int", SIGNATURE, ("--steps",), "training steps (the run folder's cost)", min=1),
         Param("stages", "strs", SIGNATURE, ("--stages",), "only these stages, comma-separated (default: all)"),
         Param("overrides", "repeat", [], ("--set",), "a key of the measured run's recipe, e.g. --set "
                                                       "data.neighbor_text=true"),
         Param("recipe", "path", SIGNATURE, ("--recipe",), "also say what each stage of this recipe would need at each "
                                                      "size, here and on a GPU"),
         Param("recipe_overrides", "repeat", [], ("--recipe-set",), "a key of --recipe, e.g. --recipe-set "
                                                                     "train.batch_size=256"),
         Param("stage_timeout", "float", SIGNATURE, ("--stage-timeout",), "seconds a stage may take before it is killed",
               min=1),
         Param("index_type", "str", SIGNATURE, ("--index-type",), "kgc index --type: flat (default), ivf, hnsw, ivfpq or sq"),
         Param("max_memory_gb", "float", SIGNATURE, ("--max-memory",), "GB of resident memory past which a stage is "
                                                                  "killed (and reported), before the OOM killer acts",
               min=0.1),
         Param("seed", "int", SIGNATURE, ("--seed",)), Param("plot", "path", SIGNATURE, ("--plot",), "a PNG of time and memory per "
                                                                                       "stage"),
         Param("out", "path", None, ("--json", "--out"), "write the figures as JSON")),
        adapt=lazy(f"{__name__}:scale_arguments"), show=lazy(f"{__name__}:show_scale")),
)


def commands() -> dict[str, BenchCommand]:
    """``kgc bench NAME`` → its description, for :meth:`kgc.linkpred.task.LinkPredTask.bench_commands`."""
    return {c.name: c for c in COMMANDS}


# ---------------------------------------------------------------- what the command line hands over, and shows


def show_inference(result: dict, values: dict, echo: Callable[[str], None]) -> None:
    for row in result["rows"]:
        ratio, reference = next(((v, k.removeprefix("speedup_vs_")) for k, v in row.items()
                                 if k.startswith("speedup_vs_")), (None, ""))
        echo(f"{row['conditioner']:<24} {row['queries_per_s']:>10.1f} queries/s" +
             (f"   {ratio:>7.1f}x {reference}" if ratio is not None else ""))


def structure_arguments(values: dict[str, Any]) -> tuple[list, dict]:
    values = dict(values)
    values.pop("run")  # shown beside the result (show_structure), not measured
    return [values.pop("recipe_path")], values


def show_structure(result: dict, values: dict, echo: Callable[[str], None]) -> None:
    from kgc.linkpred.bench.structure import structure_table
    from kgc.training.run import read_results

    echo(structure_table(result, None if values.get("run") is None else read_results(values["run"])))


BUILD = ("nlist", "hnsw_m", "ef_construction", "pq_bytes", "sq_codes", "train_size")


def index_arguments(values: dict[str, Any]) -> tuple[list, dict]:
    """The build options (``--nlist`` …) as the one ``build`` mapping :func:`bench_index` takes."""
    values = dict(values)
    values["build"] = {k: values.pop(k) for k in BUILD}
    return [], values


def show_index(result: dict, values: dict, echo: Callable[[str], None]) -> None:
    from kgc.linkpred.bench.retrieval import index_table

    echo(index_table(result))
    best = result["fastest_at_recall_0.95"]
    if best is not None:
        params = ", ".join(f"{k}={v}" for k, v in best["params"].items() if k != "type")
        echo(f"fastest at recall@{result['k']} >= 0.95: {best['type']} ({params}), {best['speedup_vs_flat']}× flat")
    small = result["smallest_at_recall_0.95"]
    if small is not None:
        params = ", ".join(f"{k}={v}" for k, v in small["params"].items() if k != "type")
        k = result["k"]
        echo(f"least RAM at recall@{k} >= 0.95: {small['type']} ({params}), {small['bytes_per_entity']:,.0f} bytes "
             f"per entity, recall {small[f'recall_at_{k}']}, {small['speedup_vs_flat']}× flat")


def scale_arguments(values: dict[str, Any]) -> tuple[list, dict]:
    """The recipe given as the argument or as ``--recipe`` (not two different ones)."""
    values = dict(values)
    given = values.pop("recipe_file")
    if given is not None and values["recipe"] is not None and given != values["recipe"]:
        raise KGCError(f"two recipes: {given} and --recipe {values['recipe']}; give one")
    values["recipe"] = values["recipe"] or given
    return [], values


def show_scale(result: dict, values: dict, echo: Callable[[str], None]) -> None:
    from kgc.linkpred.bench.scale import scale_table

    if any(r["status"] != "skipped" for s in result["sizes"] for r in s["stages"]):
        echo(scale_table(result))
    for n, names in {s["entities"]: s["failed"] for s in result["sizes"] if s["failed"]}.items():
        echo(f"warning: at {n:,} entities {', '.join(names)} did not complete (see the notes)")


def tables() -> dict:
    """Markdown of the results, by kind, for :meth:`kgc.linkpred.task.LinkPredTask.bench_tables`."""
    from kgc.linkpred.bench.retrieval import index_table
    from kgc.linkpred.bench.scale import scale_table
    from kgc.linkpred.bench.structure import structure_table

    return {"index": index_table, "structure": structure_table, "scale": scale_table}
