"""A run directory (:class:`RunDir`: every path in it, and reading its files with clear errors) and the base
class of a task's run (:class:`Run`: what ``kgc.load`` returns; each task package subclasses it with its verbs).

Layout of a run directory::

    recipe.yaml            the resolved recipe (the command that resumes it on the first line)
    backbone/              config + tokenizer files; the pretrained weights too when some of them stay frozen
    best.pt                the weights validation picked (or the final ones): only those that train when
                           backbone/ holds the frozen rest
    checkpoints/last.pt    everything resume needs (deleted when training finishes, unless train.keep: all)
    metrics.jsonl, curves.png, train_summary.json
    results[.KIND][.SPLIT].json, ranks… .tsv / predictions… .tsv     evaluations (test has no suffix)
    index/                 link prediction: entity embeddings + FAISS index (+ added entities)
    structure/             link prediction: the PyKEEN model beside the text model
    data/                  triples handed to ``kgc.train(data=…)``, written as a KG-BERT folder
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from kgc.errors import KGCError, ResultsNotSaved
from kgc.fileio import recover, sha256_cached, sweep_leftovers
from kgc.recipe import Recipe, load_recipe

Echo = Callable[[str], None]
CHECKPOINTS = ("best.pt", "checkpoints/last.pt")  # weights, in the order a trained model is read from


def silent(msg: str) -> None:
    """An ``echo`` that says nothing."""


def read_results(run: "str | Path | Run", split: str = "test") -> dict:
    """A run's evaluation of ``split`` as written by ``kgc evaluate`` (results[.split].json)."""
    folder = run.dir if not isinstance(run, (str, Path)) else RunDir(run)
    f = folder.results(split)
    if not f.is_file():
        raise KGCError(f"{f}: not found; evaluate the run first (`kgc evaluate {folder.path}`)")
    return read_json(f, f"Evaluate the run again: `kgc evaluate {folder.path}`.")


