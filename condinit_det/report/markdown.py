"""The comparison as Markdown: the table of every comparison and its forest plot; per section the paper's table,
figures, convergence, paired statistics, κ, lr scan and missing runs; the seed plan, the method and environment."""

from __future__ import annotations

import math
import re
from typing import List, Mapping, Optional

from tabulate import tabulate

from .discovery import SMOOTHING_WINDOW
from .factorial import CELLS, EFFECTS, SCALES, STRUCTURES, reading
from .paired import AGAINST_DEFAULT, ALPHA, BETWEEN_ARMS, STRUCTURE_SCALE, Comparison
from .plots import EFFECTS_FIGURE, INTERACTION_FIGURE, plural
from .summary import LOSS, ArmsReport, StageReport, arm_sort_key, environment

# The question each family's verdicts answer, and the rows that ask it.
_ASKS = {
    AGAINST_DEFAULT: "is the arm better or worse than default (a row named by its arm: the arm minus default)",
    BETWEEN_ARMS: 'is A better or worse than B (an "A vs B" row: A minus B)',
    STRUCTURE_SCALE: "does the structure, the scale or their interaction change the metric (a main effect or "
    "interaction of the structure × scale design)",
}
# What a contrast answers, for the contrasts whose arms isolate a question.
_QUESTIONS = {
    ("conditioned", "scale_matched"): "whether the conditioning adds anything to the weights' scale (better: "
    "it does; worse: the scale alone does better)",
    ("conditioned", "structured"): "whether the conditioned arm's scale adds anything to its structure (better: it "
    "does; worse: the structure does better at the default init's scale)",
}


def _value(mean: float, std: float = float("nan"), n: int = 1) -> str:
    """A metric over seeds: ``"41.0 ± 1.4"`` (several), ``"30.0"`` (one), ``"n/a"`` (undefined)."""
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.1f} ± {std:.1f}" if n > 1 and math.isfinite(std) else f"{mean:.1f}"


def _span(low: float, high: float, spec: str = "+.1f") -> str:
    """An interval: ``"[-0.5, +4.5]"``."""
    return f"[{low:{spec}}, {high:{spec}}]"


def _p(p: float) -> str:
    return "" if not math.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _cells(s: Comparison) -> List[str]:
    """Δ with the interval at its family's level, that level, the unadjusted 95% interval, what they cover."""
    iv, n = s.adjusted, len(s.differences)
    delta = f"{s.mean_difference:+.1f}" if math.isfinite(s.mean_difference) else "n/a"
    if iv is None:
        return [delta, "", "", "one seed: no interval over training runs" if n else "no paired seeds"]
    return [
        f"{delta} {_span(iv.low, iv.high)}",
        f"{100 * iv.level:.4g}%",
        _span(s.interval.low, s.interval.high),
        iv.unit,
    ]


def _table(out: List[str], header: List[str], rows: List[List[str]], align: Optional[str] = None) -> None:
    """A Markdown table; ``align``: "l" or "r" per column (default: text first, numbers after)."""
    align = align or "l" + "r" * (len(header) - 1)
    out.append(
        tabulate(
            rows,
            header,
            tablefmt="pipe",
            disable_numparse=True,
            colalign=["left" if a == "l" else "right" for a in align],
        )
        + "\n"
    )


def _figure(out: List[str], name: str, figures: Mapping[str, str]) -> None:
    if name in figures:
        out.append(f"![{name}]({name})\n\n`{name}`: {figures[name]}\n")


