"""The comparison as CSV: ``summary.csv`` (per group), ``curves.csv`` (every point), ``stats.csv``."""
from __future__ import annotations

import csv
import io
import math
from typing import List

from .stages import STAGES
from .summary import LOSS, ArmsReport

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


def _conv_columns() -> List[tuple]:
    cols = []
    for st in STAGES:
        for m in st.headline:
            cols.append((st, m.key, f"{m.key}_reach_{st.x}", f"{m.key}_speedup_percent"))
    cols.append((None, LOSS, "loss_reach_iteration", "loss_speedup_percent"))
    return cols


def format_summary_csv(report: ArmsReport) -> str:
    """One row per (stage, arm, lr scale): final metrics (mean, std), seeds and convergence."""
    metrics = [(st, m) for st in STAGES for m in st.table]
    conv = _conv_columns()
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
                   " ".join("" if s is None else str(s) for s in g.seeds), sr.stage.x, max(g.final_x)]
            for st, m in metrics:
                row += [_num(v) for v in g.final[m.header]] if st is sr.stage else ["", ""]
            for st, key, _, _ in conv:
                ok = st is sr.stage or (st is None and g.lr_scale == sr.scale)
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
                        w.writerow(head + [st.x, xi, m.header, _num(yi)])
                its, raw, sm = r.loss()
                for i, a, b in zip(its.tolist(), raw.tolist(), sm.tolist()):
                    w.writerow(head + ["iteration", i, "total_loss", _num(a)])
                    w.writerow(head + ["iteration", i, "total_loss_smoothed", _num(b)])
    return buf.getvalue()


def format_stats_csv(report: ArmsReport) -> str:
    """One row per stage x arm x metric: spread over seeds and the paired comparison with default."""
    buf, w = _writer()
    w.writerow(["stage", "arm", "lr_scale", "metric", "mean", "std", "n", "seeds", "paired_seeds", "dropped",
                "mean_difference", "ci_low", "ci_high", "method", "verdict"])
    for sr in report.stages:
        for s in sr.stats:
            iv = s.interval
            w.writerow([sr.stage.name, s.arm, f"{s.lr_scale:g}", s.metric, _num(s.mean), _num(s.std), s.n,
                        " ".join(str(k) for k in s.values if k is not None),
                        " ".join(map(str, s.paired_seeds)), "; ".join(s.dropped),
                        _num(s.mean_difference) if s.differences else "",
                        _num(iv.low) if iv else "", _num(iv.high) if iv else "", s.method, s.verdict])
    return buf.getvalue()
