"""What a task is to the rest of kgc: one :class:`Task` subclass per task package, registered in
``kgc.registry.TASKS``, answering everything that differs between tasks — so nothing outside a task's own
package branches on its name.

A task registers (class attributes and hooks of its Task subclass):

* its **recipe** (``recipe_class``): a :class:`~kgc.recipe.Recipe` subclass with its own sections (its loss, its
  data extras), so a key only it reads exists only in its recipes;
* its **run class** (``run_class()``): what ``kgc.load`` returns for its run directories, with the task's verbs;
* its **dataset check** (``check_dataset``), run on a freshly fetched folder before it is published, and the
  report ``kgc data check`` prints (``check_data``);
* its **training hooks** — data, model, objective, batches, validation (the abstract methods below), and
  whether its batches can be split over processes (``distributed``);
* its **evaluation** (through the run class), **result formatting** (``report``, ``headline``) and **compare row**
  (``compare_columns``, ``compare_split``, ``compare_row``);
* what the tools and the API ask of it instead of naming it: its datasets (``dataset_files``, ``datasets``), the
  body of ``POST /explain`` (``explain_request``), ``kgc export`` (``export``), its benchmarks (``bench_commands``,
  ``bench_tables``, ``bench_write_request``), the API functions only it answers (``api_functions``) and the names
  ``import kgc`` offers (``public_names``); the loop asks it for the conditioner's own parameters
  (``conditioner_parameters``) and the objective's figures to log (``loss_figures``).

Adding a task is one package that defines such a class and registers it in its ``__init__.py`` (and its name
in :data:`kgc.registry.TASKS`' built-ins).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from kgc.errors import KGCError
from kgc.recipe import Recipe
from kgc.registry import TASKS

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from kgc.training.run import Run

Echo = Callable[[str], None]


class Task(ABC):
    """One task's part of training, and its hooks for the tools above it.

    The model ``build_model`` returns must offer ``encoders``, ``attach_layer_cache(recipe)``, ``layer_cache``
    and ``save_cache()``; ``metric`` (higher is better) picks ``best.pt``."""

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

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    # ------------------------------------------------------------ registration-level hooks (no instance)

    @classmethod
    @abstractmethod
    def run_class(cls) -> "type[Run]":
        """The class ``kgc.load`` returns for this task's runs."""

    @classmethod
    def check_dataset(cls, folder: Path) -> None:
        """Read a fetched dataset folder through (a bad file raises KGCError) before it is published."""

    @classmethod
    def check_data(cls, recipe: Recipe, dataset: str | Path | None = None) -> Any:
        """``kgc data check``: read ``dataset`` (a catalog name or a folder; None: the recipe's data) as training
        would, with the recipe's data settings, and return a report with ``folder``, ``errors`` (list of str) and
        ``lines()`` (``(level, line)`` rows: level "", "error", "warning" or "note"). An unreadable file raises
        KGCError (file, line, fix)."""
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
    def export(cls, run: "Run", out: Path, *, format: str | None = None) -> dict:
        """``kgc export``: write ``run`` into the folder ``out`` (atomically; a ``kgc.json`` in it says what it holds)
        and return that ``kgc.json``. Only tasks with an ``export_description`` export."""
        raise KGCError(f"{run.path} is a {cls.name} run; kgc export has nothing to write for it")

    @classmethod
    def bench_commands(cls) -> dict[str, Callable[..., dict]]:
        """The task's benchmarks, ``kgc bench NAME`` → a function returning the figures (``kgc.bench`` finds them
        here; ``kgc bench serve`` is every task's)."""
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
    def api_functions(cls) -> dict[str, Callable[..., Any]]:
        """Functions of ``kgc.api`` that only this task answers, by their API name (``latest_run``, ``read_pairs``
        …): the API asks the tasks for them instead of importing one."""
        return {}

    @classmethod
    def public_names(cls) -> dict[str, Any]:
        """Classes ``import kgc`` offers for this task (``kgc.<name>``, loaded on first use): its run class …"""
        run_class = cls.run_class()
        return {run_class.__name__: run_class}

    # ------------------------------------------------------------ training hooks

    @abstractmethod
    def build_model(self, backbone_folder: Path, *, pretrained: bool = True) -> "tuple[nn.Module, Any]":
        """(model, tokenizer); ``pretrained=False`` builds the architecture only."""

    @property
    def can_validate(self) -> bool:
        """Whether there is validation data (without it nothing is validated, and best.pt is the final weights)."""
        return True

    def data_summary(self, model: "nn.Module") -> list[tuple[str, str]]:
        """``(level, line)`` rows describing the training data, printed when training starts (level "warning" and
        "error" lines are shown in colour)."""
        return []

    @abstractmethod
    def make_loss(self) -> "nn.Module": ...

    @property
    @abstractmethod
    def steps_per_epoch(self) -> int: ...

    @abstractmethod
    def epoch_batches(self, epoch: int) -> "list[np.ndarray]":
        """The epoch's batches (``steps_per_epoch`` of them); a pure function of (seed, epoch)."""

    def prepare(self, model: "nn.Module", criterion: "nn.Module", batch: "np.ndarray") -> Any:
        """A batch of :meth:`epoch_batches` made ready on the host for :meth:`batch_loss` (token rows, padded and
        pinned inputs): called in the prefetch thread while the previous step runs (``train.prefetch``), so it must
        not read anything back from the device. Default: the batch as it is. A prepared batch has ``len()``: its
        examples."""
        return batch

    @abstractmethod
    def batch_loss(self, model: "nn.Module", criterion: "nn.Module", batch: Any) -> "torch.Tensor":
        """The objective of one batch, as :meth:`epoch_batches` gives it or as :meth:`prepare` made it."""

    def batch_size(self, batch: "np.ndarray") -> int:
        """Training examples in a batch (for the throughput figure)."""
        return len(batch)

    @abstractmethod
    def validate(self, model: "nn.Module") -> tuple[dict[str, float], str]:
        """(metrics including ``self.metric`` and ``dev_seconds``, a one-line summary)."""

    def before_step(self, model: "nn.Module", criterion: "nn.Module", step: int) -> None:
        """Before optimiser step ``step`` + 1 (``step`` done so far; a resumed run calls it with the same counts)."""

    def after_step(self, criterion: "nn.Module") -> None:
        """After every optimiser step (e.g. keep a learnt temperature within its bounds)."""

    def conditioner_parameters(self, model: "nn.Module") -> "list[nn.Parameter]":
        """The parameters ``train.conditioner_lr`` applies to: the conditioner's own (not its encoder's)."""
        return []

    def loss_figures(self, criterion: "nn.Module") -> dict[str, float]:
        """Figures of the objective logged beside the loss on the steps that log (e.g. a learnt temperature as
        ``tau``); reading one may wait for the device."""
        return {}

    def to(self, device: "torch.device") -> None:
        """Move task-side tensors (e.g. the false-negative keys) to the training device."""

    def loss_state(self, criterion: "nn.Module") -> Any:
        """Training state the objective carries besides its parameters (SimKGC's pre-batch queue)."""
        return None

    def load_loss_state(self, criterion: "nn.Module", state: Any, device: "torch.device") -> None:
        pass

    def after_training(self, run_dir: Path, *, progress: bool, echo: Echo) -> None:
        """Work that follows the text model's training (main process only), e.g. a structural model beside it."""


def task_class(name: str) -> type[Task]:
    """The registered task ``name`` (an unknown name lists the registered ones)."""
    return TASKS.lookup(name)


def make_task(recipe: Recipe) -> Task:
    """The recipe's task, ready to train (reads its data)."""
    return task_class(recipe.task)(recipe)


def open_run(path: str | Path, *, device: str = "auto", echo: Echo | None = print) -> "Run":
    """The run directory at ``path`` as its task's run class (``kgc.load``)."""
    from kgc.training.run import RunDir

    folder = RunDir(path)  # a missing or foreign folder fails here, with the fix
    return task_class(folder.recipe.task).run_class()(folder, device=device, echo=echo)