def read_json(path: Path, fix: str) -> Any:
    """A JSON file the toolkit wrote; an unreadable one is one KGCError naming the file and ``fix``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KGCError(f"{path}: unreadable ({exc}). {fix}") from None


def load_checkpoint(path: Path, fix: str | None = None) -> dict[str, Any]:
    """A ``torch.save``d checkpoint; an unreadable or truncated one is one KGCError naming the file and the fix."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated zip, pickle error, wrong file: torch raises many kinds
        raise KGCError(f"{path}: unreadable checkpoint ({str(exc).splitlines()[0][:200]}). "
                       f"{fix or 'Delete it to restart that run.'}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise KGCError(f"{path}: not a kgc checkpoint (no model weights in it). {fix or 'Delete it.'}")
    return state


def weights_to_save(model, lean: bool) -> dict[str, Any]:
    """The ``model`` and ``frozen_keys`` entries of a checkpoint: with ``lean`` (the run's backbone/ holds the
    pretrained weights) the parameters that do not train are left out — they are the pretrained ones, read from
    backbone/ when the model is built — and named in ``frozen_keys``; otherwise every weight."""
    import torch

    full = model.state_dict(keep_vars=True)
    frozen = [k for k, v in full.items() if lean and isinstance(v, torch.nn.Parameter) and not v.requires_grad]
    skip = set(frozen)
    return {"model": {k: v.detach() for k, v in full.items() if k not in skip}, "frozen_keys": frozen}


def load_weights(model, state: dict[str, Any], path: Path) -> None:
    """Load a checkpoint's weights into ``model`` (built with backbone/'s pretrained weights when the checkpoint
    leaves the frozen ones out); a checkpoint that does not fit the model is one KGCError naming the file."""
    frozen = set(state.get("frozen_keys") or ())
    try:
        missing, unexpected = model.load_state_dict(state["model"], strict=False)
    except RuntimeError as exc:  # a shape mismatch
        raise KGCError(f"{path}: its weights do not fit the model the run's recipe builds "
                       f"({str(exc).splitlines()[0][:200]}). Was recipe.yaml edited?") from None
    if unexpected or set(missing) != frozen:
        odd = unexpected or sorted(set(missing) ^ frozen)
        raise KGCError(f"{path}: its weights do not fit the model the run's recipe builds ({len(odd)} keys differ, "
                       f"e.g. {odd[0]}). Was recipe.yaml edited?")


def as_list(x: Any) -> tuple[list, bool]:
    """(items, was a single string): the runs' verbs take one string or a sequence of them."""
    if isinstance(x, str):
        return [x], True
    return list(x), False


RECIPE_END = "# end of recipe"  # the last line of a run's recipe.yaml: half a recipe lacks it
_RECIPE_PROMISE = f'(a whole one ends with "{RECIPE_END}")'  # said by the first line, which a cut file keeps


def saved_recipe_text(recipe, run_dir: str | Path) -> str:
    """A run's recipe.yaml: the command that resumes it, the resolved recipe, and an end line, so that a file cut
    short (a copy that stopped, a damaged disk) is told from a whole one instead of read with defaults for its
    missing keys."""
    return f"# kgc train --resume {run_dir}   {_RECIPE_PROMISE}\n{recipe.to_yaml()}{RECIPE_END}\n"


def check_saved_recipe(path: Path) -> None:
    """A run's recipe.yaml whose first line promises an end line (every one written since it did) and that lacks
    it is cut: one KGCError naming it. Older runs' files (no promise) are read as before."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # the recipe reader names what is wrong with it
    lines = text.splitlines()
    if lines and _RECIPE_PROMISE in lines[0] and RECIPE_END not in (line.strip() for line in lines[1:]):
        raise KGCError(f"{path}: cut — it ends at line {len(lines)} without its last line \"{RECIPE_END}\", so the "
                       "rest of the run's recipe is missing (its keys would silently take their defaults). Copy "
                       "recipe.yaml back from a copy of the run, or write it again from the recipe file the run was "
                       "trained from (with the --set values it was given), keeping the first line and ending with "
                       f"\"{RECIPE_END}\".")


class RunDir:
    """The paths of one run directory; the one place that knows its layout."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.recipe_file.is_file():
            raise KGCError(self.not_a_run(self.path))
        with contextlib.suppress(KGCError):  # an evaluation's files killed mid-commit: completed (read-only: as is)
            recover(self.path)
        # what killed writers left staged (never a live one's): a reader sweeps too, not only the next writer
        for folder in (self.path, self.path / "checkpoints", self.path / "index", self.path / "added"):
            sweep_leftovers(folder)
        check_saved_recipe(self.recipe_file)
        self.recipe: Recipe = load_recipe(self.recipe_file, saved=True)

    recipe_file = property(lambda self: self.path / "recipe.yaml")
    backbone = property(lambda self: self.backbone_folder(self.path))
    best = property(lambda self: self.path / CHECKPOINTS[0])
    last = property(lambda self: self.path / CHECKPOINTS[1])
    metrics = property(lambda self: self.path / "metrics.jsonl")
    curves = property(lambda self: self.path / "curves.png")
    summary_file = property(lambda self: self.path / "train_summary.json")  # RunDir.finished
    index = property(lambda self: self.path / "index")
    structure = property(lambda self: self.path / "structure")
    data = property(lambda self: self.data_folder(self.path))

    @staticmethod
    def not_a_run(path: Path) -> str:
        """Why ``path`` is not a run directory, and what to do (a dataset folder given by mistake is named so)."""
        if not path.exists():
            return (f"{path}: no such folder. Give a run directory (what `kgc train RECIPE --out {path}` makes), "
                    "e.g. one under runs/.")
        from kgc.registry import TASKS

        marks = {f for name in TASKS for f in TASKS[name].dataset_files}  # what each task's dataset folders hold
        if path.is_dir() and any((path / f).is_file() for f in marks):
            return (f"{path} is a dataset folder, not a kgc run directory (no recipe.yaml); train a run on it with "
                    f"`kgc train RECIPE --set data.path={path} --out runs/NAME` and give that run's folder.")
        return (f"{path} is not a kgc run directory (no recipe.yaml); train one with `kgc train RECIPE --out {path}`, "
                "or give the folder of a trained run (e.g. one under runs/).")

    @staticmethod
    def finished(path: str | Path) -> bool:
        """A run directory whose training finished (it wrote train_summary.json)."""
        return (Path(path) / "train_summary.json").is_file()

    @staticmethod
    def died_young(path: str | Path) -> bool:
        """A run directory whose training stopped before its first checkpoint (a kill, a full disk): a recipe, no
        weights, no summary. ``kgc train --resume`` starts it again in place."""
        path = Path(path)
        return (path / "recipe.yaml").is_file() and not any((path / f).is_file() for f in (*CHECKPOINTS,
                                                                                            "train_summary.json"))

    @staticmethod
    def training_now(path: str | Path) -> dict | None:
        """The holder (pid, command, since) of a training that is writing ``path`` now, on this machine; None when
        none is (a holder file left by a killed process names a pid that is gone)."""
        import os
        import socket

        from kgc.fileio import lock_holder

        holder = lock_holder(path)
        if not holder or holder.get("what") != "training" or holder.get("host") != socket.gethostname():
            return None
        try:
            os.kill(int(holder.get("pid", -1)), 0)
        except (OSError, ValueError, OverflowError):
            return None
        return holder

    @staticmethod
    def no_weights_message(path: str | Path) -> str:
        """What a run without weights is, and the one thing to do — the same words from train, --resume, predict,
        evaluate and serve."""
        holder = RunDir.training_now(path)
        if holder is not None:
            return (f"{path}: no weights yet: it is still training (`{holder.get('command', 'kgc train')}`, pid "
                    f"{holder.get('pid')}, since {holder.get('since')}) and has not written its first checkpoint. "
                    "Wait for it (train.checkpoint_every steps), or stop it and start it again.")
        return (f"{path}: no weights: its training stopped before the first checkpoint (killed, or a write failed). "
                f"Start it again in place with `kgc train --resume {path}` (its recipe.yaml, from step 0), or "
                "delete the folder.")

    @staticmethod
    def resumable(path: str | Path) -> bool:
        """A run directory with a checkpoint to resume from."""
        return (Path(path) / CHECKPOINTS[1]).is_file()

    @staticmethod
    def backbone_folder(path: str | Path) -> Path:
        """Where a new run's backbone files go (written before its recipe.yaml)."""
        return Path(path) / "backbone"

    @staticmethod
    def data_folder(path: str | Path) -> Path:
        """Where ``kgc.train(data=…)`` writes the triples it was given (before the run has a recipe.yaml)."""
        return Path(path) / "data"

    # ------------------------------------------------------------ a new run directory

    # files of a run that died before a checkpoint it could resume from (best.pt: a validation's, train.keep: best)
    LEFTOVERS = ("metrics.jsonl", "curves.png", "best.pt")

    @staticmethod
    def default_path(name: str) -> Path:
        """Where a new run goes when no folder is named: ``runs/<name>-<time>``."""
        from datetime import datetime

        return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"

    @staticmethod
    def create(path: str | Path, hold: contextlib.ExitStack | None = None, *, restart: bool = False) -> Path:
        """A new run's folder ``path``, created — the one place a run directory is made (``kgc train``, and
        ``kgc.train(data=…)`` before it writes the triples into it) — with its lock taken first: into ``hold``
        (held until that stack closes), else only while the folder is checked. A folder that holds a run already, or
        one another process is writing (a second ``kgc train --out`` started at the same moment), is a KGCError
        before anything is written into it. ``restart``: a run that died before its first checkpoint, started again
        in place: its leftovers go, as one transaction. The run exists once its recipe.yaml is written, last, over
        its backbone/ (the commit point: a folder without it is no run, and ``create`` takes it again)."""
        import shutil

        from kgc.fileio import Transaction, run_lock

        path = Path(path)
        with contextlib.ExitStack() as brief:
            (hold if hold is not None else brief).enter_context(run_lock(path, "training"))
            if restart:
                with Transaction(path) as tx:
                    for name in RunDir.LEFTOVERS:
                        tx.remove(name)
                    tx.commit()
                shutil.rmtree(path / "checkpoints", ignore_errors=True)
            elif RunDir.died_young(path):
                raise KGCError(f"{path} holds a run that stopped before its first checkpoint. Start it again in place "
                               f"with `kgc train --resume {path}` (its recipe.yaml), or pick another --out.")
            elif (path / "recipe.yaml").exists():
                raise KGCError(f"{path} already holds a run. Continue it with `kgc train --resume {path}` or pick "
                               "another --out.")
        return path

    @staticmethod
    def discard(path: str | Path, *, existed: bool, made: tuple[str, ...]) -> None:
        """Undo a :meth:`create` that failed before the run was committed: the folder goes when it did not exist
        before, else only what was ``made`` in it (``"data"``, ``"backbone"`` …) — nothing half-written stays."""
        import shutil

        path = Path(path)
        if not existed:
            shutil.rmtree(path, ignore_errors=True)
            return
        for name in made:
            f = path / name
            shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)

    def output(self, stem: str, split: str = "test", kind: str | None = None, ext: str = "json") -> Path:
        """``<stem>[.<kind>][.<split>].<ext>``, e.g. results.json, ranks.dev.tsv, results.inductive.json; the test
        split has no suffix."""
        parts = [stem] + ([kind] if kind else []) + ([] if split == "test" else [split])
        return self.path / f"{'.'.join(parts)}.{ext}"

    def results(self, split: str = "test", kind: str | None = None) -> Path:
        return self.output("results", split, kind)

    def table(self, stem: str, split: str = "test", kind: str | None = None) -> Path:
        """ranks[…].tsv (link prediction) or predictions[…].tsv (C-STS)."""
        return self.output(stem, split, kind, "tsv")

    def summary(self) -> dict | None:
        """train_summary.json (None while the run has not finished)."""
        if not self.summary_file.is_file():
            return None
        return read_json(self.summary_file, f"Delete it and finish the run with `kgc train --resume {self.path}`.")

    @staticmethod
    def has_backbone_weights(path: str | Path) -> bool:
        """Whether the run's backbone/ holds pretrained weights (its checkpoints then leave the frozen ones out)."""
        folder = RunDir.backbone_folder(path)
        return any((folder / f).is_file() for f in ("model.safetensors", "pytorch_model.bin",
                                                     "model.safetensors.index.json"))

    @property
    def pretrained(self) -> bool:
        """Build this run's model with backbone/'s weights (then load the checkpoint over them)."""
        return self.has_backbone_weights(self.path)

    def load_weights(self, model) -> None:
        """The run's trained weights (best.pt, else checkpoints/last.pt) into ``model``, built with
        ``pretrained=self.pretrained``."""
        f = self.weights_file()
        if f != self.best:
            fix = "Delete it to restart that run."
        elif self.last.is_file():
            fix = (f"Resume the run to rewrite it (`kgc train --resume {self.path}`), or delete it to use "
                   "checkpoints/last.pt.")
        else:
            fix = (f"Delete it and train again (`kgc train {self.recipe_file} --out NEW_DIR`): the run kept no "
                   "resume state (train.keep: best).")
        state = load_checkpoint(f, fix)  # unreadable: said as such; readable but not as recorded: damaged
        self.check_files(fix)
        load_weights(model, state, f)

    def file_records(self) -> dict[str, dict]:
        """``{path in the run: {"bytes", "sha256"}}`` of the files a finished run's model is built from (best.pt and
        backbone/*), for train_summary.json's ``files``."""
        paths = [self.best] + sorted(f for f in self.backbone.rglob("*") if f.is_file())
        return {str(f.relative_to(self.path)): {"bytes": f.stat().st_size, "sha256": sha256_cached(f)}
                for f in paths if f.is_file()}

    def check_files(self, weights_fix: str = "") -> None:
        """The model's files (best.pt, backbone/*) against the sizes and sha256 train_summary.json recorded when
        training finished: a damaged one (truncated, flipped bytes) is one KGCError naming it, never a model that
        answers wrongly. Runs from before the record, or without a readable summary, are not checked."""
        try:
            summary = self.summary()
        except KGCError:
            return  # an unreadable summary is said where it is needed (kgc compare), not here
        records = summary.get("files") if isinstance(summary, dict) else None
        if not isinstance(records, dict):
            return
        for name, rec in records.items():
            f = self.path / str(name)
            if f == self.best:
                fix = weights_fix
            else:
                fix = (f"Copy it back from the model it was copied from (recipe.yaml's model.backbone: "
                       f"{self.recipe.model.backbone}), or train the run again.")
            if not isinstance(rec, dict):
                raise KGCError(f"{self.summary_file}: its record of {name} is damaged. {fix}")
            if not f.is_file():
                raise KGCError(f"{f}: missing (the run had it when training finished). {fix}")
            size = f.stat().st_size
            if size != rec.get("bytes"):
                raise KGCError(f"{f}: damaged (size {size}, expected {rec.get('bytes')}, as train_summary.json "
                               f"recorded when training finished). {fix}")
            if sha256_cached(f) != rec.get("sha256"):
                raise KGCError(f"{f}: damaged (its sha256 differs from the one train_summary.json recorded when "
                               f"training finished). {fix}")

    def weights_file(self) -> Path:
        for f in (self.best, self.last):
            if f.is_file():
                return f
        raise KGCError(self.no_weights_message(self.path))

    def weights_fingerprint(self) -> str:
        """sha256 of the weights file, hashed once per version of it (one command checks an index's freshness
        several times; a long-lived Run that retrains sees the new file's size or time)."""
        return sha256_cached(self.weights_file())  # the cache check_files uses: best.pt is hashed once per load

    @staticmethod
    def weights_mtime(path: str | Path) -> float | None:
        """When the newest weights file of the run folder ``path`` was written (None: it has none yet); a static
        method, so a search over many folders need not parse their recipes."""
        times = [(Path(path) / w).stat().st_mtime for w in CHECKPOINTS if (Path(path) / w).is_file()]
        return max(times) if times else None