def _headline(out: List[str], report: ArmsReport, figures: Mapping[str, str]) -> None:
    sections = [sr for sr in report.stages if sr.comparisons]
    several = len(report.stages) > 1
    if sections:
        asked = {s.family for sr in sections for s in sr.comparisons}
        out.append(
            f"Each verdict answers one question, at family-wise error {ALPHA:g} over that question's comparisons: "
            + "; ".join(question for family, question in _ASKS.items() if family in asked)
            + f". Its interval is at its family's level, 1 − {ALPHA:g} / the family's comparisons: better or worse "
            "where it excludes zero, no difference shown where it covers zero; too few seeds with one seed per arm. "
            f"Δ at the final {'/'.join(sorted({sr.stage.unit for sr in sections}))}, paired by training seed.\n"
        )
        rows = []
        for sr in sections:
            for s in sr.comparisons:
                delta, level, raw, unit = _cells(s)
                seeds = str(len(s.differences))
                rows.append(
                    ([sr.title] if several else []) + [s.label, s.metric, delta, level, s.verdict, raw, seeds, unit]
                )
        header = ["arm", "metric", "Δ, interval at the family's level", "level", "verdict", "95% interval, unadjusted"]
        header += ["seeds", "unit of the intervals"]
        _table(out, (["stage"] if several else []) + header, rows, ("l" if several else "") + "llrrlrrl")
    else:
        out.append("No comparison: no stage has runs of the default arm and another arm, or two arms to contrast.\n")
    _figure(out, EFFECTS_FIGURE, figures)
    out += [
        f"{a} vs {b} asks {question}.\n"
        for sr in sections
        for (a, b), question in _QUESTIONS.items()
        if any(s.arm == a and s.reference == b for s in sr.comparisons)
    ]
    for sr in report.stages:
        differ = [f for f, values in environment(sr.runs).items() if len(values) > 1]
        if differ:
            out.append(
                f"**Warning**: the runs pooled in {sr.title} ran in different environments: "
                f"{', '.join(differ)} differ (see Method).\n"
            )
    out += [f"**Skipped** (unreadable, left out): {problem}\n" for problem in report.skipped]
    out += [f"**Left out** (no stage): {m.describe()} — {m.path}\n" for m in report.missing if m.stage is None]


def _arms_shown(sr: StageReport, scale: Optional[float] = None) -> List[str]:
    """Arms with finished or failed runs at ``scale`` (default: any), in arm order."""
    return sorted({x.arm for x in [*sr.groups, *sr.failed] if scale in (None, x.lr_scale)}, key=arm_sort_key)


def _arm_rows(sr: StageReport, arm: str, scale: float, headers: List[str], last) -> List[List[str]]:
    """The arm's row at ``scale`` (values over seeds, seeds, ``last(group)``), or each failed run's (what it became)."""
    rows = [
        [_value(*g.final[h], len(g.runs)) for h in headers] + [str(len(g.runs)), last(g)]
        for g in sr.groups
        if g.arm == arm and g.lr_scale == scale
    ]
    return rows + [[m.reason] + [""] * len(headers) + [""] for m in sr.failed_at(arm, scale)]


def _main_table(out: List[str], sr: StageReport, figures: Mapping[str, str]) -> None:
    st, headers = sr.stage, [m.header for m in sr.stage.table]
    out.append(
        f"Final-{st.unit} {', '.join(headers)} (%)"
        + (", mean ± sample std over seeds" if any(len(g.runs) > 1 for g in sr.arms) else "")
        + f", learning-rate scale {sr.scale:g}"
        + (" (no runs at the config's learning rate)" if sr.scale != 1.0 else "")
        + ".\n"
    )
    rows = [
        [arm] + row
        for arm in _arms_shown(sr, sr.scale)
        for row in _arm_rows(sr, arm, sr.scale, headers, lambda g: str(max(g.final_iterations)))
    ]
    _table(out, ["arm"] + headers + ["seeds", f"final {st.unit}"], rows)
    for g in sr.arms:
        _figure(out, f"{sr.prefix}predictions_{g.arm}.png", figures)
    for _, name in st.plots:
        _figure(out, sr.prefix + name, figures)


