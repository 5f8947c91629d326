"""The comparison as CSV: ``summary.csv`` (per group), ``curves.csv`` (every point), ``stats.csv``."""
from __future__ import annotations

import csv
import io
import math
from typing import List

from condinit_det.stage import known_stages

from .summary import LOSS, ArmsReport, report_stages

__all__ = ["format_curves_csv", "format_stats_csv", "format_summary_csv"]


def _num(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return str(v)


def _writer():
    buf = io.StringIO()
    return buf, csv.writer(buf, lineterminator="\n")


def _stages(report: ArmsReport) -> list:
    """The columns' stages: every registered one (a fixed header), then any other in the report."""
    return report_stages(list(known_stages()) + [sr.stage for sr in report.stages])


def _conv_columns(report: ArmsReport) -> List[tuple]:
    cols = []
    for st in _stages(report):
        for m in st.headline:
            cols.append((st, m.key, f"{m.key}_reach_{st.unit}", f"{m.key}_speedup_percent"))
    cols.append((None, LOSS, "loss_reach_iteration", "loss_speedup_percent"))
    return cols


def format_summary_csv(report: ArmsReport) -> str:
    """One row per (stage, arm, lr scale): final metrics (mean, std), seeds and convergence."""
    metrics = [(st, m) for st in _stages(report) for m in st.table]
    conv = _conv_columns(report)
    buf, w = _writer()
    header = ["stage", "arm", "lr_scale", "main", "num_seeds", "seeds", "x_axis", "final_x"]
    for _, m in metrics:
        header += [m.header, m.header + "_std"]
    for _, _, reach, sp in conv:
        header += [reach, sp]
    w.writerow(header)
    for sr in report.stages:
        for g in sr.groups:
            row = [sr.stage.name, g.arm, f"{g.lr_scale:g}", int(g.lr_scale == sr.scale), len(g.runs),
                   " ".join("" if s is None else str(s) for s in g.seeds), sr.stage.unit, max(g.final_x)]
            for st, m in metrics:
                row += [_num(v) for v in g.final[m.header]] if st.name == sr.stage.name else ["", ""]
            for st, key, _, _ in conv:
                ok = (st is not None and st.name == sr.stage.name) or (st is None and g.lr_scale == sr.scale)
                row += [_num(g.reach.get(key)), _num(g.speedup.get(key))] if ok else ["", ""]
            w.writerow(row)
    return buf.getvalue()


def format_curves_csv(report: ArmsReport) -> str:
    """Long format: every evaluated point of every run, and its logged and smoothed training loss."""
    buf, w = _writer()
    w.writerow(["stage", "arm", "lr_scale", "seed", "run", "x_axis", "x", "metric", "value"])
    for sr in report.stages:
        st = sr.stage
        for g in sr.groups:
            for r in g.runs:
                head = [st.name, g.arm, f"{g.lr_scale:g}", "" if r.seed is None else r.seed, r.path]
                for m in st.table:
                    x, y = r.curve(m)
                    for xi, yi in zip(x.tolist(), y.tolist()):
                        w.writerow(head + [st.unit, xi, m.header, _num(yi)])
                its, raw, sm = r.loss()
                for i, a, b in zip(its.tolist(), raw.tolist(), sm.tolist()):
                    w.writerow(head + ["iteration", i, "total_loss", _num(a)])
                    w.writerow(head + ["iteration", i, "total_loss_smoothed", _num(b)])
    return buf.getvalue()


def _bound_cells(b) -> List[str]:
    return ["", ""] if b is None else [_num(b.value), "1" if b.below else "0"]


def format_stats_csv(report: ArmsReport) -> str:
    """
    One row per stage x arm x metric (headline metrics, then speed-ups): spread over seeds and the paired
    comparison with ``reference``: default, or for a contrast between two arms the other one (the row is arm
    minus reference, its speed-up to the reference's final value). Headline rows: the verdict's interval, its
    unit (``replication``: runs / images / both), p-values (raw and Holm over the stage's family, contrasts
    included), the t-interval over seeds and the two-level percentile interval beside it, P(arm > reference)
    with both intervals, the seed plan. Speed-up rows: seeds reached, estimate and interval (``*_below`` = 1: a
    censored bound, the value lies below it), coverage.
    """
    buf, w = _writer()
    w.writerow(["stage", "arm", "lr_scale", "kind", "metric", "reference", "mean", "std", "n", "seeds",
                "paired_seeds", "dropped", "mean_difference", "ci_low", "ci_high", "method", "replication", "unit",
                "p_value", "p_holm",
                "in_family", "verdict", "t_low", "t_high", "percentile_low", "percentile_high", "poi",
                "poi_boot_low", "poi_boot_high", "poi_exact_low", "poi_exact_high", "plan_delta", "plan_std",
                "plan_seeds_needed", "speedup_reached", "speedup_estimate", "speedup_estimate_below",
                "speedup_low", "speedup_low_below", "speedup_high", "speedup_high_below", "speedup_coverage",
                "note"])
    for sr in report.stages:
        for s in sr.stats:
            iv = s.interval
            others = {("t" if "t-interval" in o.method else "percentile"): o for o in s.others}
            if iv is not None and "t-interval" in iv.method:
                others["t"] = iv
            t, pct, imp, plan, sp = others.get("t"), others.get("percentile"), s.improvement, s.plan, s.speedup
            w.writerow([sr.stage.name, s.arm, f"{s.lr_scale:g}", s.kind, s.metric, s.reference, _num(s.mean),
                        _num(s.std), s.n,
                        " ".join(str(k) for k in s.values if k is not None),
                        " ".join(map(str, s.paired_seeds)), "; ".join(s.dropped),
                        _num(s.mean_difference) if s.differences else "",
                        _num(iv.low) if iv else "", _num(iv.high) if iv else "", s.method,
                        iv.replication if iv else "", iv.unit if iv else "", _num(iv.p_value) if iv else "",
                        _num(s.p_holm), int(s.in_family), s.verdict,
                        _num(t.low) if t else "", _num(t.high) if t else "",
                        _num(pct.low) if pct else "", _num(pct.high) if pct else "",
                        *([_num(imp.estimate), _num(imp.boot_low), _num(imp.boot_high), _num(imp.exact_low),
                           _num(imp.exact_high)] if imp else [""] * 5),
                        *([_num(plan.delta), _num(plan.std), _num(plan.needed)] if plan else [""] * 3),
                        *([sp.reached, *_bound_cells(sp.estimate), *_bound_cells(sp.low), *_bound_cells(sp.high),
                           _num(sp.coverage)] if sp else [""] * 8),
                        s.note])
    return buf.getvalue()
