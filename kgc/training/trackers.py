"""Experiment trackers (``train.trackers``): every row a run writes to ``metrics.jsonl`` also goes where people read
curves — TensorBoard, MLflow, a CSV file.

* ``tensorboard``: event files under ``RUN/tensorboard`` (scalars ``train/loss``, ``train/tau``, ``train/lr``,
  ``train/<unit>_per_s``, ``dev/mrr`` …; the resolved recipe as text; ``curves.png`` as an image at the end). A
  resumed run purges the events past the step it restarts from, as ``metrics.jsonl`` drops its rows.
* ``mlflow``: one MLflow run per kgc run, in ``$MLFLOW_TRACKING_URI`` when set, else a SQLite store under the run
  (``sqlite:///RUN/mlflow/mlflow.db``, artefacts beside it); the experiment is the recipe's name; params = the
  resolved recipe, flattened (``train.lr``); metrics per step; artefacts ``curves.png`` and ``train_summary.json``
  (and ``results.json`` after ``kgc evaluate``). A resumed run logs into the same MLflow run (its id is kept in
  ``RUN/mlflow/run_id``).
* ``csv``: ``RUN/metrics.csv`` in the layout of PyKEEN's ``CSVResultTracker`` (``type,step,key,value``: the
  recipe's parameters, then a metric row per number per step).
* ``wandb``: one Weights & Biases run per kgc run, **offline** unless ``$WANDB_MODE`` says otherwise (nothing leaves
  the machine; ``wandb sync RUN/wandb/offline-run-*`` uploads it later), under ``RUN/wandb``; the project is
  ``$WANDB_PROJECT`` or the recipe's name, the config the resolved recipe, the rows logged against a ``step`` metric
  (``train/loss`` …, as TensorBoard's tags), ``curves.png`` as an image and ``train_summary.json`` saved at the end,
  the test figures in the run's summary after ``kgc evaluate``. A resumed run logs into the same W&B run id (kept in
  ``RUN/wandb/run.json``); its rows are plotted against ``step``, so the replayed steps past the checkpoint overwrite
  nothing and W&B's own monotonic step is not needed.

Each is an optional dependency (``pip install 'kgc[tensorboard]'``, ``'kgc[mlflow]'``, ``'kgc[wandb]'``); a missing
one is one message naming the extra, before the first step. Only rank 0 logs (under torchrun the others write no
metrics). Nothing here changes what a run computes.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import time
from pathlib import Path
from typing import Any, Iterable

from kgc.errors import KGCError
from kgc.fileio import append_line, write_text
from kgc.registry import TRACKERS
from kgc.training.study_trackers import STUDY, MLflowStudy, StudyFacts, StudyTracking, mlflow_experiment

NOT_SCALARS = ("step", "epoch")


def check_available(names: Iterable[str]) -> None:
    """One message for the first tracker whose package is missing, naming the extra to install."""
    for name in names:
        if name not in TRACKERS:
            raise KGCError(f"train.trackers: unknown tracker {name!r}; registered: {', '.join(TRACKERS)}")
        needs = TRACKERS[name].needs
        if needs is not None and importlib.util.find_spec(needs[0]) is None:
            module, extra = needs
            install = f"pip install 'kgc[{extra}]' (or pip install {module})" if extra else f"pip install {module}"
            raise KGCError(f"train.trackers: {name} needs the {module} package, which is not installed: "
                           f"{install}, or leave {name} out of train.trackers")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row (step and epoch are its coordinates, not scalars)."""
    return {k: float(v) for k, v in record.items()
            if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}


