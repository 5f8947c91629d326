"""What a training stage is, below the stages that implement it and the launcher and report that use it.

- :mod:`.descriptor`: :class:`StageDescriptor`, what a stage's runs record and how they are read (name, record
  kinds, unit, headline metrics, step numbering, finished rule), once per stage; :data:`DETECTION`, :data:`PRETRAIN`;
- :mod:`.interface`: :class:`Stage`, the interface a stage implements for the launcher, and the
  :class:`RunOptions` it gets from the command line.
"""
from .descriptor import DETECTION, PRETRAIN, Metric, StageDescriptor, known_stages, register_stage, stage_of
from .interface import ConfigDefaults, RunOptions, Stage

__all__ = ["DETECTION", "PRETRAIN", "ConfigDefaults", "Metric", "RunOptions", "Stage", "StageDescriptor",
           "known_stages", "register_stage", "stage_of"]
