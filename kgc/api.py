"""The Python API: ``kgc.train`` / ``kgc.load`` / ``kgc.resume`` return the task's run (``kgc.LinkPredRun`` or
``kgc.CSTSRun``, both a :class:`kgc.Run`), which answers what the CLI answers; the tools (compare, bench,
export, explain) are functions here too, so the CLI calls nothing but this module.

    import kgc
    run = kgc.train("recipes/umls_biencoder.yaml", train__max_steps=10)
    run.evaluate()["both"]["realistic"]["inverse_harmonic_mean_rank"]
    run.predict("C0001175", "affects", top_k=5)          # a pandas DataFrame
    run = kgc.load("runs/umls_biencoder-…")              # any run directory, later

Recipe overrides are keyword arguments with ``__`` between section and key (``train__max_steps=10`` is
``--set train.max_steps=10``; Python names cannot hold dots), or the same keys dotted in ``overrides=``
(``{"train.max_steps": 10}`` or ``["train.max_steps=10"]``, the ``--set`` syntax). Unknown keys fail exactly as
``--set`` does. The model, graph, tokenizer and index are loaded on first use and kept on the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, Union

from kgc.errors import KGCError
from kgc.recipe import Recipe, resolve_recipe
from kgc.training.run import silent as _silent

if TYPE_CHECKING:
    from kgc.training.run import Run
    from kgc.training.task import ApiHooks

RecipeLike = Union[str, Path, Recipe, Mapping[str, Any]]
Echo = Callable[[str], None]
DEVICE = "auto"  # every entry point's default: the GPU when there is one


def train(recipe: RecipeLike, out: str | Path | None = None, *, progress: bool = True,
          overrides: Mapping[str, Any] | Sequence[str] | None = None, data: Any = None, validation: Any = None,
          testing: Any = None, texts: Mapping[str, str] | None = None,
          relation_texts: Mapping[str, str] | None = None, device: str = DEVICE, echo: Echo | None = print,
          **kwargs: Any) -> "Run":
    """Train a recipe (path, Recipe or dict) into ``out`` (default ``runs/<name>-<time>``) and return the run.

    ``data``: a PyKEEN ``TriplesFactory`` (with optional ``validation=`` / ``testing=`` factories) or dataset
    instance, for link prediction; it is written as a KG-BERT folder ``out/data`` and ``data.path`` points
    there. Texts are the labels (``_`` → space) unless ``texts`` / ``relation_texts`` map a label to its text.
    Without validation triples no validation runs (the final weights are the model); without test triples
    ``evaluate("test")`` has nothing to rank. ``device`` is where the returned run loads its model (training:
    ``train.device``). ``echo`` receives the progress lines; ``None`` silences them.
    """
    from kgc.training.loop import train as run_train

    rec = resolve_recipe(recipe, overrides, **kwargs)
    if data is None:
        if validation is not None or testing is not None or texts is not None or relation_texts is not None:
            raise KGCError("validation=, testing=, texts= and relation_texts= go with data= (PyKEEN triples)")
    else:
        rec, out = _with_pykeen_data(rec, out, data, validation=validation, testing=testing, texts=texts,
                                     relation_texts=relation_texts)
    echo = echo or _silent
    run_dir = run_train(rec, out=Path(out) if out is not None else None, progress=progress, echo=echo)
    return load(run_dir, device=device, echo=echo)


def _with_pykeen_data(rec: Recipe, out, data, **parts) -> tuple[Recipe, Path]:
    """Hand PyKEEN triples to the recipe's task (it writes them into the new run directory, under the run's lock, and
    points the recipe at them); a failure leaves nothing half-written."""
    import contextlib

    from kgc.training.run import RunDir
    from kgc.training.task import task_class

    task = task_class(rec.task)
    task.check_triples_welcome()
    run_dir = Path(out) if out is not None else RunDir.default_path(rec.name)
    existed = run_dir.exists()
    with contextlib.ExitStack() as hold:
        RunDir.create(run_dir, hold)  # as `kgc train` creates it (which checks it again, and holds it to the end)
        try:
            rec = task.with_triples(rec, RunDir.data_folder(run_dir), data, **parts)
        except BaseException:  # bad triples or labels: nothing half-written stays
            RunDir.discard(run_dir, existed=existed, made=("data",))
            raise
    return resolve_recipe(rec), run_dir  # validated again, as a whole


def resume(run_dir: str | Path, *, progress: bool = True, device: str = DEVICE, echo: Echo | None = print,
           check_memory: bool = True) -> "Run":
    """Continue an interrupted run from its last checkpoint (its saved recipe; ``kgc train --resume``).
    ``check_memory=False``: start even where the estimated memory of a step exceeds what is free."""
    from kgc.training.loop import train as run_train

    echo = echo or _silent
    return load(run_train(None, resume=Path(run_dir), progress=progress, echo=echo, check_memory=check_memory),
                device=device, echo=echo)


def load(run_dir: str | Path | None = None, *, device: str = DEVICE, echo: Echo | None = print) -> "Run":
    """The trained run in ``run_dir``, as its task's run class; ``None``: the link-prediction run under ``./runs``
    whose weights were written last (as ``kgc predict`` without a run directory), named via ``echo``."""
    from kgc.training.task import open_run

    echo = echo or _silent
    if run_dir is None:
        run_dir = _task_hook(lambda h: h.latest_run, "latest_run")()
        echo(f"using the newest run: {run_dir}")
    return open_run(run_dir, device=device, echo=echo)


# ---------------------------------------------------------------- the tools, for the CLI and for Python


def report(run: "Run", evaluation: Any, split: str) -> list[str]:
    """The lines ``kgc evaluate`` prints for ``evaluation`` (its task formats them)."""
    from kgc.training.task import task_class

    return task_class(run.task).report(run, evaluation, split)


def export(run: "str | Path | Run", out: str | Path, *, format: str = "sentence-transformers",
           force: bool = False) -> dict:
    """Write a link-prediction run's towers as a sentence-transformers (``SentenceTransformer(out)`` embeds
    entities) or Hugging Face (``format="hf"``) folder, with ``kgc.json`` saying how to compose queries."""
    from kgc.export import export_run

    return export_run(run if not isinstance(run, (str, Path)) else load(run, echo=None), out, format=format,
                      force=force)


def compare(recipes: Sequence[str | Path], overrides: Sequence[str] = (), out: str | Path = "runs/compare", *,
            progress: bool = False, echo: Echo | None = print) -> list[dict]:
    """Train (or reuse) and evaluate several recipes of one task under the same overrides; the table's rows."""
    from kgc.compare import compare as run_compare

    return run_compare([Path(r) for r in recipes], list(overrides), Path(out), echo=echo or _silent,
                       progress=progress)


