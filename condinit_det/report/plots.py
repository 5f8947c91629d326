"""The report's figures, one colour per arm everywhere; each comes with the sentence report.md links it with."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
from typing import Callable, Dict, List, Optional

import numpy as np

from condinit_det.records.results import METRICS_FILENAME, RESULTS_FILENAME
from condinit_det.stage import Metric
from condinit_det.utils.fileio import atomic_write

from .discovery import SMOOTHING_WINDOW
from .factorial import CELLS, FACTORIAL, SCALES, STRUCTURES
from .summary import ArmsReport, StageReport

# Fixed mapping (colour-blind safe): the same arm has the same colour in every plot.
ARM_COLORS = {
    "default": "#4D4D4D",
    "mimetic": "#0072B2",
    "conditioned": "#D55E00",
    "scale_matched": "#009E73",
    "structured": "#CC79A7",
}
_EXTRA_COLORS = ("#E69F00", "#56B4E9", "#F0E442")
EFFECTS_FIGURE = "effects.png"
INTERACTION_FIGURE = "interaction.png"  # a section's structure x scale design
PREDICTIONS_FIGURE = "predictions.png"  # a detection run's predictions on a few images, drawn at its end


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def arm_color(arm: str) -> str:
    return ARM_COLORS.get(arm, _EXTRA_COLORS[sum(map(ord, arm)) % len(_EXTRA_COLORS)])


def _write(path: str, fig) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    atomic_write(path, buf.getvalue())


def _save(path: str, draw: Callable, title: str, xlabel: str, ylabel: str) -> None:
    """One titled, labelled plot with its legend outside."""
    from matplotlib.figure import Figure  # outside pyplot: no global state, nothing to close

    ax = Figure(figsize=(7.6, 4.2), dpi=100).subplots()
    draw(ax)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=9, frameon=False)
    _write(path, ax.figure)


def _band(sr: StageReport) -> str:
    return f"lr scale {sr.scale:g}" + ("; mean ± 1 std over seeds" if any(len(g.runs) > 1 for g in sr.arms) else "")


def _metric_plot(path: str, sr: StageReport, metric: Metric) -> Optional[str]:
    groups = [g for g in sr.arms if np.isfinite(g.curves[metric.key].mean).any()]
    failed = [
        (m, x, y) for m in sr.failed if m.lr_scale == sr.scale for x, y in [m.run.curve(metric)] if np.isfinite(y).any()
    ]
    if not groups and not failed:
        return None

    def draw(ax):
        for g in groups:
            c, color = g.curves[metric.key], arm_color(g.arm)
            ax.plot(c.x, c.mean, marker="o", ms=3, color=color, label=f"{g.arm} ({plural(len(g.runs), 'seed')})")
            ax.fill_between(c.x, c.mean - c.std, c.mean + c.std, color=color, alpha=0.2, lw=0)  # std 0 for one seed
        for m, x, y in failed:  # each stopped run on its own, ending where it stopped
            ax.plot(x, y, ls=":", marker="x", ms=4, color=arm_color(m.arm), label=f"{m.arm} seed {m.seed}: {m.reason}")
        x_final, value = sr.target.get(metric.key, (None, float("nan")))
        if x_final is not None and np.isfinite(value):
            ax.axhline(value, color=arm_color("default"), ls="--", lw=1, label="default final")

    name = metric.label.split(" (")[0]
    _save(path, draw, f"{name[0].upper() + name[1:]} vs {sr.stage.unit} ({_band(sr)})", sr.stage.unit, metric.label)
    return (
        f"{name} against {sr.stage.unit} per arm: how fast each arm learns; the dashed line is the default's final "
        "value, which the convergence table asks every arm to reach."
    )


def _loss_plot(path: str, sr: StageReport) -> Optional[str]:
    groups = [g for g in sr.arms if g.loss is not None and len(g.loss.x)]
    if not groups:
        return None

    def draw(ax):
        lows, highs = [], []
        for g in groups:
            color = arm_color(g.arm)
            for i, r in enumerate(g.runs):
                its, raw, _ = r.loss()
                ax.plot(its, raw, color=color, alpha=0.18, lw=0.7, label=f"{g.arm} logged" if i == 0 else None)
                lows.append(raw.min())
            ax.plot(g.loss.x, g.loss.mean, color=color, lw=1.8, label=f"{g.arm} smoothed")
            ax.fill_between(g.loss.x, g.loss.mean - g.loss.std, g.loss.mean + g.loss.std, color=color, alpha=0.2, lw=0)
            highs.append(np.max(g.loss.mean[len(g.loss.mean) // 20 :]))
        pad = 0.05 * max(max(highs) - min(lows), 1e-12)
        ax.set_ylim(min(lows) - pad, max(highs) + pad)  # the first logged points would flatten the rest

    _save(
        path,
        draw,
        f"Training loss vs iteration ({_band(sr)}; trailing median of {SMOOTHING_WINDOW} logged points)",
        "iteration",
        "training loss",
    )
    return (
        "the training loss per arm, smoothed over the faint logged values: the arm whose loss falls first trains "
        "fastest."
    )


def _kappa_plot(path: str, sr) -> Optional[str]:
    if not sr.kappa:
        return None

    def draw(ax):
        for arm, (xs, med, lo, hi) in sr.kappa.items():
            # the count in the label: two measured points joined by a line are not a trajectory
            label = f"{arm} (median over sites, {plural(len(xs), 'measured point')})"
            ax.plot(xs, med, marker="o", ms=4, color=arm_color(arm), label=label)
            ax.fill_between(xs, lo, hi, color=arm_color(arm), alpha=0.15, lw=0)
        ax.set_yscale("log")

    _save(
        path,
        draw,
        f"Attention conditioning vs {sr.stage.unit} (lr scale {sr.scale:g}; markers: measured points; "
        "band: min-max over sites)",
        sr.stage.unit,
        "κ (condition number, log scale)",
    )
    return (
        "κ per arm at each measured point (median over attention sites, band min to max, log scale): how well "
        "conditioned each arm starts and how training moves it."
    )


def _effects_plot(path: str, sections: List[StageReport]) -> Optional[str]:
    """One panel per section: every comparison of its first table, Δ with its verdict's interval, a line at zero."""
    panels = [sr for sr in sections if sr.comparisons]
    if not panels:
        return None
    from matplotlib.figure import Figure

    heights = [len(sr.comparisons) + 1 for sr in panels]
    fig = Figure(figsize=(7.6, 0.9 + 0.38 * sum(heights)), dpi=100)
    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, sr in zip(axes[:, 0], panels):
        rows = sr.comparisons[::-1]  # the table's first row on top
        for y, s in enumerate(rows):
            iv, color = s.adjusted or s.interval, "black" if s.reference == FACTORIAL else arm_color(s.arm)
            one_seed = s.adjusted is None
            if iv is not None:
                ax.plot(
                    [iv.low, iv.high], [y, y], color=color, lw=1.2 if one_seed else 2.2, ls=":" if one_seed else "-"
                )
            ax.plot([s.mean_difference], [y], "o", ms=6, color=color, mfc="white" if one_seed else color)
            ax.annotate(s.verdict, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{s.label} · {s.metric}" for s in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_title(sr.title, fontsize=10, loc="left")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(
        "Δ vs reference (points; filled: interval over training runs at its family's level; hollow, dotted: one "
        "seed, 95% over evaluation images only)",
        fontsize=8,
    )
    fig.tight_layout()
    _write(path, fig)
    return (
        "every comparison of the table, Δ with the interval its verdict reads (at its family's level), one panel per "
        "stage: a filled point whose bar stays clear of the zero line is a difference over training runs; a hollow "
        "point is one seed per arm, its dotted bar covering only the evaluation images."
    )