class Run:
    """A trained run of one task: ``path``, ``recipe``, ``task``, ``dir`` (its :class:`RunDir`), ``device``;
    ``evaluate`` / ``evaluation``, and the task's own verbs on the subclass. The model and data are loaded on
    first use and kept."""

    task: ClassVar[str]
    command: ClassVar[str]  # what to run on such a run from the shell, e.g. "kgc predict RUN --head … --relation …"

    def __init__(self, path: str | Path | RunDir, *, device: str = "auto", echo: Echo | None = print) -> None:
        from kgc.training.common import pick_device

        self.dir = path if isinstance(path, RunDir) else RunDir(path)
        self.path: Path = self.dir.path
        self.recipe: Recipe = self.dir.recipe
        if self.recipe.task != self.task:
            raise KGCError(f"{self.path} is a {self.recipe.task} run, not {self.task}; open it with kgc.load "
                           f"(`kgc evaluate {self.path}` works for every task)")
        self.device = pick_device(device)
        self.echo: Echo = echo or silent

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, task={self.task!r})"

    def __getattr__(self, name: str):
        """Another task's verb (``predict`` on a C-STS run) is a KGCError saying what this run is and offers."""
        if name.startswith("_"):
            raise AttributeError(name)
        from kgc.registry import TASKS

        owners = [t for t in TASKS if t != self.task and hasattr(TASKS[t].run_class(), name)]
        if owners:
            raise KGCError(f"{self.path} is a {self.task} run, not {owners[0]}; use `{self.command}` "
                           f"({name}() belongs to {owners[0]} runs)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def evaluate(self, split: str | None = None, **options: Any) -> dict:
        """Evaluate on ``split`` and return the dict written to ``results[.split].json``."""
        return self.evaluation(split, **options).results

    def evaluation(self, split: str | None = None, **options: Any):
        """The evaluation of ``split`` with ``.results``, ``.seconds`` and the task's per-row output."""
        raise NotImplementedError

    def _save(self, evaluation: Any, write: Callable[[], None], split: str = "test", kind: str | None = None) -> Any:
        """``write()`` an evaluation's files into the run and return ``evaluation``; a folder that refuses them
        raises :class:`~kgc.errors.ResultsNotSaved`, which carries the evaluation (its figures are not lost). The
        headline figures then go to the run's trackers that keep one record per run (``train.trackers``)."""
        try:
            write()
        except KGCError as exc:
            raise ResultsNotSaved(f"{exc} The evaluation itself ran (its figures are printed above, and kept on "
                                  "this error's .evaluation); only saving them failed.", evaluation) from None
        if self.recipe.train.trackers:
            from kgc.registry import TASKS
            from kgc.training.trackers import log_results

            prefix = "_".join([split] + ([kind] if kind else []))
            headline = TASKS[self.task].headline(evaluation.results)
            log_results(self.recipe.train.trackers, self.path, self.dir.results(split, kind),
                        {f"{prefix}_{k.replace('@', '_at_')}": float(v) for k, v in headline.items()})
        return evaluation

    def serving(self):
        """What ``kgc serve`` exposes for this run (a :class:`kgc.training.routes.Serving`)."""
        raise KGCError(f"{self.path}: kgc serve does not serve {self.task} runs")


@dataclass
class ExplainInputs:
    """What a run hands ``kgc explain``: its conditioner and tokenizer, a sentence's token ids (None when none was
    given; ``sentence_hint`` says how to give one) and the conditions' token ids with their names."""
    conditioner: Any
    tokenizer: Any
    sentence: list[int] | None
    subject: str  # the sentence as a reader knows it (an entity's id and text)
    conditions: list[list[int]]
    names: list[str]
    sentence_hint: str