def tune(recipe: str | Path, *, out: str | Path | None = None, trials: int | None = None,
         timeout_minutes: float | None = None, jobs: int = 1, storage: str | None = None,
         overrides: Sequence[str] = (), echo: Echo | None = print, worker: bool = False,
         study_name: str | None = None, metric: str | None = None, sampler: str | None = None) -> dict:
    """Run (or continue) ``kgc tune``: Optuna over the recipe's ``tune:`` space, each trial a run under
    ``out/trials``; returns the summary (best trial and its recipe file, counts by state and of draws that
    repeated a trial's values, plots written). ``study_name``: the study's name in its storage (default: the
    recipe's name and a hash of its space, budget, pruner, sampler, metric and overrides; a study drawn with
    another is refused). ``metric``: the dev figure to optimise (``"dev_hits_at_10"``; default ``tune.metric``,
    else the task's), in its direction; ``sampler``: ``"tpe"``, ``"random"``, ``"grid"`` or ``"cmaes"``."""
    from kgc.tune import tune as run_tune

    return run_tune(recipe, out=out, trials=trials, timeout_minutes=timeout_minutes, jobs=jobs, storage=storage,
                    overrides=list(overrides), echo=echo or _silent, worker=worker, study_name=study_name,
                    metric=metric, sampler=sampler)