def _interaction_plot(path: str, sr: StageReport) -> Optional[str]:
    """One panel per headline metric: the cell means against scale, one line per structure, 95% t-intervals of the
    means over seeds."""
    if not sr.has_factorial or sr.factorial_problem:
        return None
    from matplotlib.figure import Figure
    from scipy import stats

    metrics = sr.stage.headline
    groups = {g.arm: g for g in sr.arms}
    fig = Figure(figsize=(3.8 * len(metrics) + 1.6, 3.6), dpi=100)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for offset, structure in zip((-0.02, 0.02), STRUCTURES):
            cells = [groups[CELLS[(structure, scale)]] for scale in SCALES]
            means = [g.value(metric.header) for g in cells]
            halves = [
                stats.t.ppf(0.975, len(g.runs) - 1) * g.final[metric.header][1] / len(g.runs) ** 0.5
                if len(g.runs) > 1
                else 0.0
                for g in cells
            ]
            color = arm_color(cells[1].arm)  # the structure's own arm at the conditioned scale
            ax.errorbar(
                [offset, 1 + offset],
                means,
                yerr=halves,
                marker="o",
                capsize=4,
                color=color,
                label=f"{structure} structure",
            )
        ax.set_xticks([0, 1], [f"{scale} scale" for scale in SCALES])
        ax.set_xlim(-0.4, 1.4)
        ax.set_ylabel(metric.label)
        ax.grid(True, alpha=0.3)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=9, frameon=False)
    fig.suptitle(f"{sr.title}: structure × scale (lr scale {sr.scale:g})", fontsize=10)
    fig.tight_layout()
    _write(path, fig)
    return (
        "the four arms of the structure × scale design, one line per structure across the two scales: parallel "
        "lines, no interaction; the vertical gap between them is the structure's effect, the slope the scale's. The "
        "bars are each cell's 95% interval over its seeds, unpaired: the effects' paired intervals are in the table."
    )


