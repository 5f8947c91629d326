"""Entry points: find the runs, summarize them and write the report files."""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

from condinit_det.utils.fileio import atomic_write

from .discovery import find_expected, find_runs
from .markdown import format_markdown
from .plots import plot_stage
from .summary import ArmsReport, summarize_runs
from .tables import format_curves_csv, format_stats_csv, format_summary_csv

__all__ = ["compare_arms", "write_report"]


def write_report(report: ArmsReport, output_dir: str) -> Dict[str, str]:
    """
    Write ``report.md``, ``summary.csv``, ``curves.csv``, ``stats.csv`` and every stage's plots
    into ``output_dir``. Returns file name -> path.
    """
    os.makedirs(output_dir, exist_ok=True)
    texts = {
        "report.md": format_markdown(report),
        "summary.csv": format_summary_csv(report),
        "curves.csv": format_curves_csv(report),
        "stats.csv": format_stats_csv(report),
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = os.path.join(output_dir, name)
        atomic_write(paths[name], text)
    for sr in report.stages:
        if sr.groups or sr.failed:
            paths.update(plot_stage(sr, output_dir))
    return paths


def compare_arms(paths: Sequence[str], output_dir: Optional[str] = None, *, bootstrap: int = 1000,
                 seed: int = 0, delta: Union[None, float, Mapping[str, float]] = None,
                 std: Union[None, float, Mapping[str, float]] = None,
                 contrasts: Sequence[Tuple[str, str]] = ()) -> Tuple[ArmsReport, str]:
    """
    Find runs (and experiment plans) under ``paths``, compare the arms and, with ``output_dir``,
    write the report files. Returns the report and its Markdown text.

    Args:
        bootstrap: image resamples B of the one-seed image bootstrap and of the two-level bootstrap (0: off:
            intervals over seeds only).
        seed: seed of the resampling generators.
        delta: the difference the seed plans are for (a number, or metric key such as "bbox" -> number);
            default: the paper's claimed gain (AP^b 0.6, AP^m 0.5), else the observed difference.
        std: the std of the per-seed paired differences the seed plans assume (same forms); default: the
            observed one.
        contrasts: (A, B) pairs of arms other than default to compare directly (A minus B, paired by seed, in
            the same Holm family), beside the default contrasts: conditioned vs scale_matched and conditioned vs
            mimetic wherever both ran (:mod:`condinit_det.report.contrasts`).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs = find_runs(paths)
    report = summarize_runs(runs, find_expected(paths), bootstrap=bootstrap, seed=seed, delta=delta, std=std,
                            contrasts=contrasts)
    if output_dir is not None:
        write_report(report, output_dir)
    return report, format_markdown(report)