def curves(runs: Sequence[str | Path], out: str | Path, *, echo: Echo | None = print) -> dict:
    """Plot the validation curves of several runs of one task in one PNG (by examples seen and by training minutes,
    validation excluded; runs still training included), each run's best validation starred. Returns ``{"png",
    "runs", "metric", "best", "last"}``: each run's best validation record (the highest ``metric``, the one best.pt
    holds) and its last one (None for a run not validated yet)."""
    from kgc.training.common import MetricsLog, best_record, plot_runs
    from kgc.training.run import RunDir
    from kgc.training.task import task_class

    dirs = [RunDir(r) for r in runs]
    tasks = {d.recipe.task for d in dirs}
    if len(tasks) > 1:
        raise KGCError(f"kgc curves compares runs of one task; these mix {', '.join(sorted(tasks))}")
    task = task_class(tasks.pop())
    names = [d.path.name for d in dirs]
    if len(set(names)) < len(names):  # same folder names under different parents: tell them apart
        names = [str(d.path) for d in dirs]
    records = {n: MetricsLog(d.metrics).read() for n, d in zip(names, dirs)}
    empty = plot_runs(records, Path(out), metric=task.metric, unit=task.unit)
    for name in empty:
        (echo or _silent)(f"{name}: no validation records yet (eval.validate_every_steps sets how often)")
    last = {n: next((r for r in reversed(rs) if task.metric in r), None) for n, rs in records.items()}
    best = {n: best_record(rs, task.metric) for n, rs in records.items()}
    return {"png": str(out), "runs": names, "metric": task.metric, "best": best, "last": last}


def explain(run: "str | Path | Run", *, head: str | None = None, relations: Sequence[str] = (),
            inverse: bool = False, sentence: str | None = None, conditions: Sequence[str] = (),
            out: str | Path | None = None):
    """What a condition selects (``kgc explain``): CSR's weight per token of a sentence (link prediction: the
    head's text, ``relations`` default every relation) under each condition, or Hyper-CL's W_c spectra.
    Returns (a kgc.explain.Explanation, the heatmap PNG written to ``out``, default RUN/explain.png)."""
    from kgc.explain import explain as explain_inputs, plot

    run = load(run, echo=None) if isinstance(run, (str, Path)) else run
    inputs = run.explain_inputs(head=head, relations=relations, inverse=inverse, sentence=sentence,
                                conditions=conditions)
    ex, title = explain_inputs(inputs)
    return ex, plot(ex, Path(out) if out is not None else run.path / "explain.png", title)


def render(explanation: Any) -> str:
    """An explanation as the text table ``kgc explain`` prints."""
    from kgc.explain import render_text

    return render_text(explanation)


def serve(run_dir: str | Path, **options: Any) -> int:
    """``kgc serve``: serve a run over HTTP until SIGINT/SIGTERM (:func:`kgc.serve.serve`)."""
    from kgc.serve import serve as run_server

    return run_server(run_dir, **options)


def command_options(command: str) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """The pydantic fields whose flags a command takes (``kgc.cli.common.ModelFlags``), by the keyword its values
    arrive in, each with help texts to use instead of the fields' own: ``serve`` — ``options`` (``kgc.serve.
    ServeOptions``) and ``limits`` (``Limits``); ``index`` — ``params``, every key an index type reads (plugins'
    too; a help naming the types that read it); ``evaluate`` — ``options``, the tasks' evaluation options
    (``Task.evaluation_options``). A plugin that fails to load is left out here, said where its family is used."""
    from kgc.registry import INDEX_TYPES, TASKS

    if command == "serve":
        from kgc.serve.limits import Limits, ServeOptions

        return {"options": (dict(ServeOptions.model_fields), {}), "limits": (dict(Limits.model_fields), {})}
    if command == "evaluate":
        fields: dict[str, Any] = {}
        for task in TASKS.lenient().values():
            fields.update({k: f for k, f in _fields(task.evaluation_options()).items() if k not in fields})
        return {"options": (fields, {})}
    if command != "index":
        raise KGCError(f"command_options: {command!r} takes no options from a model (serve, index, evaluate do)")
    fields, readers = {}, {}
    for name, kind in INDEX_TYPES.lenient().items():
        for key, field in _fields(kind.Options).items():
            if key != "type":  # --type is the command's own
                fields.setdefault(key, field)
                readers.setdefault(key, []).append(name)
    return {"params": (fields, {k: f"{', '.join(readers[k])}: {fields[k].description}" for k in fields})}