def _figures_key(report: ArmsReport, inputs: str) -> str:
    """A digest of what the figures show: ``inputs`` (the report's tables), every run's records and training loss and
    the report code."""
    digest = hashlib.sha1(inputs.encode())
    code = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py")))
    for path in code + [
        os.path.join(r.path, name)
        for sr in report.stages
        for r in sr.runs
        for name in (RESULTS_FILENAME, METRICS_FILENAME)
    ]:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(path.encode() + f.read())
    return digest.hexdigest()


def write_figures(report: ArmsReport, output_dir: str, *, inputs: str, cache_dir: str) -> Dict[str, str]:
    """Write every figure of the report into ``output_dir`` (an arm's first ``predictions.png`` copied in as
    ``predictions_<arm>.png``); returns file name -> the sentence on what to read from it, per figure written.
    Figures drawn there before from the same runs, ``inputs`` and code are kept (record: ``cache_dir``/figures.json)."""
    key, record_path = _figures_key(report, inputs), os.path.join(cache_dir, "figures.json")
    try:
        with open(record_path) as f:
            record = json.load(f)
        if record["key"] == key and all(os.path.isfile(os.path.join(output_dir, n)) for n in record["figures"]):
            return record["figures"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: the figures are drawn
        pass
    written = {EFFECTS_FIGURE: _effects_plot(os.path.join(output_dir, EFFECTS_FIGURE), report.stages)}
    for sr in (sr for sr in report.stages if sr.groups or sr.failed):
        jobs = [(name, _metric_plot, (m,)) for m, name in sr.stage.plots]
        jobs += [(sr.stage.loss_plot, _loss_plot, ()), (sr.stage.kappa_plot, _kappa_plot, ())]
        jobs.append((INTERACTION_FIGURE, _interaction_plot, ()))
        for name, plot, args in jobs:
            written[sr.prefix + name] = plot(os.path.join(output_dir, sr.prefix + name), sr, *args)
        for g in sr.arms:
            run = next((r for r in g.runs if os.path.isfile(os.path.join(r.path, PREDICTIONS_FIGURE))), None)
            if run is not None:
                name = f"{sr.prefix}predictions_{g.arm}.png"
                shutil.copyfile(os.path.join(run.path, PREDICTIONS_FIGURE), os.path.join(output_dir, name))
                written[name] = (
                    f"{run.name}'s predictions on a few evaluation images at the end of training: what "
                    "its boxes and masks look like beside the other arms'."
                )
    written = {name: text for name, text in written.items() if text}
    os.makedirs(cache_dir, exist_ok=True)
    atomic_write(record_path, json.dumps({"key": key, "figures": written}, indent=1))
    return written