def _convergence(out: List[str], sr: StageReport, figures: Mapping[str, str]) -> None:
    unit = sr.stage.unit
    out.append("### Convergence\n")
    if not sr.target:
        out.append("No runs of the default arm: the speed-up needs one as the reference.\n")
        return
    out.append(
        f"First {unit} at which an arm's seed-mean curve reaches the default arm's final value, and the "
        f"speed-up (1 - {unit} / {unit}_default_final) x 100 %. LOSS: the smoothed training loss falls to or "
        "below the default's final smoothed loss. Per seed, with runs that never reach it kept as censored: "
        "the speed-up rows of stats.csv.\n"
    )
    arms, groups = _arms_shown(sr, sr.scale), {g.arm: g for g in sr.arms}

    def cell(arm: str, key: str) -> str:
        g = groups.get(arm)
        if g is None:  # every run of the arm stopped early
            failures = [m.failure.get("reason") for m in sr.failed_at(arm, sr.scale)]
            return "diverged" if "diverged" in failures else "failed"
        if key == LOSS and g.loss is None:
            return "no loss logged"
        if g.reach.get(key) is None:
            return "not reached"
        return f"{g.reach[key]} ({g.speedup[key]:.1f}%)" if g.speedup.get(key) is not None else str(g.reach[key])

    rows = [
        [m.header, f"{sr.target[m.key][1]:.1f} at {unit} {sr.target[m.key][0]}"] + [cell(a, m.key) for a in arms]
        for m in sr.stage.headline
        if sr.target[m.key][0] is not None and math.isfinite(sr.target[m.key][1])
    ]
    x_final, value = sr.target[LOSS]
    if x_final is not None:
        rows.append(["LOSS", f"{value:.4g} at iteration {x_final}"] + [cell(a, LOSS) for a in arms])
    _table(out, ["metric", "default final"] + arms, rows)
    if x_final is None:
        out.append("LOSS: no training loss logged (metrics.json) for the default arm.\n")
    _figure(out, sr.prefix + sr.stage.loss_plot, figures)


def _improvement(s: Comparison) -> str:
    imp = s.improvement
    if imp is None:
        return "n/a (one seed)" if len(s.differences) == 1 else ""
    boot = f"bootstrap {_span(imp.boot_low, imp.boot_high, '.2f')}" if math.isfinite(imp.boot_low) else "bootstrap off"
    return f"{float(imp.estimate):.2f} ({boot}; exact {_span(imp.exact_low, imp.exact_high, '.2f')})"


def _paired(out: List[str], sr: StageReport) -> None:
    out.append("### Paired statistics\n")
    if not sr.comparisons:
        out.append("No runs of the default arm and no two arms to contrast: mean ± std over seeds only.\n")
    else:
        out.append(
            "The comparisons of the first table, paired by training seed (same data order and non-attention "
            "weights, same evaluation images): the arm's mean ± std over seeds, the p of the 95% interval and the "
            "adjusted p (times the comparisons of its family), the paired t over seeds (evaluation set held fixed) and "
            "the two-level percentile interval (both 95%), and P(arm run > reference run with the same seed).\n"
        )
        rows = [
            [s.label, s.metric, _value(s.mean, s.std, s.n), _p(s.interval.p_value) if s.interval else ""]
            + [_p(s.p_adjusted)]
            + [_span(iv.low, iv.high) if iv else "" for iv in (s.t, s.percentile)]
            + [_improvement(s), s.method]
            for s in sr.comparisons
        ]
        header = ["arm", "metric", "mean ± std", "p", "adjusted p", "t over seeds", "two-level percentile"]
        _table(out, header + ["P(arm > reference)", "method"], rows, "llrrrrrll")
    notes = [f"{s.label}, {s.metric}: {s.note}" for s in sr.comparisons if s.note]
    dropped = {s.label: s.dropped for s in sr.stats if s.dropped}
    notes += [f"{label}: dropped from the pairing: {', '.join(d)}" for label, d in dropped.items()]
    notes += [
        f"{arm}: no finished run to pair: "
        + ", ".join(f"seed {m.seed} {m.reason}" for m in sr.failed_at(arm, sr.scale))
        for arm in _arms_shown(sr, sr.scale)
        if arm not in {g.arm for g in sr.arms}
    ]
    out += [f"- {note}" for note in notes + sr.contrast_notes] + ([""] if notes or sr.contrast_notes else [])


