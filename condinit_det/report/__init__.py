"""
Comparison of initialization arms across training runs, for both training stages.

Runs are read from their results files only (no detectron2): ``"cls"`` records of the
classification pretraining and ``"ap"`` records of detection go through the same path. Runs
are grouped by (stage, arm, learning-rate scale) with seeds as replicates; the report gives, per
stage, the paper-layout table, the convergence metric (first x reaching the default arm's final
value and the speed-up), paired statistics against the default arm with a verdict, the
learning-rate sensitivity, and the planned runs that are missing or unfinished.

    from condinit_det.report import compare_arms
    report, markdown = compare_arms(["output/pretrain", "output/finetune"], output_dir="output/report")
"""
from .compare import compare_arms, write_report
from .curves import Curve, first_reach, seed_mean, speedup
from .discovery import ExpectedRun, Missing, Run, find_expected, find_runs, load_run
from .loss import read_training_loss, smooth
from .markdown import format_markdown
from .paired import PairedStat, paired_statistics
from .plots import ARM_COLORS
from .stages import CLASSIFICATION, DETECTION, STAGES, Metric, Stage
from .summary import ARM_ORDER, ArmsReport, ArmSummary, StageReport, summarize_runs
from .tables import format_curves_csv, format_stats_csv, format_summary_csv

__all__ = [
    "ARM_COLORS",
    "ARM_ORDER",
    "CLASSIFICATION",
    "DETECTION",
    "STAGES",
    "ArmSummary",
    "ArmsReport",
    "Curve",
    "ExpectedRun",
    "Metric",
    "Missing",
    "PairedStat",
    "Run",
    "Stage",
    "StageReport",
    "compare_arms",
    "find_expected",
    "find_runs",
    "first_reach",
    "format_curves_csv",
    "format_markdown",
    "format_stats_csv",
    "format_summary_csv",
    "load_run",
    "paired_statistics",
    "read_training_loss",
    "seed_mean",
    "smooth",
    "speedup",
    "summarize_runs",
    "write_report",
]
