"""The trackers (W&B, MLflow) as detectron2 event writers, one tracker run per training run, continued on resume; a
tracker that fails is logged once and dropped, never stopping a training (docs/training.md: experiment trackers)."""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import logging
import os
import re
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Sequence

from detectron2.utils import comm
from detectron2.utils.events import EventWriter, get_event_storage

from ..records.failures import one_line
from ..utils.preemption import Preempted
from .settings import enabled_trackers, mlflow_tracking_uri, tracker_settings

__all__ = [
    "MLFLOW_RUN_ID_TAG",
    "MlflowWriter",
    "TrackerWriter",
    "WandbWriter",
    "attach_report",
    "tracker_run_id",
    "tracker_writers",
]

MLFLOW_RUN_ID_TAG = "condinit_det.run_id"  # the MLflow tag that holds tracker_run_id()
_NOT_IN_MLFLOW_KEYS = re.compile(r"[^\w\-./ :]")  # MLflow's names: letters, digits, _-./ :
logger = logging.getLogger("condinit_det.tracking")


def tracker_run_id(run_dir: str) -> str:
    """The id of ``run_dir``'s tracker runs (16 hex digits) from its absolute path and the number of earlier runs
    ``--retry-failed`` set aside as ``<run_dir>.failed<n>/``: a resumed run or a requeued Slurm element keeps it."""
    path = os.path.abspath(run_dir)
    retried = len(glob.glob(glob.escape(path) + ".failed*"))
    return hashlib.sha1(f"{path}:{retried}".encode()).hexdigest()[:16]


class TrackerWriter(EventWriter):
    """One tracker run as an event writer; subclasses implement ``_open()`` (start or continue the run),
    ``_log(values, step, step_name)``, ``_attach(folder, files)`` and ``_end(how)``.

    Args:
        settings: the tracker's entry of the ``trackers`` node.
        run_dir, experiment_dir: the run's directory (the id comes from it) and its experiment's (the group).
        name, stage: the tracker run's name (``<arm>/seed<k>[-lr<s>]``, or ``report``) and the stage's name.
        params: the run's parameters (a dict value such as ``identity`` becomes ``identity.<key>`` entries).
        step_offset, max_step: the step is the storage's iteration + ``step_offset``, at most ``max_step``.
        exclude: prefixes of scalars left out (pretraining's ``eval/``, sent per epoch with :meth:`log`).
    """

    tracker = ""

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        run_dir: str,
        experiment_dir: str,
        name: str,
        stage: str,
        params: Mapping[str, Any],
        step_offset: int = 0,
        max_step: Optional[int] = None,
        exclude: Sequence[str] = (),
    ):
        self.settings, self.run_dir, self.experiment_dir = settings, run_dir, experiment_dir
        self.name, self.stage, self.run_id = name, stage, tracker_run_id(run_dir)
        self.group = os.path.basename(os.path.abspath(experiment_dir))
        self.params: Dict[str, Any] = {
            "stage": stage,
            "run": name,
            "experiment": os.path.abspath(experiment_dir),
            "run_dir": os.path.abspath(run_dir),
        }
        for key, value in params.items():
            if isinstance(value, Mapping):
                self.params.update({f"{key}.{sub}": v for sub, v in sorted(value.items())})
            elif value is not None:
                self.params[key] = value
        self._offset, self._max, self._exclude = int(step_offset), max_step, tuple(exclude)
        self._last_write = -1  # the last iteration sent, as detectron2's writers keep it
        self.state = "new"  # then "open", and "closed" or "dropped"

    def _send(self, what: str, call, *, ending: bool = False) -> None:
        """Open the tracker run if needed, then ``call()``; a failure drops this tracker for the rest of the run and
        ends its open tracker run as failed, so that it does not stay running in the tracker."""
        if self.state in ("closed", "dropped"):
            return
        try:
            if self.state == "new":
                self._open()
                self.state = "open"
            call()
        except Exception as e:  # noqa: BLE001 -- a tracker never stops a training
            logger.warning(f"{self.tracker}: {what} failed ({one_line(e)}); not tracking the rest of this run")
            if self.state == "open" and not ending:
                with contextlib.suppress(Exception):  # the tracker may be out of reach by now
                    self._end("failed")
            self.state = "dropped"

    def log(self, metrics: Mapping[str, float], *, step: int, step_name: str = "iteration") -> None:
        """Send ``metrics`` at ``step``, counted in ``step_name`` (``"iteration"`` or ``"epoch"``)."""
        self._send("logging metrics", lambda: self._log(dict(metrics), int(step), step_name))

    def write(self) -> None:
        """Send the storage's scalars not sent yet, smoothed as ``metrics.json`` has them, at their iteration."""
        by_iteration: Dict[int, Dict[str, float]] = defaultdict(dict)
        for key, (value, iteration) in get_event_storage().latest_with_smoothing_hint(20).items():
            if iteration > self._last_write and not key.startswith(self._exclude):
                by_iteration[iteration][key] = value
        for iteration in sorted(by_iteration):
            step = iteration + self._offset
            self.log(by_iteration[iteration], step=step if self._max is None else min(step, self._max))
        if by_iteration:
            self._last_write = max(by_iteration)

    def close(self) -> None:
        """End the tracker run: failed when the training is raising, killed when it stops for a requeue or an
        interrupt, else finished."""
        error = sys.exc_info()[1]
        how = "killed" if isinstance(error, (Preempted, KeyboardInterrupt)) else "failed" if error else "finished"
        self._send("ending the tracker run", lambda: self._end(how), ending=True)
        self.state = "closed" if self.state == "open" else self.state


