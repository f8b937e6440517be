"""Trackers that keep a ``kgc tune`` study as one record: the tracker family's hook for studies
(:meth:`kgc.training.trackers.Tracker.for_study`). A :class:`StudyTracking` is told when each trial trains and ends
and when a command on the study ends; MLflow's (:class:`MLflowStudy`) is one parent run per study with a child run
per trial. A plugin tracker that knows studies returns its own from ``for_study``."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgc.fileio import write_text

STUDY: dict[str, Any] = {}  # a tuning study's trial being trained here: experiment, parent run, tags (kgc tune)


def mlflow_experiment(client, name: str, artifacts: Path) -> str:
    """The id of the MLflow experiment ``name`` in ``client``'s store, made (its artefacts under ``artifacts``) when
    the store has none of that name: a kgc run's experiment and a ``kgc tune`` study's."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(name, artifact_location=artifacts.resolve().as_uri())


@contextlib.contextmanager
def study_trial(experiment: str, parent_run_id: str, uri: str, tags: dict[str, str]):
    """While a ``kgc tune`` trial trains in this process: its MLflow run is a child of the study's parent run, in
    the study's experiment and store, tagged with the trial's number and the study (so MLflow's table compares a
    study's trials as one)."""
    STUDY.update(experiment=experiment, parent=parent_run_id, uri=uri, tags=tags)
    try:
        yield
    finally:
        STUDY.clear()



@dataclass
class StudyFacts:
    """What a tracker is told of a study: its folder, name, identity (space, budget, reports, pruner, sampler,
    metric, the --set values) and the metric it optimises in which direction."""
    folder: Path
    name: str
    identity: dict[str, Any] = field(default_factory=dict)
    metric: str = ""
    direction: str = "maximize"


class StudyTracking:
    """One tracker's record of one study; every hook does nothing by default."""

    def __init__(self, study: StudyFacts) -> None:
        self.study = study

    @contextlib.contextmanager
    def trial(self, number: int):
        """While trial ``number`` trains in this process (its own tracker runs inside)."""
        yield

    def ended(self, run: Path, state: str, objective: float | None) -> None:
        """Trial run ``run`` ended: ``complete`` (with its objective), ``pruned`` or ``failed``."""

    def finish(self, summary: dict) -> None:
        """A command on the study ended, with the study's summary (counts, best trial)."""


class MLflowStudy(StudyTracking):
    """One MLflow parent run per study — in the study's experiment (named as the study), in
    ``$MLFLOW_TRACKING_URI`` or ``STUDY/mlflow/mlflow.db``, made once (``STUDY/mlflow/parent_run_id``) — each
    trial's run its child, tagged with the trial and its outcome."""

    def __init__(self, study: StudyFacts) -> None:
        super().__init__(study)
        self._parent: tuple[str, str] | None = None

    def parent(self) -> tuple[str, str]:
        """(store URI, parent run id), made on first use and tagged with the study's identity."""
        if self._parent is None:
            from mlflow.tracking import MlflowClient

            s = self.study
            folder = s.folder / "mlflow"
            folder.mkdir(parents=True, exist_ok=True)
            uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
            client = MlflowClient(uri)
            id_file = folder / "parent_run_id"
            run_id = id_file.read_text().strip() if id_file.is_file() else ""
            if not run_id:
                run_id = client.create_run(mlflow_experiment(client, s.name, folder / "artifacts"),
                                           run_name=f"study {s.name}",
                                           tags={"kgc.study": s.name, "kgc.budget": str(s.identity.get("budget")),
                                                 "kgc.metric": s.metric}).info.run_id
                write_text(id_file, run_id + "\n")
            self._parent = (uri, run_id)
        return self._parent

    @contextlib.contextmanager
    def trial(self, number: int):
        """The trial's MLflow run is a child of the study's run (:func:`study_trial`)."""
        uri, run_id = self.parent()
        with study_trial(self.study.name, run_id, uri, {"kgc.study": self.study.name, "kgc.trial": str(number)}):
            yield

    def ended(self, run: Path, state: str, objective: float | None) -> None:
        """The trial's outcome as a tag of its MLflow run, and for a complete trial its objective — the value
        Optuna records (the best of its reports), not its last validation — as the metric ``objective`` and the
        tag ``kgc.objective``."""
        id_file = run / "mlflow" / "run_id"
        if not id_file.is_file():
            return
        from mlflow.tracking import MlflowClient

        with contextlib.suppress(Exception):  # a tag is not worth a trial
            client, child = MlflowClient(self.parent()[0]), id_file.read_text().split()[0]
            client.set_tag(child, "kgc.state", state)
            if objective is not None:
                client.log_metric(child, "objective", float(objective))
                client.set_tag(child, "kgc.objective", f"{self.study.metric} {objective:.6g}")

    def finish(self, summary: dict) -> None:
        """What makes the study's trials comparable as params (the space, budget, reports, pruner, sampler,
        metric: logged once, as MLflow params are), the best value and trial and the counts as metrics and tags,
        and the run FINISHED (a continued study reopens and ends it again)."""
        import json

        from mlflow.tracking import MlflowClient

        uri, run_id = self.parent()
        client, s = MlflowClient(uri), self.study
        identity = s.identity
        params = {"space": json.dumps(identity["space"], sort_keys=True, default=str), "budget": identity["budget"],
                  "reports": identity["reports"], "pruner": identity["pruner"], "sampler": identity["sampler"],
                  "metric": s.metric, "direction": s.direction,
                  "fixed": json.dumps(identity["fixed"], sort_keys=True, default=str)}
        have = client.get_run(run_id).data.params
        for key, value in params.items():
            if key not in have:
                client.log_param(run_id, key, str(value))
        for key in ("complete", "pruned", "failed"):
            client.log_metric(run_id, f"{key}_trials", summary[key])
        if summary["best"] is not None:
            client.log_metric(run_id, f"best_{s.metric}", float(summary["best"]["value"]))
            client.set_tag(run_id, "kgc.best_trial", str(summary["best"]["trial"]))
        client.set_terminated(run_id, "FINISHED")
