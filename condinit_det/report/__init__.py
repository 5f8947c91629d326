"""Comparison of initialization arms across training runs of either stage, from their results files only (no
detectron2): every arm against default, contrasts between two other arms and the structure x scale design's effects,
paired by training seed, each interval naming its unit of replication, one family of verdicts per question
(docs/comparing_arms.md, docs/statistics.md)::

    from condinit_det.report import compare_arms
    report, markdown = compare_arms(["output/pretrain", "output/finetune"], output_dir="output/report")
"""

from .compare import compare_arms
from .discovery import find_runs, read_training_loss, smooth
from .paired import DEFAULT_CONTRASTS, Comparison, parse_contrast
from .plots import ARM_COLORS
from .summary import ARM_ORDER, ArmsReport, ArmSummary, StageReport, summarize_runs

__all__ = [
    "ARM_COLORS",
    "ARM_ORDER",
    "DEFAULT_CONTRASTS",
    "ArmSummary",
    "ArmsReport",
    "Comparison",
    "StageReport",
    "compare_arms",
    "find_runs",
    "parse_contrast",
    "read_training_loss",
    "smooth",
    "summarize_runs",
]
