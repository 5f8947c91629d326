"""The comparison as Markdown: per stage the paper-layout table, convergence, paired statistics,
learning-rate sensitivity and missing runs; then the runs and the method."""
from __future__ import annotations

import io
import math
from typing import List, Optional

from .loss import SMOOTHING_WINDOW
from .paired import ALPHA, METRIC, SPEEDUP, PairedStat
from .speedup import Bound
from .stages import DETECTION
from .statistics import IMAGES, NOT_DISTINGUISHABLE
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
    """``"- conditioned, AP^b: better than default (Δ +0.6, 95% interval [+0.2, +1.0], <unit>; Holm p = ...)"``."""
    iv = s.interval
    if iv is None:
        return f"- {s.arm}, {s.metric}: no verdict ({s.method})"
    text = (f"- {s.arm}, {s.metric}: {s.verdict} (Δ {_signed(s.mean_difference)}, 95% interval {_interval_text(iv)}, "
            f"{iv.unit}; p = {_p(iv.p_value)}, Holm-adjusted p = {_p(s.p_holm)})")
    if iv.replication == IMAGES:
        text += f" — {_more_seeds(s)}"
    elif s.note and iv.replication != "both":
        text += f" — {s.note}"
    return text


def _family_text(sr: StageReport) -> str:
    fam = sr.family
    by_arm = {}
    for s in fam:
        by_arm.setdefault(s.arm, []).append(s.metric)
    parts = [f"{arm} × {{{', '.join(ms)}}}" for arm, ms in by_arm.items()]
    return f"{'; '.join(parts)} ({len(fam)} comparison{'s' * (len(fam) != 1)} against default)"


def _improvement_cell(s: PairedStat) -> str:
    imp = s.improvement
    if imp is None:
        return "n/a (one seed)" if len(s.differences) == 1 else ""
    boot = f"bootstrap [{imp.boot_low:.2f}, {imp.boot_high:.2f}]" if math.isfinite(imp.boot_low) else "bootstrap off"
    return f"{imp.estimate:.2f} ({boot}; exact [{imp.exact_low:.2f}, {imp.exact_high:.2f}])"


def _bound(b: Optional[Bound]) -> str:
    return "" if b is None else b.text()


def speedup_line(s: PairedStat) -> str:
    """``"conditioned, speed-up AP^b (%): reached in 3/3 seeds, estimate 25.0 [20.0, 30.0] (coverage 0.750, ...)"``."""
    sp = s.speedup
    interval = f" [{_bound(sp.low)}, {_bound(sp.high)}]" if sp.low is not None else ""
    coverage = f"coverage {sp.coverage:.3f}, " if math.isfinite(sp.coverage) else ""
    return (f"{s.arm}, {s.metric}: reached in {sp.reached}/{sp.n} seeds, estimate {sp.estimate.text()}{interval} "
            f"({coverage}{sp.unit})")


def _speedups(out, sr: StageReport) -> None:
    rows_in = [s for s in sr.stats if s.kind == SPEEDUP]
    if not rows_in:
        return
    st = sr.stage
    out.write("### Speed-up to the default's final value\n\n")
    out.write(f"Per seed, the first {st.x} at which the arm reaches the same seed's default final value; speed-up "
              f"(1 - {st.x} / {st.x}_default_final) x 100 %. A run that never reaches it is censored at its last "
              "evaluation (its speed-up lies below the bound shown as \"< b\"), never dropped. Estimate: "
              "Kaplan–Meier median over seeds, interval from order statistics (its coverage stated); one seed: "
              "image bootstrap of that seed. Descriptive: speed-ups are not in the verdicts' family.\n\n")
    rows = []
    for s in rows_in:
        sp = s.speedup
        if sp is None:
            rows.append([s.arm, s.metric, "", "", "", "", "", "", s.note or s.method])
            continue
        interval = f"[{_bound(sp.low)}, {_bound(sp.high)}]" if sp.low is not None else "none"
        coverage = f"{sp.coverage:.3f}" if math.isfinite(sp.coverage) else ""
        mean = fmt_value(sp.mean, sp.std, sp.n) if math.isfinite(sp.mean) else ""
        rows.append([s.arm, s.metric, f"{sp.reached}/{sp.n}", sp.estimate.text(), interval, coverage, sp.unit, mean,
                     "; ".join(filter(None, [s.note, sp.method]))])
    _table(out, ["arm", "speed-up", "reached", "estimate (%)", "interval (%)", "coverage", "unit", "mean ± std",
                 "method"], rows, align="llrrrrlrl")