class WandbWriter(TrackerWriter):
    """A W&B run (settings: ``project``, ``entity``, ``mode``, ``group``), its files in ``<run_dir>/wandb/``; metrics
    are plotted against their own step, ``iteration`` or ``epoch``."""

    tracker = "wandb"

    def _open(self):
        import wandb

        settings, tags = self.settings, [tag for tag in (self.stage, self.params.get("arm")) if tag]
        self.run = wandb.init(
            project=settings["project"],
            entity=settings["entity"],
            mode=settings["mode"],
            group=settings["group"] or self.group,
            job_type=self.stage,
            name=self.name,
            tags=tags,
            id=self.run_id,
            resume="allow",
            dir=self.run_dir,
            config=self.params,
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        self.defined = set()

    def _log(self, values, step, step_name):
        for key in values.keys() - self.defined - {"iteration", "epoch"}:  # pretraining logs its fractional epoch
            self.run.define_metric(key, step_metric=step_name)
        self.defined |= values.keys()
        self.run.log({**values, step_name: step})

    def _attach(self, folder, files):
        for name in files:
            self.run.save(os.path.join(folder, name), base_path=folder, policy="now")

    def _end(self, how):
        if how == "killed":
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if how == "finished" else 1)


class MlflowWriter(TrackerWriter):
    """An MLflow run (settings: ``tracking_uri``, ``experiment``) in the experiment named after the experiment
    directory, found again by its tag :data:`MLFLOW_RUN_ID_TAG`; a SQLite store keeps artifacts in ``mlartifacts/``
    beside the database."""

    tracker = "mlflow"

    def _open(self):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # offline unless the environment says otherwise
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = mlflow_tracking_uri(self.settings, self.experiment_dir)
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = self._experiment_id(self.settings["experiment"] or self.group, uri)
        found = self.client.search_runs([experiment_id], f"tags.`{MLFLOW_RUN_ID_TAG}` = '{self.run_id}'")
        if found:
            self.mlflow_run = found[0].info.run_id
            self.client.update_run(self.mlflow_run, status="RUNNING")
            return
        tags = {
            MLFLOW_RUN_ID_TAG: self.run_id,
            "stage": self.stage,
            "experiment": self.group,
            **({"arm": self.params["arm"]} if "arm" in self.params else {}),
        }
        self.mlflow_run = self.client.create_run(experiment_id, run_name=self.name, tags=tags).info.run_id
        params = [Param(_NOT_IN_MLFLOW_KEYS.sub("_", k), str(v)[:6000]) for k, v in self.params.items()]
        self.client.log_batch(self.mlflow_run, params=params)  # once: a resumed run keeps them

    def _experiment_id(self, name: str, uri: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is None:
            database = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""  # else the working directory
            location = os.path.join(os.path.dirname(os.path.abspath(database)), "mlartifacts") if database else None
            try:
                return self.client.create_experiment(name, artifact_location=location)
            except Exception:  # another process (a Slurm element) created it first
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        return found.experiment_id

    def _log(self, values, step, step_name):
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(_NOT_IN_MLFLOW_KEYS.sub("_", k), float(v), stamp, step) for k, v in values.items()]
        self.client.log_batch(self.mlflow_run, metrics=metrics)  # split into MLflow's batches by the client

    def _attach(self, folder, files):
        for name in files:
            self.client.log_artifact(self.mlflow_run, os.path.join(folder, name), artifact_path="report")

    def _end(self, how):
        self.client.set_terminated(self.mlflow_run, status=how.upper())


_WRITERS = {"wandb": WandbWriter, "mlflow": MlflowWriter}


def tracker_writers(cfg, run_dir: str, **options) -> List[TrackerWriter]:
    """The writers of the trackers ``cfg.train.trackers`` enables for the run in ``run_dir``
    (``<experiment>/<arm>/seed<k>...``, which names it); ``[]`` when none is or this is not the main process.
    ``options``: the other :class:`TrackerWriter` keywords (``stage``, ``params``, ...)."""
    settings = tracker_settings(cfg)
    if not comm.is_main_process():
        return []
    experiment_dir = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
    name = os.path.relpath(run_dir, experiment_dir)
    return [
        _WRITERS[tracker](settings[tracker], run_dir=run_dir, experiment_dir=experiment_dir, name=name, **options)
        for tracker in enabled_trackers(settings)
    ]


def attach_report(settings: Optional[Mapping], experiment_dir: str, report_dir: str) -> None:
    """Attach the files of an experiment's ``report_dir`` to a tracker run of its own, ``report``, in the experiment's
    group (again on each write of the report) for each tracker ``settings`` (None: none) enables; a failure is logged,
    never raised."""
    files = sorted(f for f in os.listdir(report_dir) if os.path.isfile(f"{report_dir}/{f}") and f[0] != ".")
    for name in enabled_trackers(settings):
        writer = _WRITERS[name](
            settings[name], run_dir=report_dir, experiment_dir=experiment_dir, name="report", stage="report", params={}
        )
        writer._send("attaching the report", functools.partial(writer._attach, report_dir, files))
        writer.close()
