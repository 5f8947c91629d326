"""The comparison as Markdown: per stage the paper-layout table, convergence, paired statistics,
learning-rate sensitivity and missing runs; then the runs and the method."""
from __future__ import annotations

import io
import math
from typing import List, Optional

from condinit_det.report.statistics import NOT_DISTINGUISHABLE

from .loss import SMOOTHING_WINDOW
from .summary import LOSS, ArmsReport, StageReport, arm_sort_key
from .stages import DETECTION

__all__ = ["format_markdown"]


def fmt_value(mean: float, std: float = float("nan"), n: int = 1, digits: int = 1) -> str:
    """``"41.0 ± 1.4"`` (several seeds), ``"30.0"`` (one), ``"n/a"`` (undefined)."""
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 and math.isfinite(std) else f"{mean:.{digits}f}"


def _signed(v: float, digits: int = 1) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:+.{digits}f}"


def _scale(s: float) -> str:
    return f"{s:g}"


def _table(out: io.StringIO, header: List[str], rows: List[List[str]], align: Optional[str] = None) -> None:
    """A Markdown table; ``align`` has one letter per column, "l" or "r" (default: text first column, numbers after)."""
    align = align or "l" + "r" * (len(header) - 1)
    out.write("| " + " | ".join(header) + " |\n")
    out.write("|" + "|".join("---" if a == "l" else "---:" for a in align) + "|\n")
    for r in rows:
        out.write("| " + " | ".join(r) + " |\n")
    out.write("\n")


def _seeds(seeds) -> str:
    return ",".join("?" if s is None else str(s) for s in seeds)


def _span(xs: List[int]) -> str:
    xs = sorted(set(xs))
    return str(xs[0]) if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"


def _main_table(out, sr: StageReport) -> None:
    st = sr.stage
    multi = any(len(g.runs) > 1 for g in sr.arms)
    out.write(f"Final-{st.x} {', '.join(m.header for m in st.table)} (%)"
              + (", mean ± sample std over seeds" if multi else "")
              + f", learning-rate scale {_scale(sr.scale)}"
              + (" (no runs at the config's learning rate)" if sr.scale != 1.0 else "") + ".\n\n")
    header = ["arm"] + [m.header for m in st.table] + ["seeds", "final iter" if st is DETECTION else f"final {st.x}"]
    rows = []
    for arm in _arms_shown(sr):
        groups = [g for g in sr.arms if g.arm == arm]
        for g in groups:
            rows.append([g.arm] + [fmt_value(*g.final[m.header], len(g.runs)) for m in st.table]
                        + [_seeds(g.seeds), _span(g.final_x)])
        rows += _failed_rows(sr.failed_at(arm, sr.scale), len(st.table))
    _table(out, header, rows)


def _arms_shown(sr: StageReport, scale: Optional[float] = None) -> List[str]:
    """Arms with finished or failed runs at ``scale`` (default: the main comparison's), in arm order."""
    scale = sr.scale if scale is None else scale
    arms = {g.arm for g in sr.groups if g.lr_scale == scale} | {m.arm for m in sr.failed if m.lr_scale == scale}
    return sorted(arms, key=arm_sort_key)


def _failed_rows(failed, width: int) -> List[List[str]]:
    """One table row per failed run: what became of it where its values would be, never a number."""
    return [[m.arm, m.reason] + [""] * (width - 1) + [_seeds([m.seed]), ""] for m in failed]


def _convergence(out, sr: StageReport) -> None:
    st = sr.stage
    out.write("### Convergence\n\n")
    if not sr.target:
        out.write("No runs of the default arm: the speed-up needs one as the reference.\n\n")
        return
    out.write(f"First {st.x} at which an arm's seed-mean curve reaches the default arm's final value, and the "
              f"speed-up (1 - {st.x} / {st.x}_default_final) x 100 %. LOSS: first iteration at which the "
              "smoothed training loss falls to or below the default arm's final smoothed loss.\n\n")
    arms = _arms_shown(sr)
    groups = {g.arm: g for g in sr.arms}

    def cell(arm, key, loss=False):
        g = groups.get(arm)
        if g is None:  # every run of the arm stopped early
            return "diverged" if any(m.failure.get("reason") == "diverged" for m in sr.failed_at(arm, sr.scale)) \
                else "failed"
        if loss and g.loss is None:
            return "no loss logged"
        return _reach_cell(g.reach.get(key), g.speedup.get(key))

    rows = []
    for m in st.headline:
        x_final, value = sr.target[m.key]
        if x_final is None or not math.isfinite(value):
            continue
        rows.append([m.header, f"{value:.1f} at {st.x} {x_final}"] + [cell(a, m.key) for a in arms])
    x_final, value = sr.target.get(LOSS, (None, float("nan")))
    if x_final is not None:
        rows.append(["LOSS", f"{value:.4g} at iteration {x_final}"] + [cell(a, LOSS, loss=True) for a in arms])
    _table(out, ["metric", "default final"] + arms, rows)
    if x_final is None:
        out.write("LOSS: no training loss logged (metrics.json) for the default arm.\n\n")


