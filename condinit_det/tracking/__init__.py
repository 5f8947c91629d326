"""Experiment trackers beside TensorBoard, for both stages, offline by default: the ``trackers`` config node
(:mod:`.settings`) and Weights & Biases and MLflow as detectron2 event writers (:mod:`.writers`, loaded on first use:
a report job without trackers never imports detectron2)."""

from ..utils.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "settings": ("check_trackers", "enabled_trackers", "tracker_settings"),
        "writers": ("attach_report", "tracker_writers"),
    },
)
