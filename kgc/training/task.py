"""What a task is to the rest of kgc, in two parts, so nothing outside a task's own package branches on its name:

* its **description**, a :class:`Task` subclass registered in ``kgc.registry.TASKS`` (or by a package's
  ``kgc.tasks`` entry point) and never instantiated: its recipe (``recipe_class``), run class (``run_class()``:
  what ``kgc.load`` returns, with the task's verbs), dataset checks (``check_dataset``, ``check_data``), result
  formatting (``report``, ``headline``), ``kgc compare``'s row, its datasets, ``POST /explain``'s body, ``kgc
  export``, its benchmarks, the API functions only it answers (``api_hooks``), the names ``import kgc`` offers,
  its tuning space and the memory estimate's figures (``workload``);
* its **training** (``Task.training``), a :class:`Training` subclass made per recipe: the eight methods the training
  loop calls (model, objective, batches, their preparation and loss, validation, before a step, after training).

Adding a task is one package that defines both and registers the description in its ``__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from kgc.errors import KGCError
from kgc.recipe import Recipe
from kgc.harness import KINDS, BenchCommand, Param  # noqa: F401  (a task's benchmarks: kgc.harness)
from kgc.registry import TASKS, Lazy

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from kgc.training.objective import Objective
    from kgc.training.run import Run

Echo = Callable[[str], None]


class Task(ABC):
    """One task as the tools see it — a description, never instantiated: its facts (class variables) and hooks
    (class methods) for the CLI, the API, bench, compare, export, serving and the memory estimate. What the training
    loop runs is its :class:`Training` (``training``). ``metric`` (higher is better) picks ``best.pt``."""

    name: ClassVar[str]
    title: ClassVar[str]  # "link prediction", "C-STS"
    unit: ClassVar[str]  # what a training example is: "triples", "pairs"
    metric: ClassVar[str]  # the validation metric that selects best.pt, e.g. "dev_mrr"
    # every figure validate() reports that a study may optimise (kgc tune --metric), with its direction
    dev_metrics: ClassVar[dict[str, str]] = {}
    recipe_class: ClassVar[type[Recipe]]  # its recipe: the common sections and its own (kgc.recipe.recipe_type)
    distributed: ClassVar[bool] = True  # whether a global batch may be split over torchrun processes
    splits: ClassVar[tuple[str, ...]] = ("test",)  # what `kgc evaluate --split` takes; the first is the default
    compare_columns: ClassVar[list[str]] = []
    compare_metric: ClassVar[str] = ""  # the column `kgc compare` prints per recipe
    dataset_files: ClassVar[tuple[str, ...]] = ()  # any one of them marks a folder as a dataset of this task
    export_description: ClassVar[str] = ""  # what `kgc export` writes for this task's runs ("": nothing)

    training: ClassVar[type["Training"]]  # what the training loop runs: the task's Training, made per recipe

    # ------------------------------------------------------------ registration-level hooks (the class is never made)

    @classmethod
    @abstractmethod
    def run_class(cls) -> "type[Run]":
        """The class ``kgc.load`` returns for this task's runs."""

    @classmethod
    def check_dataset(cls, folder: Path) -> None:
        """Read a fetched dataset folder through (a bad file raises KGCError) before it is published."""

    @classmethod
    def check_data(cls, recipe: Recipe, dataset: str | Path | None = None, *, strict: bool = False) -> Any:
        """``kgc data check``: read ``dataset`` (a catalog name or a folder; None: the recipe's data) as training
        would, with the recipe's data settings, and return a report with ``folder``, ``errors`` (list of str) and
        ``lines()`` (``(level, line)`` rows: level "", "error", "warning" or "note"); ``strict``: findings the task
        counts as leakage are errors too. An unreadable file raises KGCError (file, line, fix)."""
        raise KGCError(f"kgc data check has no check for task {cls.name}")

    @classmethod
    def check_triples_welcome(cls) -> None:
        """``kgc.train(data=…)`` hands PyKEEN triples to the task; tasks that read none say so here."""
        raise KGCError(f"data= takes PyKEEN triples, for link prediction; this recipe has task {cls.name}")

    @classmethod
    def with_triples(cls, recipe: Recipe, folder: Path, data: Any, **parts: Any) -> Recipe:
        """Write PyKEEN ``data`` (and ``validation`` / ``testing`` / ``texts`` / ``relation_texts`` in ``parts``)
        into ``folder`` and return the recipe pointed at it."""
        raise NotImplementedError

    @classmethod
    def report(cls, run: "Run", evaluation: Any, split: str) -> list[str]:
        """The lines ``kgc evaluate`` prints for an evaluation of ``split``."""
        return [str(evaluation.results)]

    @classmethod
    def compare_split(cls, recipe: Recipe, state: dict, echo: Echo) -> tuple[str, list[dict]]:
        """(the split ``kgc compare`` evaluates ``recipe`` on, rows to add before its own: baselines).
        ``state`` persists over the recipes of one compare."""
        return "test", []

    @classmethod
    def compare_row(cls, run: "Run", results: dict, summary: dict, seconds: float) -> dict:
        """The recipe's row of ``kgc compare``'s table (keys: ``compare_columns``)."""
        raise NotImplementedError

    # ------------------------------------------------------------ hooks for the tools (compare, bench, export, serve)

    @classmethod
    def datasets(cls) -> list:
        """Catalog entries (:class:`kgc.data.catalog.CatalogEntry`) of the datasets only this task reads, beside the
        data layer's own (KG-BERT and PyKEEN folders); their ``probe`` is this task's ``dataset_files``."""
        return []

    # kgc tune's space for a recipe whose tune.space is empty (the conditioner's own is added to it)
    tune_space: ClassVar[dict[str, dict]] = {"train.lr": {"low": 1e-5, "high": 1e-3, "log": True}}

    @classmethod
    def tune_space_for(cls, recipe: Any) -> dict[str, dict]:
        """``tune_space`` for this recipe: a task drops the keys the recipe does not use (by default: none)."""
        return dict(cls.tune_space)

    @classmethod
    def headline(cls, results: dict) -> dict:
        """The figures of a ``results.json`` a reader compares (``GET /info``'s ``test``): by default its numbers."""
        return {k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    @classmethod
    def explain_request(cls) -> Any:
        """The pydantic model of ``POST /explain``'s body: its fields are the keywords of the run's
        ``explain_inputs`` (None: the server offers no ``/explain``)."""
        return None

    @classmethod
    def evaluation_options(cls) -> Any:
        """The pydantic model of the keywords its run's ``evaluation(split, **options)`` takes beyond the split,
        ``batch_size`` and ``progress`` (None: none): ``kgc evaluate``'s flags are its fields, every task's together.
        Import nothing heavy here: ``kgc --help`` reads it."""
        return None

    @classmethod
    def export(cls, run: "Run", out: Path, *, format: str | None = None) -> dict:
        """``kgc export``: write ``run`` into the folder ``out`` (atomically; a ``kgc.json`` in it says what it holds)
        and return that ``kgc.json``. Only tasks with an ``export_description`` export."""
        raise KGCError(f"{run.path} is a {cls.name} run; kgc export has nothing to write for it")

    @classmethod
    def bench_commands(cls) -> dict[str, Any]:
        """The task's benchmarks, ``kgc bench NAME`` → its :class:`BenchCommand` (the function that returns
        the figures, its parameters, how its result is shown): the command line and ``kgc.api.bench`` are made from
        them (``kgc bench serve`` is every task's). Import nothing heavy here: ``kgc --help`` reads them."""
        return {}

    @classmethod
    def bench_write_request(cls, run: "Run", n: int, seed: int = 0) -> "tuple[str, Any, str] | None":
        """(path, JSON body, what it does) of one request that writes ``n`` items into the served run, for ``kgc
        bench serve --add N`` (queries measured during a write); None: the task's server takes no writes."""
        return None

    @classmethod
    def bench_tables(cls) -> dict[str, Callable[..., str]]:
        """Markdown renderings of its benchmarks' results, by kind (``kgc.api.table``)."""
        return {}

    @classmethod
    def api_hooks(cls) -> "ApiHooks":
        """The functions of ``kgc.api`` that only this task answers (:class:`ApiHooks`): the API asks the tasks for
        them instead of importing one."""
        return ApiHooks()

    @classmethod
    def public_names(cls) -> dict[str, str]:
        """Names ``import kgc`` and ``kgc.api`` offer for this task (``kgc.<name>``), each a
        ``lazy("module:attribute")`` (:mod:`kgc.lazy`: the import graph sees it), imported on first use only
        (:func:`public_name`): its run class …"""
        return {}

    # ------------------------------------------------------------ the memory estimate's figures

    @classmethod
    def workload(cls, recipe: Recipe, counts: "Counts | None", *, batch: int, global_batch: int) -> "StepShape":
        """What one training step of ``recipe`` runs, for :mod:`kgc.training.estimate`: the sequences its towers
        encode per example, the towers, the score columns and tables. ``counts``: the data as read (None: the
        recipe's batch alone); ``batch``: a process's rows of the ``global_batch``. Default: one trained tower, one
        sequence an example."""
        return StepShape()


class Training(ABC):
    """What the training loop (:mod:`kgc.training.loop`) asks of a task: eight methods, and four attributes each
    implementation sets in its ``__init__`` (which reads the data):

    * ``steps_per_epoch`` (int), ``can_validate`` (bool: there is validation data; without it nothing is
      validated and best.pt is the final weights), ``counts`` (:class:`Counts`, what the memory estimate reads),
      ``summary`` (``(level, line)`` rows about the data, printed when training starts; :meth:`build_model` may
      add to them).

    The model :meth:`build_model` returns offers ``encoders``, ``conditioner`` (whose own parameters
    ``train.conditioner_lr`` applies to), ``attach_layer_cache(recipe)``, ``layer_cache`` and ``save_cache()``; the
    objective :meth:`make_loss` returns is a :class:`kgc.training.objective.Objective` (its own state, figures and
    after-step work). Everything a task offers the tools (its recipe, run class, reports, benchmarks) is on its
    :class:`Task` description, not here."""

    steps_per_epoch: int
    can_validate: bool = True
    counts: "Counts"
    summary: list[tuple[str, str]]

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.summary = []

    @abstractmethod
    def build_model(self, backbone_folder: Path, *, pretrained: bool = True) -> "tuple[nn.Module, Any]":
        """(model, tokenizer); ``pretrained=False`` builds the architecture only."""

    @abstractmethod
    def make_loss(self, device: "torch.device") -> "Objective":
        """The objective (the loop moves it to ``device``; task-side tensors the batches read go there here)."""

    @abstractmethod
    def epoch_batches(self, epoch: int) -> "list[np.ndarray]":
        """The epoch's batches (``steps_per_epoch`` of them, each ``len()`` its examples); a pure function of
        (seed, epoch)."""

    def prepare(self, model: "nn.Module", criterion: "nn.Module", batch: "np.ndarray") -> Any:
        """A batch of :meth:`epoch_batches` made ready on the host for :meth:`batch_loss` (token rows, padded and
        pinned inputs): called in the prefetch thread while the previous step runs (``train.prefetch``), so it must
        not read anything back from the device. Default: the batch as it is."""
        return batch

    @abstractmethod
    def batch_loss(self, model: "nn.Module", criterion: "nn.Module", batch: Any) -> "torch.Tensor":
        """The objective of one batch, as :meth:`epoch_batches` gives it or as :meth:`prepare` made it."""

    @abstractmethod
    def validate(self, model: "nn.Module") -> tuple[dict[str, float], str]:
        """(metrics including the task's ``metric`` and ``dev_seconds``, a one-line summary)."""

    def before_step(self, model: "nn.Module", criterion: "nn.Module", step: int) -> None:
        """Before optimiser step ``step`` + 1 (``step`` done so far; a resumed run calls it with the same counts)."""

    def after_training(self, run_dir: Path, *, progress: bool, echo: Echo) -> None:
        """Work that follows the text model's training (main process only), e.g. a structural model beside it."""


@dataclass(frozen=True)
class ApiHooks:
    """What a task answers for ``kgc.api`` (None: another task does, or none): the newest run under a folder (for
    ``kgc.load()`` without a path), a pairs file read and written (``kgc similarity --tsv``), a synthetic set made
    (``kgc data synth-csts``)."""
    latest_run: "Callable[[], Path] | None" = None
    read_pairs: "Callable[[str | Path], list[dict]] | None" = None
    write_pairs: "Callable[..., None] | None" = None
    synth: "Callable[..., None] | None" = None


@dataclass(frozen=True)
class Counts:
    """The training data as the memory estimate reads it: examples an epoch, the global batch the task forms
    (at most the examples), and a graph's entity and relation counts (0 where the task has none)."""
    examples: int
    batch: int
    entities: int = 0
    relations: int = 0

    @property
    def steps_per_epoch(self) -> int:
        return max(1, self.examples // max(1, self.batch))

    def at_batch(self, batch: int) -> "Counts":
        """The same data in batches of ``batch`` (what :func:`kgc.training.estimate.fitting_batch` tries)."""
        return replace(self, batch=min(batch, max(1, self.examples)))


@dataclass(frozen=True)
class StepShape:
    """A task's training step per example, as :meth:`Task.workload` gives it to the estimate: sequences through
    the trained towers (``trained``) and those a layer cache could serve (``cached``, counted by the estimate
    from them when the cache is on), towers held and trained, score columns per row, rows of an entity table and
    of a pre-batch queue, texts tokenised up front."""
    query_sequences: float = 1.0  # through the (first) trained tower, per example
    other_sequences: float = 0.0  # through a second tower (link prediction's tails and self-negatives)
    other_trains: bool = True  # whether that second tower trains
    towers: int = 1
    trainable_towers: int = 1
    score_columns: int = 0
    table_rows: int = 0
    queue_rows: int = 0
    texts: int = 0

    @property
    def trained(self) -> float:
        return self.query_sequences + (self.other_sequences if self.other_trains else 0.0)


def public_name(name: str) -> Any:
    """The object a task offers as ``name`` (:meth:`Task.public_names`), imported now; None when no task does. The
    tasks that loaded are asked (a task plugin that fails to import is said where the tasks are used, not here: the
    CLI's imports ask this, and `kgc --help` must answer)."""
    for task in TASKS.lenient().values():
        where = task.public_names().get(name)
        if where is not None:
            return Lazy(where).load()
    return None


def task_class(name: str) -> type[Task]:
    """The registered task ``name`` (an unknown name lists the registered ones)."""
    return TASKS.lookup(name)


def make_training(recipe: Recipe) -> Training:
    """The recipe's task, ready to train (reads its data)."""
    return task_class(recipe.task).training(recipe)


def open_run(path: str | Path, *, device: str = "auto", echo: Echo | None = print) -> "Run":
    """The run directory at ``path`` as its task's run class (``kgc.load``)."""
    from kgc.training.run import RunDir

    folder = RunDir(path)  # a missing or foreign folder fails here, with the fix
    return task_class(folder.recipe.task).run_class()(folder, device=device, echo=echo)
