"""The trackers' common interface: what a training run tells them (:class:`RunInfo`) and what one tracker's run
does (:class:`Tracker`): started or continued for one training run, it takes parameters, metrics with a step and
files, and ends finished, failed or killed. The implementations: :mod:`.wandb_tracker`, :mod:`.mlflow_tracker`;
one training run's tracker runs together: :mod:`.runs`.
"""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from .settings import experiment_name

__all__ = ["FAILED", "FINISHED", "KILLED", "RUNNING", "STATE_FILENAME", "RunInfo", "Tracker", "attachable_files"]

STATE_FILENAME = "trackers.json"  # the tracker runs of a run directory (.runs)
# How a tracker run ends.
FINISHED, FAILED, KILLED = "finished", "failed", "killed"
RUNNING = "running"


@dataclass
class RunInfo:
    """What the trackers are told about one training run (or an experiment's report, ``stage="report"``).

    Attributes:
        name: the run's name, ``<arm>/seed<k>[-lr<s>]`` (``"report"`` for the report).
        run_dir: its directory (W&B's offline files and the tracker ids go there).
        experiment_dir: the experiment directory: the trackers group the runs by it.
        stage: the stage's name (``"detection"``, ``"pretrain"``) or ``"report"``.
        arm, seed, lr_scale, config: the run's arm, training seed, lr multiplier, config file.
        identity: what a resumed run must share with it (the arm report's ``run`` section).
    """

    name: str
    run_dir: str
    experiment_dir: str
    stage: str
    arm: Optional[str] = None
    seed: Optional[int] = None
    lr_scale: Optional[float] = None
    config: Optional[str] = None
    identity: Dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return experiment_name(self.experiment_dir)

    def params(self) -> Dict[str, Any]:
        """The run's parameters: arm, seed, lr scale, stage, config, run, experiment, and its identity."""
        params = {"stage": self.stage, "run": self.name, "experiment": os.path.abspath(self.experiment_dir),
                  "run_dir": os.path.abspath(self.run_dir)}
        for key in ("arm", "seed", "lr_scale", "config"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        params.update({f"identity.{k}": v for k, v in sorted(self.identity.items())})
        return params

    def tags(self) -> Dict[str, str]:
        tags = {"stage": self.stage, "experiment": self.group}
        if self.arm is not None:
            tags["arm"] = self.arm
        return tags


def attachable_files(folder: str) -> List[str]:
    """The files under ``folder`` a tracker attaches (relative paths, sorted): not the trackers' own files
    (``trackers.json``, W&B's ``wandb/``), hidden or temporary files."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (root == folder and d == "wandb"))
        for name in sorted(files):
            if name.startswith(".") or name.endswith(".tmp") or (root == folder and name == STATE_FILENAME):
                continue
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return found


class Tracker(abc.ABC):
    """One tracker's run of one training run. Subclasses set :attr:`name` and implement the methods; the
    settings are the tracker's entry of the ``trackers`` node."""

    name: str = ""

    def __init__(self, settings: Mapping[str, Any]):
        self.settings = dict(settings)

    @abc.abstractmethod
    def start(self, info: RunInfo, previous: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """Start the tracker run of ``info``, or continue ``previous`` (what an earlier :meth:`start` returned,
        read back from the run directory). Returns what must be kept to continue it: its ``"id"`` and whatever
        else :meth:`reopen` needs."""

    @abc.abstractmethod
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Parameters of the run (a value already set is kept)."""

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int, step_name: str) -> None:
        """Scalars at ``step``, counted in ``step_name`` (``"iteration"`` or ``"epoch"``)."""

    @abc.abstractmethod
    def log_files(self, folder: str, name: str) -> None:
        """Attach the files under ``folder`` to the run, under ``name``."""

    @abc.abstractmethod
    def finish(self, how: str) -> None:
        """End the run: ``"finished"``, ``"failed"`` or ``"killed"`` (stopped, e.g. for a requeue)."""

    @classmethod
    def reopen(cls, entry: Mapping[str, Any], how: str, run_dir: str) -> None:
        """Mark the recorded run ``entry`` as ended ``how`` from another process (its own process died before it
        could); the default does nothing."""
        return None