def _factorial(out: List[str], sr: StageReport, figures: Mapping[str, str]) -> None:
    if not sr.has_factorial:
        return
    out.append("### What the gain is made of: structure × scale\n")
    if sr.factorial_problem:
        out.append(
            f"The four arms of the structure × scale design ran, but no effect is computed: {sr.factorial_problem}.\n"
        )
        return
    out.append(
        "The four arms of the design (docs/arms.md): the structure of the attention weights is random (as the "
        "constructor draws it) or conditioned (flat Q/K spectra, V on the identity); their per-head scale is the "
        "default init's or the conditioned arm's. Each effect is paired by training seed; the main effects and the "
        "interaction are a family of their own, the four simple effects rows of the first table in theirs (against "
        "default, or between two arms).\n"
    )
    groups = {g.arm: g for g in sr.arms}
    for metric in sr.stage.headline:
        effects = sr.effects(metric.key)
        if len(effects) < len(EFFECTS):
            continue
        seeds = len(effects["structure"].paired_seeds)
        out.append(f"**{metric.header}**: {reading(metric.header, effects, seeds)}\n")
        cells = []
        for structure in STRUCTURES:
            row = [structure]
            for scale in SCALES:
                g = groups[CELLS[(structure, scale)]]
                row.append(f"{_value(*g.final[metric.header], len(g.runs))} ({g.arm})")
            cells.append(row)
        _table(out, [f"{metric.header}: structure \\ scale", *SCALES], cells, "lrr")
        rows = [
            [e.label, e.formula, *_cells(s), _p(s.p_adjusted), s.verdict, str(len(s.differences))]
            for e, s in ((e, effects[e.name]) for e in EFFECTS)
        ]
        header = ["effect", "of the arms", "Δ, interval at its family's level", "level", "95% interval, unadjusted"]
        _table(out, header + ["unit of the intervals", "adjusted p", "verdict", "seeds"], rows, "llrrrlrlr")
    _figure(out, sr.prefix + INTERACTION_FIGURE, figures)


def _kappa(out: List[str], sr: StageReport, figures: Mapping[str, str]) -> None:
    if not sr.kappa:
        return
    out.append("### Attention conditioning κ\n")
    out += [
        f"- {arm}: median κ over sites {med[0]:.3g} at {sr.stage.unit} {xs[0]}"
        + (f", {med[-1]:.3g} at {sr.stage.unit} {xs[-1]}" if len(xs) > 1 else "")
        + f" ({plural(len(xs), 'measured point')})"
        for arm, (xs, med, _, _) in sr.kappa.items()
    ] + [""]
    _figure(out, sr.prefix + sr.stage.kappa_plot, figures)


def _lr(out: List[str], sr: StageReport) -> None:
    if len(sr.scales) < 2:
        return
    heads = [m.header for m in sr.stage.headline]
    out.append("### Learning-rate sensitivity\n")
    out.append(
        f"Final {', '.join(heads)} (%) per learning-rate scale (multiplier of the config's learning rate), "
        f"mean over seeds; best: the arm's scale with the highest {heads[0]}.\n"
    )
    rows = [
        [arm, f"{scale:g}"] + row
        for arm in _arms_shown(sr)
        for scale in sr.scales
        for row in _arm_rows(sr, arm, scale, heads, lambda g: "best" if g.lr_scale == sr.best_scale(g.arm) else "")
    ]
    _table(out, ["arm", "lr scale"] + heads + ["seeds", ""], rows, "lr" + "r" * len(heads) + "rl")


def _missing(out: List[str], sr: StageReport) -> None:
    out.append("### Missing or unfinished runs\n")
    if sr.missing:
        out += ["Not in the tables or the statistics:\n"] + [f"- {m.describe()} — {m.path}" for m in sr.missing] + [""]
    else:
        out.append(
            "None: every planned run has finished.\n"
            if sr.has_plan
            else "None found (no experiment plan: only the runs present were checked).\n"
        )


