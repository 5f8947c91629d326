"""Experiment trackers beside TensorBoard, for both stages, offline by default: the ``trackers`` config node
(:mod:`.settings`) and Weights & Biases and MLflow as detectron2 event writers (:mod:`.writers`)."""

from .settings import DEFAULTS, check_trackers, enabled_trackers, tracker_settings
from .writers import TrackerWriter, attach_report, tracker_run_id, tracker_writers

__all__ = [
    "DEFAULTS",
    "TrackerWriter",
    "attach_report",
    "check_trackers",
    "enabled_trackers",
    "tracker_run_id",
    "tracker_settings",
    "tracker_writers",
]