def tag(key: str) -> str:
    """``dev_mrr`` → ``dev/mrr``, ``loss`` → ``train/loss``: the two groups TensorBoard shows apart."""
    return f"dev/{key[4:]}" if key.startswith("dev_") else f"train/{key}"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-4}}`` → ``{"train.lr": 1e-4}`` (recipe keys as ``--set`` writes them)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    """One destination, registered in :data:`kgc.registry.TRACKERS` under its ``name`` (``@TRACKERS.register``; a
    plugin's through the ``kgc.trackers`` entry points). ``resume_step``: the step a resumed run restarts from
    (None: a new run). ``log`` takes each metrics.jsonl row; ``finish`` the files kept at the end; ``abort`` an
    error's end; :meth:`after_evaluate` the test figures of a later ``kgc evaluate``."""

    name = ""
    needs: tuple[str, str | None] | None = None  # (the module it imports, the kgc extra that installs it)

    def __init__(self, run_dir: Path, params: dict[str, Any], *, title: str, resume_step: int | None) -> None:
        self.run_dir, self.params, self.title, self.resume_step = run_dir, params, title, resume_step

    def log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def finish(self, artifacts: list[Path]) -> None:
        pass

    def abort(self) -> None:
        """The training stopped with an error before ``finish``: release what is open (a resumed run reopens it)."""

    def results(self, results_file: Path, metrics: dict[str, float]) -> None:
        """After ``kgc evaluate``: the test figures (where the tracker keeps one record per run)."""

    @classmethod
    def after_evaluate(cls, run_dir: Path, results_file: Path, metrics: dict[str, float]) -> None:
        """After ``kgc evaluate RUN`` of a run this tracker followed: its figures, where the tracker keeps them
        (nothing by default: a tracker of curves only)."""

    @classmethod
    def for_study(cls, study: StudyFacts) -> StudyTracking | None:
        """A ``kgc tune`` study's record in this tracker (told of each trial and of the study's end), or None: a
        tracker that keeps runs one by one (the default; MLflow keeps a study as a parent run)."""
        return None


