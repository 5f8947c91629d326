"""Experiment trackers beside TensorBoard: Weights & Biases and MLflow, for both stages, offline by default.

- :mod:`.settings`: the ``trackers`` node of a config (one switch per tracker), its defaults and the checks made
  before training (a missing package or a bad setting is one error line);
- :mod:`.base`: the trackers' common interface (:class:`Tracker`) and what they are told of a run
  (:class:`RunInfo`);
- :mod:`.runs`: :class:`RunTracking` (one training run's tracker runs, their ids kept in the run directory so that
  a resumed run continues them), :func:`tracked_run` (the launcher opens it in the run's main process) and
  :func:`attach_report` (an experiment's report, attached to a run of its own);
- :mod:`.events`: :class:`TrackerWriter`, the detectron2 event writer both stages add to their writers;
- :mod:`.wandb_tracker`, :mod:`.mlflow_tracker`: the two trackers (their packages are optional extras, imported
  only when enabled).
"""
from .base import RunInfo, Tracker
from .runs import (
    RunTracking,
    active_run,
    attach_report,
    forget_runs,
    mark_unfinished,
    read_state,
    tracked_run,
)
from .settings import DEFAULTS, TRACKERS, check_trackers, enabled_trackers, tracker_settings

__all__ = ["DEFAULTS", "TRACKERS", "RunInfo", "RunTracking", "Tracker", "active_run", "attach_report",
           "check_trackers", "enabled_trackers", "forget_runs", "mark_unfinished", "read_state", "tracked_run",
           "tracker_settings"]
