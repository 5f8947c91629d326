"""Entry point: find the runs, compare them and write the report's files: ``report.md`` (:mod:`.markdown`), the
figures (:mod:`.plots`) and the two CSV tables, ``summary.csv`` (per arm group) and ``stats.csv`` (every comparison),
whose ``setup`` column names the section when one stage has several setups."""

from __future__ import annotations

import csv
import io
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

from condinit_det.stage import known_stages
from condinit_det.utils.fileio import atomic_write

from .discovery import find_runs
from .markdown import format_markdown
from .plots import write_figures
from .summary import LOSS, ArmsReport, report_stages, summarize_runs

CACHE_DIR = ".cache"  # in the output folder: image resamples and the figures' record, reused while their inputs hold
_STATS = [
    "stage",
    "arm",
    "lr_scale",
    "kind",
    "metric",
    "reference",
    "mean",
    "std",
    "n",
    "seeds",
    "paired_seeds",
    "dropped",
    "mean_difference",
    "ci_low",
    "ci_high",
    "method",
    "replication",
    "unit",
    "p_value",
    "family",
    "family_size",
    "level",
    "adjusted_low",
    "adjusted_high",
    "p_adjusted",
    "verdict",
    "t_low",
    "t_high",
    "percentile_low",
    "percentile_high",
    "poi",
    "poi_boot_low",
    "poi_boot_high",
    "poi_exact_low",
    "poi_exact_high",
    "plan_delta",
    "plan_std",
    "plan_seeds_needed",
    "speedup_reached",
    "speedup_estimate",
    "speedup_estimate_below",
    "speedup_low",
    "speedup_low_below",
    "speedup_high",
    "speedup_high_below",
    "speedup_coverage",
    "note",
    "setup",
]


def _cell(v) -> str:
    """Floats in full precision (empty when not finite), None empty."""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return "" if v is None else str(v)


