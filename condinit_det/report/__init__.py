"""
Comparison of initialization arms across training runs, for both training stages.

Runs are read from their results files only (no detectron2): ``"cls"`` records of the
classification pretraining and ``"ap"`` records of detection go through the same path, with the
per-image data a run keeps of its evaluations (:mod:`condinit_det.records.per_image`). Runs are
grouped by (stage, arm, learning-rate scale) with seeds as replicates; the report gives, per stage,
the paper-layout table, the convergence metric, paired statistics against the default arm and
planned contrasts between two other arms (each interval naming its unit of replication: training
runs, evaluation images or both; verdicts under Holm–Bonferroni), the probability of improvement,
censoring-aware speed-ups, the seeds each question needs, the learning-rate sensitivity, and the
planned runs that are missing or unfinished. The
statistics' calibration on simulated experiments: ``bench/calibration.py`` and docs/statistics.md.

    from condinit_det.report import compare_arms
    report, markdown = compare_arms(["output/pretrain", "output/finetune"], output_dir="output/report")
"""
from .compare import compare_arms, write_report
from .contrasts import DEFAULT_CONTRASTS, parse_contrast
from .curves import Curve, first_reach, seed_mean, speedup
from .discovery import ExpectedRun, Missing, Run, find_expected, find_runs, load_run
from .improvement import Improvement, probability_of_improvement
from .loss import read_training_loss, smooth
from .markdown import format_markdown
from .multiplicity import holm_adjust
from .paired import PairedStat, paired_statistics
from .planning import SeedPlan, plan_seeds, power, seeds_needed
from .plots import ARM_COLORS
from .speedup import Reach, SpeedupSummary, summarize_reaches
from .statistics import Interval, report_method, t_interval, two_level_bootstrap, verdict
from .summary import ARM_ORDER, ArmsReport, ArmSummary, StageReport, summarize_runs
from .tables import format_curves_csv, format_stats_csv, format_summary_csv

__all__ = [
    "ARM_COLORS",
    "ARM_ORDER",
    "DEFAULT_CONTRASTS",
    "ArmSummary",
    "ArmsReport",
    "Curve",
    "ExpectedRun",
    "Improvement",
    "Interval",
    "Missing",
    "PairedStat",
    "Reach",
    "Run",
    "SeedPlan",
    "SpeedupSummary",
    "StageReport",
    "compare_arms",
    "find_expected",
    "find_runs",
    "first_reach",
    "format_curves_csv",
    "format_markdown",
    "format_stats_csv",
    "format_summary_csv",
    "holm_adjust",
    "load_run",
    "paired_statistics",
    "parse_contrast",
    "plan_seeds",
    "power",
    "probability_of_improvement",
    "read_training_loss",
    "report_method",
    "seed_mean",
    "seeds_needed",
    "smooth",
    "speedup",
    "summarize_reaches",
    "summarize_runs",
    "t_interval",
    "two_level_bootstrap",
    "verdict",
    "write_report",
]
