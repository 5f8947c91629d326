"""The detection stage: detectron2 detectors trained and evaluated with an arm (``condinit-train``).

- :mod:`.stage`: :class:`DetectionStage`, the stage the launcher runs (:mod:`condinit_det.launch`);
- :mod:`.config`: loading configs, one run's settings, the checks made before a process starts;
- :mod:`.train`: one run in every process (lazy configs); :mod:`.yacs_trainer`: the yacs path;
- :mod:`.hooks`: the AP hook (``"ap"`` records), the best checkpoint, the requeue checkpoint;
- :mod:`.checkpoint`: atomic, weights-only checkpoints and pretraining checkpoints converted on load;
- :mod:`.arm_report`: which arm each attention site got and where its weights finally came from.

The results file shared with the pretraining stage and the report is :mod:`condinit_det.records.results`.
"""
from .stage import DetectionStage

__all__ = ["DetectionStage"]
