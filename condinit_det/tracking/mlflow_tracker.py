"""MLflow: one MLflow run per training run, in an MLflow experiment per experiment directory.

The default store is a file store ``mlruns/`` beside the experiment directory (in its parent folder, so the
experiments there share it: ``mlflow ui --backend-store-uri <that folder>/mlruns``); no server and no network are
needed. MLflow 3 keeps file stores in maintenance mode and refuses them unless ``MLFLOW_ALLOW_FILE_STORE`` is set:
it is set for this process when the store is a file store; MLflow's usage telemetry is turned off
(``MLFLOW_DISABLE_TELEMETRY``) unless the environment says otherwise. A resumed run continues its MLflow run (the
same run id, set running again); evaluations and scalars are metrics with the iteration or epoch as their step.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional

from .base import FAILED, FINISHED, KILLED, RunInfo, Tracker, attachable_files
from .settings import file_store_path, mlflow_tracking_uri

__all__ = ["MlflowTracker"]

_STATUS = {FINISHED: "FINISHED", FAILED: "FAILED", KILLED: "KILLED"}
_MAX_PARAM_LENGTH = 6000
_BATCH = 1000  # MLflow takes at most this many metrics per batch
_BAD_KEY = re.compile(r"[^\w\-./ :]")


def _key(name: str) -> str:
    """A metric or parameter name MLflow accepts (letters, digits, ``_-./ :``)."""
    return _BAD_KEY.sub("_", str(name))


def _client(uri: str):
    if file_store_path(uri) is not None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another process (a Slurm element) created it first
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _param_value(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        import json

        value = json.dumps(value, sort_keys=True)
    return str(value)[:_MAX_PARAM_LENGTH]


class MlflowTracker(Tracker):
    """An MLflow run (settings: ``tracking_uri``, ``experiment``)."""

    name = "mlflow"

    def __init__(self, settings: Mapping[str, Any]):
        super().__init__(settings)
        self.client, self.run_id = None, None

    def start(self, info: RunInfo, previous: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        uri = mlflow_tracking_uri({"mlflow": {"tracking_uri": self.settings.get("tracking_uri")}},
                                  info.experiment_dir)
        self.client = client = _client(uri)
        name = self.settings.get("experiment") or info.group
        experiment_id = _experiment_id(client, name)
        if previous and previous.get("id") and previous.get("tracking_uri") == uri:
            run = client.get_run(previous["id"])  # raises when the store lost it: then a new run is started
            if run.info.lifecycle_stage == "deleted":
                client.restore_run(run.info.run_id)
            client.update_run(run.info.run_id, status="RUNNING")
        else:
            run = client.create_run(experiment_id, run_name=info.name, tags=info.tags())
        self.run_id = run.info.run_id
        return {"id": self.run_id, "tracking_uri": uri, "experiment": name, "experiment_id": experiment_id}

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new: List[Param] = []
        for key, value in params.items():
            key, value = _key(key), _param_value(value)
            if key not in existing:  # MLflow parameters are set once; a resumed run keeps its first values
                new.append(Param(key, value))
        for start in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int, step_name: str) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), stamp, int(step)) for k, v in metrics.items()]
        for start in range(0, len(batch), _BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start:start + _BATCH])

    def log_files(self, folder: str, name: str) -> None:
        for rel in attachable_files(folder):
            sub = os.path.dirname(rel)
            self.client.log_artifact(self.run_id, os.path.join(folder, rel),
                                     artifact_path=name + ("/" + sub.replace(os.sep, "/") if sub else ""))

    def finish(self, how: str) -> None:
        self.client.set_terminated(self.run_id, status=_STATUS[how])

    @classmethod
    def reopen(cls, entry: Mapping[str, Any], how: str, run_dir: str) -> None:
        client = _client(entry["tracking_uri"])
        if client.get_run(entry["id"]).info.status == "RUNNING":
            client.set_terminated(entry["id"], status=_STATUS[how])