def _seed_plan(out: List[str], report: ArmsReport) -> None:
    sections = [sr for sr in report.stages if sr.comparisons]
    out += ["## Seed plan\n"] if sections else []
    for sr in sections:
        planned = [s for s in sr.comparisons if s.plan is not None]
        if planned:
            first = planned[0].plan
            out.append(
                f"**{sr.title}**: seeds per arm for {first.power:.0%} power (two-sided paired t-test over seeds at "
                f"level {first.level:g} / the comparisons of the row's family, the level its verdict needs):\n"
            )
            none = "none suffices (the image variance every run shares: more evaluation images needed)"
            rows = [
                [
                    s.label,
                    s.metric,
                    f"{s.family} ({s.family_size})",
                    f"{s.plan.delta:.3g} ({s.plan.delta_source})",
                    f"{s.plan.std:.3g} ({s.plan.std_source})",
                    none if s.plan.needed is None else str(s.plan.needed),
                    str(len(s.differences)),
                ]
                for s in planned
            ]
            _table(
                out,
                ["arm", "metric", "family", "effect Δ", "std of the paired differences", "seeds needed", "seeds now"],
                rows,
                "lllllrr",
            )
        for s in sr.comparisons:
            if s.plan is None and len(s.differences) == 1:
                half = None if s.interval is None else (s.interval.high - s.interval.low) / 2
                images = (
                    ""
                    if half is None
                    else f"; the image bootstrap alone already bounds the evaluation-image part at ±{half:.1f}"
                )
                out.append(
                    f"- {s.label}, {s.metric}: one seed per arm on {sr.dataset or 'unrecorded data'}: the "
                    "spread between training runs is not measured, and no prior one fits this data; run ≥ 3 "
                    f"seeds per arm to measure it{images}."
                )
        out.append("")


def _method(out: List[str], report: ArmsReport) -> None:
    boot = report.bootstrap
    images = (
        f"B = {boot} resamples of the evaluation images, generator seed {report.seed} (an image-bootstrap "
        f"p-value is at least 2 / (B + 1) = {2 / (boot + 1):.3g})"
        if boot > 0
        else "off (--bootstrap 0): intervals over seeds only"
    )
    out.append("## Method\n")
    for sr in (sr for sr in report.stages if sr.comparisons):
        out.append(
            f"- Families of {sr.title}, each at family-wise error {ALPHA:g} (Bonferroni: p times the family's "
            f"comparisons, intervals at 1 − {ALPHA:g} / them; the 95% intervals beside them are unadjusted):"
        )
        for family, rows in sr.families.items():
            by_label = {k: [s.metric for s in rows if s.label == k] for k in dict.fromkeys(s.label for s in rows)}
            out.append(
                f"  - {family}: "
                + "; ".join(f"{k} × {{{', '.join(v)}}}" for k, v in by_label.items())
                + f" ({plural(len(rows), 'comparison')}, intervals at {100 * rows[0].level:.4g}%)"
            )
    out.append(
        f"- Image resampling: {images}.\n"
        "- Only runs at the main learning-rate scale enter the tables, curves and statistics; training loss "
        f"smoothed by a trailing median over {SMOOTHING_WINDOW} logged points.\n"
        "- How every number here is computed, and the measured coverage of each interval: docs/statistics.md "
        "and docs/comparing_arms.md of condinit-det.\n"
    )
    runs = [r for sr in report.stages for r in sr.runs]
    unrecorded = sum(not r.environments for r in runs)
    out.append(
        "### Environment\n\n"
        + (
            f"{plural(unrecorded, 'run')} without an environment record (written before runs recorded it)."
            if unrecorded
            else "Every run recorded its environment."
        )
        + "\n"
    )
    rows = [[f, " / ".join(str(v) for v in vs)] for f, vs in environment(runs).items() if vs]
    if rows:
        _table(out, ["field", "value (runs that differ: every value, separated by /)"], rows, "ll")


def format_markdown(report: ArmsReport, figures: Mapping[str, str] = {}) -> str:
    """The report as one Markdown document; ``figures``: file name -> what to read from it (the figures written)."""
    stages = "; ".join(dict.fromkeys(sr.title[0].lower() + sr.title[1:] for sr in report.stages))
    out = [f"# Initialization arms: {stages}\n"]
    _headline(out, report, figures)
    for sr in report.stages:
        out.append(f"## {sr.title}\n")
        if sr.groups:
            _main_table(out, sr, figures)
            _convergence(out, sr, figures)
            _paired(out, sr)
            _factorial(out, sr, figures)
            _kappa(out, sr, figures)
            _lr(out, sr)
        else:
            out.append("No finished runs.\n")
        _missing(out, sr)
    _seed_plan(out, report)
    _method(out, report)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"