def _reach_cell(reached, speedup) -> str:
    if reached is None:
        return "not reached"
    return f"{reached}" if speedup is None else f"{reached} ({speedup:.1f}%)"


def _stats(out, sr: StageReport) -> None:
    out.write("### Paired statistics\n\n")
    if not sr.stats:
        out.write("No runs to compare.\n\n")
        return
    if not sr.target:
        out.write("No runs of the default arm: nothing to pair with; mean ± std over seeds only.\n\n")
    else:
        out.write("Arm minus default, paired by training seed (same data order and non-attention weights); "
                  "speed-ups are per seed against the same seed's default run.\n\n")
    rows = []
    for s in sr.stats:
        iv = s.interval
        rows.append([s.arm, s.metric, fmt_value(s.mean, s.std, s.n), str(s.n),
                     _signed(s.mean_difference) if s.differences else "",
                     f"[{iv.low:+.1f}, {iv.high:+.1f}]" if iv is not None else "", s.method])
    _table(out, ["arm", "metric", "mean ± std", "n", "Δ vs default", "95% interval", "method"], rows, align="llrrrrl")
    lines = [s for s in sr.stats if s.verdict not in ("reference", "")]
    for s in lines:
        iv = s.interval
        if iv is not None:
            out.write(f"- {s.arm}, {s.metric}: {s.verdict} (Δ {_signed(s.mean_difference)}, "
                      f"95% interval [{iv.low:+.1f}, {iv.high:+.1f}])\n")
        else:
            out.write(f"- {s.arm}, {s.metric}: no verdict ({s.method})\n")
    dropped = {}
    for s in sr.stats:
        if s.dropped:
            dropped.setdefault(s.arm, s.dropped)
    for arm, d in dropped.items():
        out.write(f"- {arm}: dropped from the pairing: {', '.join(d)}\n")
    unpaired = [a for a in _arms_shown(sr) if a not in {g.arm for g in sr.arms}]
    for arm in unpaired:
        out.write(f"- {arm}: no finished run to pair: "
                  + ", ".join(f"seed {m.seed} {m.reason}" for m in sr.failed_at(arm, sr.scale)) + "\n")
    if lines or dropped or unpaired:
        out.write("\n")


def _lr(out, sr: StageReport) -> None:
    if len(sr.scales) < 2:
        return
    st = sr.stage
    heads = [m.header for m in st.headline]
    first = st.headline[0].header
    out.write("### Learning-rate sensitivity\n\n")
    out.write(f"Final {', '.join(heads)} (%) per learning-rate scale (multiplier of the config's learning rate), "
              f"mean over seeds; the best scale is the one with the highest {first}.\n\n")
    arms = sorted({g.arm for g in sr.groups} | {m.arm for m in sr.failed}, key=arm_sort_key)
    for arm in arms:
        out.write(f"**{arm}**\n\n")
        rows = []
        for scale in sr.scales:
            rows += [[_scale(g.lr_scale)] + [fmt_value(*g.final[h], len(g.runs)) for h in heads] + [_seeds(g.seeds)]
                     for g in sr.groups if g.arm == arm and g.lr_scale == scale]
            rows += [[_scale(scale), m.reason] + [""] * (len(heads) - 1) + [_seeds([m.seed])]
                     for m in sr.failed_at(arm, scale)]
        _table(out, ["lr scale"] + heads + ["seeds"], rows)
    shared = [g for g in sr.groups if g.lr_scale == 1.0]
    if shared:
        out.write("At the shared learning rate (scale 1):\n\n")
        _table(out, ["arm"] + heads, [[g.arm] + [fmt_value(*g.final[h], len(g.runs)) for h in heads] for g in shared])
    else:
        out.write("No runs at the shared learning rate (scale 1).\n\n")
    out.write(f"Each arm at its own best scale (by {first}):\n\n")
    rows = []
    for arm in arms:
        best = sr.best_scale(arm)
        if best is None:
            rows.append([arm, "n/a"] + ["n/a"] * len(heads))
            continue
        g = sr.arm(arm, best)
        rows.append([arm, _scale(best)] + [fmt_value(*g.final[h], len(g.runs)) for h in heads])
    _table(out, ["arm", "best scale"] + heads, rows)