def _fields(model: Any) -> dict[str, Any]:
    return dict(model.model_fields) if model is not None else {}


def ask_server(url: str, path: str, body: Any, *, timeout: float = 60.0) -> Any:
    """POST ``body`` to a running ``kgc serve`` at ``url`` (``kgc predict --server``): its JSON answer, or one
    KGCError with the server's message (unknown names, bad input) or saying that nothing answers there."""
    import httpx

    try:
        r = httpx.post(url.rstrip("/") + path, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise KGCError(f"no kgc server answers at {url} ({type(exc).__name__}: {exc}). Start one with "
                       "`kgc serve RUN_DIR`, or drop --server to load the run here.") from None
    try:
        data = r.json()
    except ValueError:
        raise KGCError(f"{url}{path} answered {r.status_code} without JSON: is it a kgc server?") from None
    if r.status_code != 200:
        detail = data.get("detail") if isinstance(data, dict) else data
        raise KGCError(f"{url}: {detail if isinstance(detail, str) else json.dumps(detail)}")
    return data


def app(run: "str | Path | Run", **options: Any):
    """The FastAPI app ``kgc serve`` runs, for a run directory or a loaded run (e.g. to mount it in another app or
    test it with ``fastapi.testclient.TestClient``); ``options``: :func:`kgc.serve.create_app`'s."""
    from kgc.serve import create_app

    return create_app(load(run, echo=None) if isinstance(run, (str, Path)) else run, **options)


def bench(command: str, *args: Any, **options: Any) -> dict:
    """``kgc bench COMMAND``: run a benchmark and return its figures (the dict ``--out`` writes). ``args`` and
    ``options`` are its function's (``kgc.bench.commands()[command].target`` names it), e.g. ``bench("train",
    "recipes/umls_biencoder.yaml", steps=2, echo=None)``, ``bench("serve", "runs/x", clients=[1, 8])``, ``bench(
    "index", entities=100_000, dim=64)``. A path among ``args`` may be a string. Every task's benchmarks are here:
    ``kgc.bench.commands()`` lists them (inference, train, loss, inputs, rules, structure, index, scale, serve).
    ``kgc.api.bench_train(...)`` and the like still answer, as ``bench("train", ...)``."""
    from kgc.bench import run_bench

    if options.get("echo", print) is None:
        options["echo"] = _silent
    return run_bench(command, *(Path(a) if isinstance(a, str) else a for a in args), **options)


def bench_commands(*, lenient: bool = False) -> dict:
    """Every benchmark ``kgc bench`` runs, by name: its :class:`kgc.harness.BenchCommand` (what it measures,
    its parameters; ``kgc.cli.bench`` makes the commands from them). ``lenient``: those of the tasks that loaded (a
    task plugin that fails to import is said by the command that uses it, not by ``kgc --help``)."""
    from kgc.bench import commands

    return commands(lenient=lenient)


def table(kind: str, result: Any, *extra: Any) -> str:
    """Markdown of a tool's result: ``compare`` (rows, task), ``index`` (bench index), ``structure`` (bench
    structure, a run's results)."""
    from kgc.bench import tables
    from kgc.compare import markdown_table

    return {"compare": markdown_table, **tables()}[kind](result, *extra)


def results(run: "str | Path | Run", split: str = "test") -> dict:
    """A run's evaluation of ``split`` as written by ``kgc evaluate`` (results[.split].json)."""
    from kgc.training.run import read_results

    return read_results(run, split)


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as JSON (``--out`` of the benchmarks)."""
    from kgc.fileio import write_json as write

    write(path, obj)


# ---------------------------------------------------------------- datasets


def datasets() -> list[dict[str, str]]:
    """The catalog: name, where it was found, folder, description (``kgc data list``)."""
    from kgc.data.catalog import list_datasets

    return list_datasets()


def check_data(dataset: str | Path | None = None, recipe: RecipeLike | None = None,
               overrides: Mapping[str, Any] | Sequence[str] | None = None, *, strict: bool = False) -> Any:
    """``kgc data check``: read a dataset (a catalog name or a folder; default: the recipe's data) as training
    would, with the recipe's data settings (defaults without one), and return its task's report — ``folder``,
    ``errors``, ``lines()``: counts, errors, warnings and the fallbacks taken (link prediction:
    :class:`kgc.data.check.DataReport`; C-STS: :class:`kgc.csts.data.CSTSReport`). The task is the recipe's; with
    no recipe (and no ``task`` override) it is the one the dataset holds data for — a catalog name's, or a folder's
    by its files (``csts_train.csv``: C-STS). ``strict``: leakage is an error too (``--strict``). An unreadable
    file raises KGCError (file, line, fix), as ``kgc train`` would."""
    from kgc.data.catalog import dataset_task
    from kgc.recipe import override_keys
    from kgc.training.task import task_class

    tree: RecipeLike = recipe if recipe is not None else {}
    if recipe is None and dataset is not None and "task" not in override_keys(overrides):
        found = dataset_task(str(dataset))
        if found is not None:
            tree = {"task": found}
    rec = resolve_recipe(tree, overrides)
    return task_class(rec.task).check_data(rec, dataset, strict=strict)


def recipe_keys(task: str | None = None) -> list[dict[str, str]]:
    """Every recipe key with its type, default and description (``kgc recipes keys``); ``task``: only the keys that
    task reads."""
    from kgc.recipe import key_reference

    return key_reference(task)


def plugins() -> list[dict[str, str]]:
    """Every member of every pluggable family — tasks, conditioners, index types, structural models, trackers,
    datasets from other packages — with where it comes from: ``kgc`` (built in) or the package and version of the
    plugin that added it (``kgc plugins``, as ``pykeen ls``)."""
    from kgc.registry import CONDITIONERS, DATASETS, INDEX_TYPES, STRUCTURES, TASKS, TRACKERS

    return [{"family": registry.kind, "key": registry.key, "name": name, "source": registry.source(name),
             "entry_points": registry.group or ""}
            for registry in (TASKS, CONDITIONERS, INDEX_TYPES, STRUCTURES, TRACKERS, DATASETS) for name in registry]


def recipe_families(folder: str | Path | None = None) -> list[dict[str, Any]]:
    """The shipped recipes as families (``kgc recipes list``): each a root recipe's ``name``, ``path``, ``about``,
    and its ``variants`` (those that extend it, directly or through another: ``name``, ``path``, ``about``,
    ``extends``, ``depth``), roots by name. ``folder``: default ``$KGC_RECIPES`` or the recipes/ beside kgc."""
    from kgc.families import families

    return [family.to_dict() for family in families(folder)]


def copy_recipe(name: str | Path, dest: str | Path, *, force: bool = False, full: bool = False) -> Path:
    """Write the recipe ``name`` (``wn18rr_csr``, ``wn18rr_csr.yaml`` or a path) with its ``extends`` chain merged
    in (``full``: every key resolved, defaults included) to ``dest``, a file or a folder (``kgc recipes copy``); an
    existing file only with ``force``."""
    from kgc.recipe import full_tree
    from kgc.families import copy_recipe as _copy

    return _copy(name, dest, force=force, full=full_tree if full else None)


def recipe_text(name: str | Path, *, full: bool = False) -> str:
    """The text ``kgc recipes copy NAME -`` prints: the recipe with its ``extends`` chain merged in (``full``: every
    key resolved, defaults included)."""
    from kgc.recipe import full_tree
    from kgc.families import recipe_text as text

    return text(name, full=full_tree if full else None)[1]


def check_recipe(name: str | Path, overrides: Sequence[str] = (), *, data: bool = True) -> dict[str, Any]:
    """``kgc recipes check``: the recipe validated (a wrong one raises its KGCError), its resolved text, and a line
    each for the recipe, its dataset (``data``: read as training reads it) and a step's memory here (:mod:`kgc.training.check`)."""
    from kgc.training.check import check_recipe as check

    return check(name, list(overrides), data=data)


def fetch_dataset(name: str, dest: str | Path | None = None, **options: Any) -> Path:
    """Download a catalog dataset from its public home, checked (``kgc data fetch``)."""
    from kgc.data.catalog import fetch_dataset as fetch

    return fetch(name, None if dest is None else Path(dest), **options)


def inductive_split(source: str, out: str | Path, **options: Any) -> dict:
    """Hold entities out of a KG-BERT dataset for inductive evaluation (``kgc data inductive-split``)."""
    from kgc.data.inductive import inductive_split as split

    return split(source, out, **options)


def synth_routing(out: str | Path, **options: Any) -> dict[str, int]:
    """Write the synthetic graph where the relation decides which word of the head matters (``kgc data
    synth-routing``, :mod:`kgc.data.routing_synth`); returns the triples per split."""
    from kgc.data.routing_synth import routing_graph, write_routing_graph

    graph = routing_graph(**options)
    write_routing_graph(out, graph=graph)
    return {split: len(graph[split]) for split in ("train", "dev", "test")}


def synth_graph(out: str | Path, **options: Any) -> dict:
    """Write a synthetic graph of any size in the KG-BERT layout, power-law degrees, names from word lists (``kgc
    data synth-graph``, :func:`kgc.data.synth_graph.synth_graph`); returns the counts, seconds and bytes."""
    from kgc.data.synth_graph import synth_graph as write

    return write(out, **options)


def synth_csts(out: str | Path, **options: Any) -> None:
    """Write the synthetic conditional-similarity set in the official C-STS layout (``kgc data synth-csts``)."""
    _task_hook(lambda h: h.synth, "synth_csts")(out, **options)


def read_pairs(path: str | Path) -> list[dict]:
    """Sentence pairs with conditions from a .tsv or .csv (``kgc similarity --tsv``)."""
    return _task_hook(lambda h: h.read_pairs, "read_pairs")(path)


def write_pairs(path: str | Path | None, rows: list[dict], echo: Echo = print) -> None:
    """Scored pairs as TSV to ``path`` (atomically), or through ``echo`` when ``path`` is None."""
    _task_hook(lambda h: h.write_pairs, "write_pairs")(path, rows, echo=echo)


def __getattr__(name: str) -> Any:
    """A task's public names, imported on first use (:meth:`kgc.training.task.Task.public_names`): e.g.
    ``kgc.api.QueryOptions``, a link-prediction question's options (``run.predict``'s, ``kgc predict``'s, ``POST
    /predict``'s: defaults, help and checks stated once); and ``bench_NAME``, :func:`bench` with that command (the
    names before the benchmarks were generated: ``kgc.api.bench_train(...)`` is ``bench("train", ...)``)."""
    if name.startswith("bench_"):
        import functools

        from kgc.bench import commands

        if name.removeprefix("bench_") in commands():
            return functools.partial(bench, name.removeprefix("bench_"))
    if not name.startswith("_"):
        from kgc.training.task import public_name

        found = public_name(name)
        if found is not None:
            return found
    raise AttributeError(f"module 'kgc.api' has no attribute {name!r}")


def _task_hook(pick: "Callable[[ApiHooks], Callable[..., Any] | None]", name: str) -> Callable[..., Any]:
    """The function ``pick`` takes from the first task that answers it (:meth:`kgc.training.task.Task.api_hooks`);
    ``name``: the API function, for the message when none does."""
    from kgc.registry import TASKS

    for task in TASKS:
        found = pick(TASKS[task].api_hooks())
        if found is not None:
            return found
    raise KGCError(f"kgc.api.{name}: no registered task offers it (tasks: {', '.join(TASKS)})")


# ---------------------------------------------------------------- processes


def launched() -> bool:
    """True inside a ``torchrun`` group of more than one process."""
    from kgc.training import distributed

    return distributed.launched()


def launch(nproc: int, argv: list[str]) -> int:
    """Re-run a ``kgc`` command under ``torchrun --standalone`` with ``nproc`` processes."""
    from kgc.training import distributed

    return distributed.launch(nproc, argv)