def _csv(header: List[str], rows: List[Dict[str, object]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, header, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def format_summary_csv(report: ArmsReport) -> str:
    """One row per (section, arm, lr scale): final metrics (mean, std), seeds and the convergence metric. The columns
    are those of every registered stage (a fixed header), then those of any other stage in the report."""
    stages = report_stages(list(known_stages()) + [sr.stage for sr in report.stages])
    header = ["stage", "arm", "lr_scale", "main", "num_seeds", "seeds", "x_axis", "final_x"]
    header += [h for st in stages for m in st.table for h in (m.header, m.header + "_std")]
    header += [
        c for st in stages for m in st.headline for c in (f"{m.key}_reach_{st.unit}", f"{m.key}_speedup_percent")
    ]
    header += ["loss_reach_iteration", "loss_speedup_percent", "setup"]
    rows = []
    for sr in report.stages:
        st = sr.stage
        for g in sr.groups:
            row = {
                "stage": st.name,
                "arm": g.arm,
                "lr_scale": f"{g.lr_scale:g}",
                "main": int(g.lr_scale == sr.scale),
                "num_seeds": len(g.runs),
                "seeds": " ".join("" if s is None else str(s) for s in g.seeds),
                "x_axis": st.unit,
                "final_x": max(g.final_iterations),
                "setup": sr.label,
            }
            for m in st.table:
                row[m.header], row[m.header + "_std"] = g.final[m.header]
            for key, x_axis in [(m.key, st.unit) for m in st.headline] + [(LOSS, "iteration")]:  # main scale only
                row[f"{key}_reach_{x_axis}"], row[f"{key}_speedup_percent"] = g.reach.get(key), g.speedup.get(key)
            rows.append(row)
    return _csv(header, rows)


def format_stats_csv(report: ArmsReport) -> str:
    """stats.csv: one row per section x comparison x metric, ``arm`` minus ``reference`` (default, B of a contrast, or
    ``factorial`` for an effect of the structure x scale design): headline metrics, then speed-ups (their columns:
    docs/comparing_arms.md, "The other files")."""
    rows = []
    for sr in report.stages:
        for s in sr.stats:
            row = {
                "stage": sr.stage.name,
                "arm": s.arm,
                "lr_scale": f"{s.lr_scale:g}",
                "kind": s.kind,
                "metric": s.metric,
                "reference": s.reference,
                "mean": s.mean,
                "std": s.std,
                "n": s.n,
                "seeds": " ".join(str(k) for k in s.values),
                "paired_seeds": " ".join(map(str, s.paired_seeds)),
                "dropped": "; ".join(s.dropped),
                "mean_difference": s.mean_difference if s.differences else None,
                "method": s.method,
                "family": s.family,
                "family_size": s.family_size or None,
                "level": s.level if s.family_size else None,
                "p_adjusted": s.p_adjusted,
                "verdict": s.verdict,
                "note": s.note,
                "setup": sr.label,
            }
            for prefix, iv in (("ci", s.interval), ("adjusted", s.adjusted), ("t", s.t), ("percentile", s.percentile)):
                if iv is not None:
                    row.update({f"{prefix}_low": iv.low, f"{prefix}_high": iv.high})
            if s.interval is not None:
                row.update(replication=s.interval.replication, unit=s.interval.unit, p_value=s.interval.p_value)
            if s.improvement is not None:
                row["poi"] = float(s.improvement.estimate)
                row.update(
                    {
                        f"poi_{k}": float(getattr(s.improvement, k))
                        for k in ("boot_low", "boot_high", "exact_low", "exact_high")
                    }
                )
            if s.plan is not None:
                row.update(plan_delta=s.plan.delta, plan_std=s.plan.std, plan_seeds_needed=s.plan.needed)
            if s.speedup is not None:
                row.update(speedup_reached=s.speedup.reached, speedup_coverage=s.speedup.coverage)
                for name in ("estimate", "low", "high"):
                    reach = getattr(s.speedup, name)
                    if reach is not None:  # a censored seed's speed-up is the bound it lies below
                        row[f"speedup_{name}"], row[f"speedup_{name}_below"] = reach.speedup, int(reach.censored)
            rows.append(row)
    return _csv(_STATS, rows)


def compare_arms(
    paths: Sequence[str],
    output_dir: Optional[str] = None,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    delta=None,
    std=None,
    contrasts: Sequence[Tuple[str, str]] = (),
    group_by_config: bool = False,
) -> Tuple[ArmsReport, str]:
    """Compare the arms of the runs under ``paths`` (run or experiment directories); with ``output_dir``, write
    ``report.md``, ``summary.csv``, ``stats.csv`` and the figures there. Returns the report and its Markdown;
    ``report.skipped`` names the files that could not be read (docs/comparing_arms.md).

    Args:
        bootstrap: image resamples B (0: intervals over seeds only); ``seed``: of the resampling generators.
        delta, std: the difference the seed plans are for and the std of the per-seed paired differences they
            assume: a number, or metric key (``"bbox"``) -> number; default: the paper's gain, the measured std.
        contrasts: (A, B) arm pairs compared as A minus B, beside conditioned vs scale_matched / structured /
            mimetic.
        group_by_config: one section per setup of a stage, instead of a ValueError naming the keys that differ.
    """
    found = find_runs(paths)
    cache_dir = None if output_dir is None else os.path.join(output_dir, CACHE_DIR)
    report = summarize_runs(
        found.runs,
        found.expected,
        bootstrap=bootstrap,
        seed=seed,
        delta=delta,
        std=std,
        contrasts=contrasts,
        group_by_config=group_by_config,
        skipped=found.skipped,
        cache_dir=cache_dir,
    )
    if output_dir is None:
        return report, format_markdown(report)
    os.makedirs(output_dir, exist_ok=True)
    tables = {"summary.csv": format_summary_csv(report), "stats.csv": format_stats_csv(report)}
    markdown = format_markdown(
        report, write_figures(report, output_dir, inputs="".join(tables.values()), cache_dir=cache_dir)
    )
    for name, text in {"report.md": markdown, **tables}.items():
        atomic_write(os.path.join(output_dir, name), text)
    return report, markdown
