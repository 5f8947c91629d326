"""The detection stage: detectron2 detectors trained and evaluated with an arm (``condinit-train``).

:mod:`.stage` (the launcher's :class:`DetectionStage`), :mod:`.config` (configs, one run's settings, the checks),
:mod:`.yacs` (yacs configs made lazy), :mod:`.train` (one run in every process, its arm report), :mod:`.hooks` (AP
records, best and requeue checkpoints, the ETA), :mod:`.checkpoint`.
"""

from .stage import DetectionStage

__all__ = ["DetectionStage"]