def _stats(out, sr: StageReport) -> None:
    out.write("### Paired statistics\n\n")
    if not sr.stats:
        out.write("No runs to compare.\n\n")
        return
    if not sr.target:
        out.write("No runs of the default arm: nothing to pair with; mean ± std over seeds only.\n\n")
    else:
        out.write("Arm minus default, paired by training seed (same data order and non-attention weights, same "
                  "evaluation images). The unit column says what each interval replicates: training runs (seeds), "
                  "evaluation images (one trained model per arm), or both. Verdicts: Holm-adjusted p at most "
                  f"{ALPHA:g} within the family {_family_text(sr)}; the 95% intervals shown are unadjusted.\n\n")
    rows = []
    for s in sr.stats:
        if s.kind != METRIC:
            continue
        iv = s.interval
        rows.append([s.arm, s.metric, fmt_value(s.mean, s.std, s.n), str(s.n),
                     _signed(s.mean_difference) if s.differences else "", _interval_text(iv),
                     iv.unit if iv is not None else "", _p(iv.p_value) if iv is not None else "", _p(s.p_holm),
                     s.verdict, s.method])
    _table(out, ["arm", "metric", "mean ± std", "n", "Δ vs default", "95% interval", "unit", "p", "Holm p", "verdict",
                 "method"], rows, align="llrrrrlrrll")
    beside = [s for s in sr.stats if s.kind == METRIC and (s.others or s.improvement is not None)]
    if beside:
        out.write("Beside the verdict's interval: the paired t-interval over seeds (evaluation set held fixed), the "
                  "two-level percentile interval, and P(arm run > default run with the same seed).\n\n")
        rows = []
        for s in beside:
            by_kind = {("t" if "t-interval" in o.method else "percentile"): o for o in s.others}
            if s.interval is not None and "t-interval" in s.interval.method:
                by_kind["t"] = s.interval
            rows.append([s.arm, s.metric, _interval_text(by_kind.get("t")), _interval_text(by_kind.get("percentile")),
                         _improvement_cell(s)])
        _table(out, ["arm", "metric", "t over seeds", "two-level percentile", "P(arm > default)"], rows, align="llrrl")
    notes = [s for s in sr.stats if s.kind == METRIC and s.note]
    for s in notes:
        out.write(f"- {s.arm}, {s.metric}: {s.note}\n")
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
    if notes or dropped or unpaired:
        out.write("\n")
    _speedups(out, sr)


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
        for s in sr.family:
            out.write(verdict_line(s) + "\n")
        for s in sr.stats:
            if s.kind == SPEEDUP and s.speedup is not None and not s.key.startswith(LOSS):
                out.write("- " + speedup_line(s) + "\n")
        for s in sr.family:
            if s.plan is not None:
                out.write(f"- seeds for {s.arm}, {s.metric}: {s.plan.text(s.metric)} (now {len(s.differences)})\n")
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
    boot = report.bootstrap
    images = (f"B = {boot} resamples of the evaluation images (with replacement, a repeated image counted each "
              "time; the same resample for every seed and both arms: seeds and images are crossed), generator seed "
              f"{report.seed}; detection AP of a resample is COCO's accumulation over the saved per-image matches "
              "(equal to re-evaluating COCO on the resampled images), classification the mean per-image "
              f"correctness; an image-bootstrap p-value is at least 2 / (B + 1) = {2 / (boot + 1):.3g}"
              if boot > 0 else "image resampling off (--bootstrap 0): intervals over seeds only")
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
        f"are dropped and named). Image resampling: {images}. "
        "Intervals by unit of replication: one paired seed — image bootstrap, percentile interval: it covers "
        "evaluation-image sampling of one trained model per arm, so it is never a verdict on the initialization; "
        "two or more paired seeds with per-image data — two-level bootstrap (seeds resampled, and the images once per "
        "replicate), t-scaled: estimate ± the 97.5% point of |Z| sqrt(s²/n (n-1)/χ²(n-1) + v), s the std of the "
        "per-seed differences, v the image variance shared by every training run (the mean covariance of two "
        "seeds' image-resampled differences); without per-image data — Student t-interval over seeds (n - 1 "
        "degrees of freedom), the evaluation set held fixed. Coverage measured on simulated experiments: "
        "docs/statistics.md.\n"
        f"- Verdicts: better / worse than default when the Holm-adjusted p-value is at most {ALPHA:g} "
        "(Holm–Bonferroni over each stage's family of arm × headline-metric comparisons; family-wise error "
        f"{ALPHA:g}), else \"{NOT_DISTINGUISHABLE}\"; one seed: \"this one trained model scores higher / lower than "
        "default's on these images\". The 95% intervals shown are unadjusted.\n"
        "- P(arm > default): fraction of paired seeds where the arm's run beats the default's (a tie counts half), "
        "with the percentile interval of a seed bootstrap and the exact Clopper–Pearson interval.\n"
        "- Speed-ups: per seed, censored at the last evaluation when the default's final value is never reached; "
        "Kaplan–Meier median and order-statistic interval over seeds (coverage stated); one seed: image "
        "bootstrap (every evaluation's per-image data). Not in the verdicts' family.\n"
        "- Seeds needed: smallest n with 80% power for a two-sided paired t-test at 0.05 / (family size) "
        "(Holm's strictest threshold), std of the paired differences observed (or assumed where stated), the "
        "shared image variance added when measured.\n"
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
