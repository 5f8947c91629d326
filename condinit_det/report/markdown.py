"""The comparison as Markdown: per stage the paper-layout table, convergence, paired statistics,
learning-rate sensitivity and missing runs; then the runs and the method."""
from __future__ import annotations

import io
import math
from typing import List, Optional

from tabulate import tabulate

from .contrasts import contrast_meaning
from .loss import SMOOTHING_WINDOW
from .paired import ALPHA, METRIC, SPEEDUP, PairedStat
from .speedup import Bound
from .statistics import IMAGES
from .summary import LOSS, ArmsReport, StageReport, arm_sort_key

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
    out.write(tabulate(rows, header, tablefmt="pipe", disable_numparse=True,
                       colalign=["left" if a == "l" else "right" for a in align]) + "\n\n")


def _seeds(seeds) -> str:
    return ",".join("?" if s is None else str(s) for s in seeds)


def _span(xs: List[int]) -> str:
    xs = sorted(set(xs))
    return str(xs[0]) if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"


def _main_table(out, sr: StageReport) -> None:
    st = sr.stage
    multi = any(len(g.runs) > 1 for g in sr.arms)
    out.write(f"Final-{st.unit} {', '.join(m.header for m in st.table)} (%)"
              + (", mean ± sample std over seeds" if multi else "")
              + f", learning-rate scale {_scale(sr.scale)}"
              + (" (no runs at the config's learning rate)" if sr.scale != 1.0 else "") + ".\n\n")
    final = "final iter" if st.unit == "iteration" else f"final {st.unit}"
    header = ["arm"] + [m.header for m in st.table] + ["seeds", final]
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
    out.write(f"First {st.unit} at which an arm's seed-mean curve reaches the default arm's final value, and the "
              f"speed-up (1 - {st.unit} / {st.unit}_default_final) x 100 %. LOSS: first iteration at which the "
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
        rows.append([m.header, f"{value:.1f} at {st.unit} {x_final}"] + [cell(a, m.key) for a in arms])
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


def _interval_text(iv) -> str:
    return f"[{iv.low:+.1f}, {iv.high:+.1f}]" if iv is not None else ""


def _p(p: float) -> str:
    if not math.isfinite(p):
        return ""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _more_seeds(s: PairedStat) -> str:
    """What a one-seed comparison lacks, and how many seeds the question needs."""
    if s.plan is not None and s.plan.needed is not None:
        return f"training-run variance not measured: run ≥ {max(s.plan.needed, 2)} seeds"
    return ("training-run variance not measured: run ≥ 2 seeds to measure it (condinit-compare --plan-seeds "
            "--delta D --std S gives the number a difference D needs)")


def verdict_line(s: PairedStat) -> str:
    """``"- conditioned, AP^b: better than default (Δ +0.6, 95% interval [+0.2, +1.0], <unit>; Holm p = ...)"``;
    a contrast: ``"- conditioned vs scale_matched, AP^b: better than scale_matched (...): the conditioning adds to
    the scale's effect"``."""
    iv = s.interval
    if iv is None:
        return f"- {s.label}, {s.metric}: no verdict ({s.method})"
    text = (f"- {s.label}, {s.metric}: {s.verdict} (Δ {_signed(s.mean_difference)}, 95% interval "
            f"{_interval_text(iv)}, {iv.unit}; p = {_p(iv.p_value)}, Holm-adjusted p = {_p(s.p_holm)})")
    meaning = contrast_meaning(s.arm, s.reference, s.verdict, iv.replication, len(s.differences)) \
        if s.is_contrast else None
    if meaning:
        text += f": {meaning}"
    if iv.replication == IMAGES:
        text += f" — {_more_seeds(s)}"
    elif s.note and iv.replication != "both":
        text += f" — {s.note}"
    return text


def _family_text(sr: StageReport) -> str:
    """``"mimetic × {AP^b, AP^m}; conditioned × {AP^b, AP^m} (4 comparisons against default)"``; with contrasts
    ``"...; conditioned vs scale_matched × {AP^b, AP^m} (6 comparisons: 4 against default, 2 in contrasts between
    arms)"``."""
    fam = sr.family
    by_label = {}
    for s in fam:
        by_label.setdefault(s.label, []).append(s.metric)
    parts = [f"{label} × {{{', '.join(ms)}}}" for label, ms in by_label.items()]
    contrasts = sum(s.is_contrast for s in fam)
    size = f"{len(fam)} comparison{'s' * (len(fam) != 1)}"
    if not contrasts:
        return f"{'; '.join(parts)} ({size} against default)"
    against = len(fam) - contrasts
    if not against:
        return f"{'; '.join(parts)} ({size}, all in contrasts between arms)"
    return f"{'; '.join(parts)} ({size}: {against} against default, {contrasts} in contrasts between arms)"


def _improvement_cell(s: PairedStat) -> str:
    imp = s.improvement
    if imp is None:
        return "n/a (one seed)" if len(s.differences) == 1 else ""
    boot = f"bootstrap [{imp.boot_low:.2f}, {imp.boot_high:.2f}]" if math.isfinite(imp.boot_low) else "bootstrap off"
    return f"{imp.estimate:.2f} ({boot}; exact [{imp.exact_low:.2f}, {imp.exact_high:.2f}])"


def _bound(b: Optional[Bound]) -> str:
    return "" if b is None else b.text()


def _nothing_reached(s: PairedStat) -> bool:
    """No seed (and, for one seed's image bootstrap, no bound of the interval) reached the reference's final value."""
    sp = s.speedup
    return sp.reached == 0 and all(b is None or b.below for b in (sp.estimate, sp.low, sp.high))


def _ends_short(s: PairedStat) -> str:
    """``"every run ends below default's final value"`` (the training loss: above)."""
    side = "above" if s.key.startswith(LOSS) else "below"
    return f"{'every run ends' if s.speedup.n > 1 else 'the run ends'} {side} {s.reference}'s final value"


def speedup_line(s: PairedStat) -> str:
    """``"conditioned, speed-up AP^b (%): reached in 3/3 seeds, estimate 25.0 [20.0, 30.0] (coverage 0.750, ...)"``;
    when no seed reached it: ``"conditioned, speed-up AP^b (%): not reached in 0/3 seeds: every run ends below
    default's final value"``."""
    sp = s.speedup
    if _nothing_reached(s):
        return f"{s.label}, {s.metric}: not reached in 0/{sp.n} seeds: {_ends_short(s)}"
    interval = f" [{_bound(sp.low)}, {_bound(sp.high)}]" if sp.low is not None else ""
    coverage = f"coverage {sp.coverage:.3f}, " if math.isfinite(sp.coverage) else ""
    return (f"{s.label}, {s.metric}: reached in {sp.reached}/{sp.n} seeds, estimate {sp.estimate.text()}{interval} "
            f"({coverage}{sp.unit})")


def _speedups(out, sr: StageReport) -> None:
    rows_in = [s for s in sr.stats if s.kind == SPEEDUP]
    if not rows_in:
        return
    st = sr.stage
    out.write("### Speed-up to the default's final value\n\n")
    out.write(f"Per seed, the first {st.unit} at which the arm reaches the same seed's default final value; speed-up "
              f"(1 - {st.unit} / {st.unit}_default_final) x 100 %. A run that never reaches it is censored at its last "
              "evaluation (its speed-up lies below the bound shown as \"< b\"), never dropped. Estimate: "
              "Kaplan–Meier median over seeds, interval from order statistics (its coverage stated); one seed: "
              "image bootstrap of that seed. Descriptive: speed-ups are not in the verdicts' family.\n\n")
    if any(s.is_contrast for s in rows_in):
        out.write("Rows \"A vs B\" (contrasts between arms): A's runs to the same seed's B final value, "
                  f"(1 - {st.unit} / {st.unit}_B_final) x 100 %.\n\n")
    rows = []
    for s in rows_in:
        sp = s.speedup
        if sp is None:
            rows.append([s.label, s.metric, "", "", "", "", "", "", s.note or s.method])
            continue
        if _nothing_reached(s):
            rows.append([s.label, s.metric, f"0/{sp.n}", "not reached", "", "", sp.unit, "",
                         f"{_ends_short(s)} (censored at its last evaluation)"])
            continue
        interval = f"[{_bound(sp.low)}, {_bound(sp.high)}]" if sp.low is not None else "none"
        coverage = f"{sp.coverage:.3f}" if math.isfinite(sp.coverage) else ""
        mean = fmt_value(sp.mean, sp.std, sp.n) if math.isfinite(sp.mean) else ""
        rows.append([s.label, s.metric, f"{sp.reached}/{sp.n}", sp.estimate.text(), interval, coverage, sp.unit, mean,
                     "; ".join(filter(None, [s.note, sp.method]))])
    _table(out, ["arm", "speed-up", "reached", "estimate (%)", "interval (%)", "coverage", "unit", "mean ± std",
                 "method"], rows, align="llrrrrlrl")


def _beside(out, rows_in: List[PairedStat], who: str, reference: str) -> None:
    """The intervals shown beside the verdict's, and P(arm run > reference run with the same seed)."""
    beside = [s for s in rows_in if s.others or s.improvement is not None]
    if not beside:
        return
    out.write("Beside the verdict's interval: the paired t-interval over seeds (evaluation set held fixed), the "
              f"two-level percentile interval, and P({who} run > {reference} run with the same seed).\n\n")
    rows = []
    for s in beside:
        by_kind = {("t" if "t-interval" in o.method else "percentile"): o for o in s.others}
        if s.interval is not None and "t-interval" in s.interval.method:
            by_kind["t"] = s.interval
        rows.append([s.label, s.metric, _interval_text(by_kind.get("t")), _interval_text(by_kind.get("percentile")),
                     _improvement_cell(s)])
    _table(out, ["arm" if reference == "default" else "contrast", "metric", "t over seeds", "two-level percentile",
                 f"P({who} > {reference})"], rows, align="llrrl")


def _contrasts(out, sr: StageReport, rows_in: List[PairedStat]) -> None:
    """The contrasts between two arms other than default: A minus B, in the stage's family."""
    out.write("Contrasts between arms: A minus B, paired by training seed exactly as the comparisons with default "
              "(same data order and non-attention weights, same evaluation images), with the same intervals; their "
              f"verdicts are in the same Holm family ({len(sr.family)} comparisons).\n\n")
    rows = []
    for s in rows_in:
        iv = s.interval
        rows.append([s.label, s.metric, str(len(s.differences)), _signed(s.mean_difference) if s.differences else "",
                     _interval_text(iv), iv.unit if iv is not None else "", _p(iv.p_value) if iv is not None else "",
                     _p(s.p_holm), s.verdict, s.method])
    _table(out, ["contrast", "metric", "paired seeds", "Δ (A - B)", "95% interval", "unit", "p", "Holm p", "verdict",
                 "method"], rows, align="llrrrlrrll")
    _beside(out, rows_in, "A", "B")


def _stats(out, sr: StageReport) -> None:
    out.write("### Paired statistics\n\n")
    if not sr.stats:
        out.write("No runs to compare.\n\n")
        return
    metric_rows = [s for s in sr.stats if s.kind == METRIC]
    contrast_rows = [s for s in metric_rows if s.is_contrast]
    if not sr.target:
        out.write("No runs of the default arm: nothing to pair with; mean ± std over seeds only"
                  + (" (the contrasts between arms below)" if contrast_rows else "") + ".\n\n")
    else:
        out.write("Arm minus default, paired by training seed (same data order and non-attention weights, same "
                  "evaluation images). The unit column says what each interval replicates: training runs (seeds), "
                  "evaluation images (one trained model per arm), or both. Verdicts: Holm-adjusted p at most "
                  f"{ALPHA:g} within the family {_family_text(sr)}; the 95% intervals shown are unadjusted.\n\n")
    rows = []
    for s in metric_rows:
        if s.is_contrast:
            continue
        iv = s.interval
        rows.append([s.arm, s.metric, fmt_value(s.mean, s.std, s.n), str(s.n),
                     _signed(s.mean_difference) if s.differences else "", _interval_text(iv),
                     iv.unit if iv is not None else "", _p(iv.p_value) if iv is not None else "", _p(s.p_holm),
                     s.verdict, s.method])
    _table(out, ["arm", "metric", "mean ± std", "n", "Δ vs default", "95% interval", "unit", "p", "Holm p", "verdict",
                 "method"], rows, align="llrrrrlrrll")
    _beside(out, [s for s in metric_rows if not s.is_contrast], "arm", "default")
    if contrast_rows:
        _contrasts(out, sr, contrast_rows)
    notes = [s for s in metric_rows if s.note]
    for s in notes:
        out.write(f"- {s.label}, {s.metric}: {s.note}\n")
    dropped = {}
    for s in sr.stats:
        if s.dropped:
            dropped.setdefault(s.label, s.dropped)
    for label, d in dropped.items():
        out.write(f"- {label}: dropped from the pairing: {', '.join(d)}\n")
    unpaired = [a for a in _arms_shown(sr) if a not in {g.arm for g in sr.arms}]
    for arm in unpaired:
        out.write(f"- {arm}: no finished run to pair: "
                  + ", ".join(f"seed {m.seed} {m.reason}" for m in sr.failed_at(arm, sr.scale)) + "\n")
    for note in sr.contrast_notes:
        out.write(f"- {note}\n")
    if notes or dropped or unpaired or sr.contrast_notes:
        out.write("\n")
    _speedups(out, sr)


def _seed_plans(out, sr: StageReport) -> None:
    """One table: per comparison of the family, the seeds its question needs."""
    planned = [s for s in sr.family if s.plan is not None]
    if not planned:
        return
    first = planned[0].plan
    holm = f" Holm-adjusted over {first.comparisons} comparisons" if first.comparisons > 1 else ""
    out.write(f"Seeds per arm for {first.power:.0%} power (two-sided paired t-test over seeds, level "
              f"{first.level:g}{holm}):\n\n")
    rows = []
    for s in planned:
        p = s.plan
        needed = str(p.needed) if p.needed is not None else \
            "none suffices (the image variance every run shares: more evaluation images needed)"
        rows.append([s.label, s.metric, f"{p.delta:.3g} ({p.delta_source})", f"{p.std:.3g} ({p.std_source})", needed,
                     str(len(s.differences))])
    _table(out, ["arm", "metric", "effect Δ", "std of the paired differences", "seeds needed", "seeds now"], rows,
           align="llllrr")


def _summary(out, report: ArmsReport) -> None:
    """Per stage: seeds per arm, the family, every verdict line and the seeds each question needs."""
    stages = [sr for sr in report.stages if sr.family]
    if not stages:
        return
    out.write("## Summary\n\n")
    for sr in stages:
        seeds = ", ".join(f"{arm} {n}" for arm, n in sr.seeds_per_arm.items())
        out.write(f"**{sr.stage.name.capitalize()}** — seeds per arm: {seeds}; family (Holm, family-wise error "
                  f"{ALPHA:g}): {_family_text(sr)}.\n\n")
        for note in sr.contrast_notes:
            out.write(f"- {note}\n")
        for s in sr.family:
            out.write(verdict_line(s) + "\n")
        for s in sr.stats:
            if s.kind == SPEEDUP and s.speedup is not None and not s.key.startswith(LOSS):
                out.write("- " + speedup_line(s) + "\n")
        out.write("\n")
        _seed_plans(out, sr)


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
                out.write(f"- {sr.stage.name}: {r.name}, final {sr.stage.unit} {r.final_x} — {r.path}\n")
    other = [m for m in report.missing if m.stage is None]
    for m in other:
        out.write(f"- {m.describe()} — {m.path}\n")
    out.write("\n")


def _method(out, report: ArmsReport) -> None:
    """This report's settings; the methods themselves are written once, in docs/statistics.md."""
    boot = report.bootstrap
    images = (f"B = {boot} resamples of the evaluation images, generator seed {report.seed} (an image-bootstrap "
              f"p-value is at least 2 / (B + 1) = {2 / (boot + 1):.3g})" if boot > 0
              else "off (--bootstrap 0): intervals over seeds only")
    out.write("## Method\n\n")
    out.write(
        f"- Image resampling: {images}.\n"
        f"- Verdicts: Holm over each stage's family, family-wise error {ALPHA:g}; the 95% intervals shown are "
        "unadjusted.\n"
        "- Only runs at the main learning-rate scale enter the tables, curves and statistics; training loss "
        f"smoothed by a trailing median over {SMOOTHING_WINDOW} logged points.\n"
        "- How every number here is computed, and the measured coverage of each interval: docs/statistics.md and "
        "docs/comparing_arms.md of condinit-det.\n\n"
    )


def format_markdown(report: ArmsReport) -> str:
    """The comparison of every stage as one Markdown document."""
    out = io.StringIO()
    out.write("# Initialization arms\n\n")
    out.write("Stages: " + "; ".join(
        f"{sr.stage.name} ({sum(len(g.runs) for g in sr.groups)} finished runs)" for sr in report.stages) + ".\n\n")
    _summary(out, report)
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