def _missing(out, sr: StageReport) -> None:
    out.write("### Missing or unfinished runs\n\n")
    if sr.missing:
        out.write("Not in the tables or the statistics:\n\n")
        for m in sr.missing:
            out.write(f"- {m.describe()} — {m.path}\n")
        out.write("\n")
    elif sr.has_plan:
        out.write("None: every planned run has finished.\n\n")
    else:
        out.write("None found (no experiment plan: only the runs present were checked).\n\n")


def _runs(out, report: ArmsReport) -> None:
    out.write("## Runs\n\n")
    for sr in report.stages:
        for g in sr.groups:
            for r in g.runs:
                out.write(f"- {sr.stage.name}: {r.name}, final {sr.stage.x} {r.final_x} — {r.path}\n")
    other = [m for m in report.missing if m.stage is None]
    for m in other:
        out.write(f"- {m.describe()} — {m.path}\n")
    out.write("\n")


def _method(out, report: ArmsReport) -> None:
    out.write("## Method\n\n")
    out.write(
        "- Tables: value at the final evaluation; mean ± sample standard deviation (ddof=1) over seeds. "
        "Only runs at the main learning-rate scale enter the tables, curves and statistics; the scan is in "
        "the learning-rate table.\n"
        "- Curves: seed mean at the evaluations every seed has; the band is ± one sample std.\n"
        f"- Training loss: detectron2's logged total_loss (itself a median over the last 20 iterations), "
        f"smoothed by a trailing median over {SMOOTHING_WINDOW} logged points (as HistoryBuffer.median"
        f"({SMOOTHING_WINDOW})); raw points are drawn faint. A resumed run's later lines replace the earlier "
        "ones from the restart on.\n"
        "- Convergence: first evaluation at which the seed-mean curve reaches the default arm's final value; "
        "speed-up (1 - x / x_default_final) x 100 %.\n"
        "- Paired statistics: a run and the default run with the same training seed share data order and every "
        "non-attention weight; differences are arm minus default per seed, over the seeds both ran (others "
        "are dropped and named). Two or more paired seeds: 95% Student t-interval of the mean difference "
        "(n - 1 degrees of freedom). One paired seed: "
        + (f"paired bootstrap over evaluation images (B = {report.bootstrap} resamples of the images, drawn with "
           "replacement, the same resample for both arms, a repeated image counted each time; detection "
           "matches each run's predictions once with COCO and accumulates box / mask AP over each resample's "
           "images with their multiplicities, which equals re-evaluating COCO on the resampled images; "
           "classification resamples per-image correctness), "
           f"percentile interval, generator seed {report.seed}; convergence numbers get no interval (resampling them "
           "needs every evaluation's predictions, and runs keep the final evaluation's only)"
           if report.bootstrap > 0 else "no interval (bootstrap off)")
        + ". Verdict: better / worse than default when the interval excludes 0, else "
        f"\"{NOT_DISTINGUISHABLE}\".\n"
    )


def format_markdown(report: ArmsReport) -> str:
    """The comparison of every stage as one Markdown document."""
    out = io.StringIO()
    out.write("# Initialization arms\n\n")
    out.write("Stages: " + "; ".join(
        f"{sr.stage.name} ({sum(len(g.runs) for g in sr.groups)} finished runs)" for sr in report.stages) + ".\n\n")
    for sr in report.stages:
        out.write(f"## {sr.stage.title}\n\n")
        if sr.groups:
            _main_table(out, sr)
            _convergence(out, sr)
            _stats(out, sr)
            _lr(out, sr)
        else:
            out.write("No finished runs.\n\n")
        _missing(out, sr)
    _runs(out, report)
    _method(out, report)
    return out.getvalue()