@TRACKERS.register
class TensorBoardTracker(Tracker):
    name = "tensorboard"
    needs = ("tensorboard", "tensorboard")

    @classmethod
    def after_evaluate(cls, run_dir: Path, results_file: Path, metrics: dict[str, float]) -> None:
        if (run_dir / "tensorboard").is_dir():
            check_available([cls.name])
            cls.results_into(run_dir, metrics)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from torch.utils.tensorboard import SummaryWriter

        self.folder = self.run_dir / "tensorboard"
        # rows up to the checkpoint's step stay (as in metrics.jsonl); TensorBoard purges from purge_step on
        self.writer = SummaryWriter(str(self.folder), purge_step=None if self.resume_step is None
                                    else self.resume_step + 1)
        if self.resume_step is None:
            text = json.dumps(self.params, indent=2, default=str)
            self.writer.add_text("recipe", "    " + text.replace("\n", "\n    "), 0)  # a code block in markdown

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in scalars(record).items():
            self.writer.add_scalar(tag(key), value, step)
        self.writer.flush()  # a killed run keeps every row it logged

    def finish(self, artifacts: list[Path]) -> None:
        import matplotlib.image

        for path in artifacts:
            if path.suffix == ".png" and path.is_file():
                self.writer.add_image(path.stem, matplotlib.image.imread(str(path))[..., :3], dataformats="HWC")
        self.writer.close()

    def abort(self) -> None:
        self.writer.close()

    @staticmethod
    def results_into(run_dir: Path, metrics: dict[str, float]) -> None:
        """After ``kgc evaluate``: the figures (``test_mrr`` → ``test/mrr``) at the run's last step, in the same
        event folder as its curves."""
        from torch.utils.tensorboard import SummaryWriter

        try:
            step = int(json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            step = 0
        writer = SummaryWriter(str(run_dir / "tensorboard"))
        for key, value in metrics.items():
            split, _, name = key.partition("_")
            writer.add_scalar(f"{split}/{name}", value, step)
        writer.close()


@TRACKERS.register
class MLflowTracker(Tracker):
    name = "mlflow"
    needs = ("mlflow", "mlflow")

    @classmethod
    def after_evaluate(cls, run_dir: Path, results_file: Path, metrics: dict[str, float]) -> None:
        if (run_dir / "mlflow" / "run_id").is_file():
            check_available([cls.name])
            cls(run_dir, {}, title="", resume_step=0).results(results_file, metrics)

    @classmethod
    def for_study(cls, study: StudyFacts) -> StudyTracking:
        return MLflowStudy(study)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import logging
        import os

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its "Creating initial MLflow database tables"

        self.folder = self.run_dir / "mlflow"
        self.folder.mkdir(exist_ok=True)
        id_file = self.folder / "run_id"
        known = id_file.read_text().split() if id_file.is_file() else []  # run id [store URI]
        self.uri = (known[1] if len(known) > 1 else None) or STUDY.get("uri") or os.environ.get(
            "MLFLOW_TRACKING_URI") or f"sqlite:///{(self.folder / 'mlflow.db').resolve()}"
        self.client = MlflowClient(self.uri)
        run_id = known[0] if known else ""
        self.logged_until = -1  # a resumed run's steps MLflow holds already (the replay logs the same values)
        if not run_id:
            experiment_id = mlflow_experiment(self.client, STUDY.get("experiment") or self.title,
                                              self.folder / "artifacts")
            tags = {**STUDY.get("tags", {}), **({"mlflow.parentRunId": STUDY["parent"]} if STUDY else {})}
            run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags).info.run_id
            write_text(id_file, run_id + (f" {self.uri}" if STUDY else "") + "\n")
            self._params(run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
            if self.resume_step is not None:
                self.logged_until = max((m.step for m in self.client.get_metric_history(run_id, "loss")), default=-1)
        self.run_id = run_id

    def _params(self, run_id: str) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in flatten(self.params).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(run_id, params=params[start: start + 100])

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record.get("step", 0)), int(time.time() * 1000)
        if step <= self.logged_until:  # replayed after a resume: MLflow holds this step already, once
            return
        metrics = [Metric(key, value, now, step) for key, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, artifacts: list[Path]) -> None:
        for path in artifacts:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")

    def abort(self) -> None:
        self.client.set_terminated(self.run_id, "FAILED")  # a resumed run sets it RUNNING again

    def results(self, results_file: Path, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        if results_file.is_file():
            self.client.log_artifact(self.run_id, str(results_file))
        self.client.set_terminated(self.run_id, "FINISHED")


@TRACKERS.register
class CSVTracker(Tracker):
    """``RUN/metrics.csv`` in PyKEEN's ``CSVResultTracker`` layout: ``type,step,key,value``, the recipe's
    parameters first (``parameter``, step 0, flattened keys), then a ``metric`` row per number per logged step (the
    epoch among them). A resumed run drops the metric rows past its restart, as metrics.jsonl does."""

    name = "csv"
    HEADER = ["type", "step", "key", "value"]  # pykeen.trackers.CSVResultTracker.HEADER

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.path = self.run_dir / "metrics.csv"
        if self.resume_step is not None and self.path.is_file():  # drop the rows past the restart
            with self.path.open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if r.get("type") != "metric" or
                        (r.get("step") or "").isdigit() and int(r["step"]) <= self.resume_step]
            self._write(rows, mode="w")
        elif not self.path.is_file() or self.resume_step is None:
            self._write([{"type": "parameter", "step": 0, "key": k, "value": v}
                         for k, v in flatten(self.params).items()], mode="w")

    def _write(self, rows: list[dict[str, Any]], *, mode: str) -> None:
        """``mode`` "w": the file anew, whole (atomically); "a": rows appended (a cut last row after a crash is
        dropped by the resume's rewrite)."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=self.HEADER, lineterminator="\n", extrasaction="ignore")
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)
        if mode == "w":
            write_text(self.path, buf.getvalue())
        elif rows:
            append_line(self.path, buf.getvalue())

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        values = scalars(record)
        if isinstance(record.get("epoch"), (int, float)):
            values = {"epoch": float(record["epoch"]), **values}
        self._write([{"type": "metric", "step": step, "key": k, "value": v} for k, v in values.items()], mode="a")


@TRACKERS.register
class WandbTracker(Tracker):
    name = "wandb"
    needs = ("wandb", "wandb")

    @classmethod
    def after_evaluate(cls, run_dir: Path, results_file: Path, metrics: dict[str, float]) -> None:
        if (run_dir / "wandb" / "run.json").is_file():
            check_available([cls.name])
            cls(run_dir, {}, title="", resume_step=0).results(results_file, metrics)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import os
        import secrets
        import string

        import wandb

        self.folder = self.run_dir / "wandb"
        self.folder.mkdir(exist_ok=True)
        id_file = self.folder / "run.json"
        known = json.loads(id_file.read_text()) if id_file.is_file() and self.resume_step is not None else {}
        project = known.get("project") or os.environ.get("WANDB_PROJECT") or self.title or "kgc"
        run_id = known.get("id") or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        settings = wandb.Settings(silent=True, console="off")  # kgc prints its own lines; W&B need not copy them
        self.run = wandb.init(mode=os.environ.get("WANDB_MODE") or "offline", dir=str(self.folder),
                              project=project, name=self.run_dir.name, id=run_id, resume="allow",
                              config=self.params or None, settings=settings, reinit="create_new")
        if not known:
            write_text(id_file, json.dumps({"id": run_id, "project": project}) + "\n")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # plotted against kgc's step, not W&B's counter

    def log(self, record: dict[str, Any]) -> None:
        values = {tag(k): v for k, v in scalars(record).items()}
        if values:
            self.run.log({**values, "step": int(record.get("step", 0))})

    def finish(self, artifacts: list[Path]) -> None:
        import wandb

        for path in artifacts:
            if path.suffix == ".png" and path.is_file():
                self.run.log({f"images/{path.stem}": wandb.Image(str(path))})
            elif path.is_file():
                self.run.save(str(path), base_path=str(path.parent), policy="now")
        self.run.finish()

    def abort(self) -> None:
        self.run.finish(exit_code=1)

    def results(self, results_file: Path, metrics: dict[str, float]) -> None:
        self.run.summary.update(metrics)
        if results_file.is_file():
            self.run.save(str(results_file), base_path=str(results_file.parent), policy="now")
        self.run.finish()




class Trackers:
    """The run's trackers as one: each row to all of them; ``finish`` with the files to keep as artefacts."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers
        self.finished = False

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log(self, record: dict[str, Any]) -> None:
        for t in self.trackers:
            t.log(record)

    def finish(self, artifacts: list[Path]) -> None:
        self.finished = True
        for t in self.trackers:
            t.finish(artifacts)

    def close(self) -> None:
        """When training ends: the trackers of a run that did not reach ``finish`` (an error) are aborted, so the
        same process can resume it (W&B allows one open run per id)."""
        if not self.finished:
            self.finished = True
            for t in self.trackers:
                t.abort()


