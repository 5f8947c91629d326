"""Experiment trackers beside TensorBoard, for both stages, offline by default: the ``trackers`` config node
(:mod:`.settings`) and Weights & Biases and MLflow as detectron2 event writers (:mod:`.writers`)."""

from .settings import check_trackers, tracker_settings
from .writers import attach_report, tracker_writers

__all__ = ["attach_report", "check_trackers", "tracker_settings", "tracker_writers"]
