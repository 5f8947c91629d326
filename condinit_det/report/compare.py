"""Entry points: find the runs, summarize them and write the report files."""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Tuple

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
                 seed: int = 0) -> Tuple[ArmsReport, str]:
    """
    Find runs (and experiment plans) under ``paths``, compare the arms and, with ``output_dir``,
    write the report files. ``bootstrap``: resamples of the one-seed paired bootstrap (0: off);
    ``seed``: its generator seed. Returns the report and its Markdown text.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs = find_runs(paths)
    report = summarize_runs(runs, find_expected(paths), bootstrap=bootstrap, seed=seed)
    if output_dir is not None:
        write_report(report, output_dir)
    return report, format_markdown(report)