def open_trackers(names: Iterable[str], run_dir: Path, params: dict[str, Any], *, title: str,
                  resume_step: int | None = None) -> Trackers:
    names = list(dict.fromkeys(names))
    check_available(names)
    return Trackers([TRACKERS[n](run_dir, params, title=title, resume_step=resume_step) for n in names])


def study_trackings(names: Iterable[str], *, folder: Path, name: str, identity: dict[str, Any], metric: str,
                    direction: str) -> list[StudyTracking]:
    """The records of one ``kgc tune`` study in the trackers ``names`` that keep studies (``Tracker.for_study``)."""
    facts = StudyFacts(folder=Path(folder), name=name, identity=identity, metric=metric, direction=direction)
    return [t for t in (TRACKERS[n].for_study(facts) for n in names) if t is not None]


def log_results(names: Iterable[str], run_dir: Path, results_file: Path, metrics: dict[str, float]) -> None:
    """After ``kgc evaluate RUN``: the test figures to each tracker the run followed (:meth:`Tracker.after_evaluate`:
    TensorBoard's events, MLflow's and W&B's run of this training reopened by its id; csv keeps curves only)."""
    for name in dict.fromkeys(names):
        if name in TRACKERS:
            TRACKERS[name].after_evaluate(run_dir, results_file, metrics)
