"""What a training stage is: :class:`StageDescriptor` (what its runs record and how they are read) and the
:class:`Stage` interface the launcher drives (docs/development.md, "Adding a third stage")."""

from .descriptor import DETECTION, PRETRAIN, Metric, StageDescriptor, known_stages, register_stage, stage_of
from .interface import ConfigDefaults, RunOptions, Stage

__all__ = [
    "DETECTION",
    "PRETRAIN",
    "ConfigDefaults",
    "Metric",
    "RunOptions",
    "Stage",
    "StageDescriptor",
    "known_stages",
    "register_stage",
    "stage_of",
]
