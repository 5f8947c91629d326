"""Plots of the comparison: one colour per arm everywhere, titled, labelled, legend outside."""
from __future__ import annotations

import io
from typing import Callable, Dict, List

import numpy as np

from condinit_det.stage import Metric
from condinit_det.utils.fileio import atomic_write

from .summary import StageReport

__all__ = ["ARM_COLORS", "arm_color", "plot_stage"]

# Fixed mapping (colour-blind safe): the same arm has the same colour in every plot.
ARM_COLORS = {"default": "#4D4D4D", "mimetic": "#0072B2", "conditioned": "#D55E00", "scale_matched": "#009E73"}
_EXTRA_COLORS = ("#CC79A7", "#E69F00", "#56B4E9", "#F0E442")


def arm_color(arm: str) -> str:
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    return _EXTRA_COLORS[sum(map(ord, arm)) % len(_EXTRA_COLORS)]


def _save(path: str, draw: Callable, title: str, xlabel: str, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.6, 4.2), dpi=100)
    try:
        draw(ax)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=9, frameon=False)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())


def _band_note(sr: StageReport) -> str:
    multi = any(len(g.runs) > 1 for g in sr.arms)
    return f"lr scale {sr.scale:g}" + ("; mean ± 1 std over seeds" if multi else "")


def _metric_plot(path: str, sr: StageReport, metric: Metric) -> bool:
    groups = [g for g in sr.arms if len(g.curves[metric.key].x) and np.isfinite(g.curves[metric.key].mean).any()]
    failed = [(m, *m.run.curve(metric)) for m in sr.failed if m.lr_scale == sr.scale and m.run is not None]
    failed = [(m, x, y) for m, x, y in failed if len(x) and np.isfinite(y).any()]
    if not groups and not failed:
        return False

    def draw(ax):
        for g in groups:
            c, color = g.curves[metric.key], arm_color(g.arm)
            seeds = f"{len(g.runs)} seed{'s' * (len(g.runs) > 1)}"
            ax.plot(c.x, c.mean, marker="o", ms=3, color=color, label=f"{g.arm} ({seeds})")
            if len(g.runs) > 1:
                ax.fill_between(c.x, c.mean - c.std, c.mean + c.std, color=color, alpha=0.2, lw=0)
        for m, x, y in failed:  # each stopped run on its own, ending where it stopped
            ax.plot(x, y, ls=":", marker="x", ms=4, color=arm_color(m.arm), label=f"{m.arm} seed {m.seed}: {m.reason}")
        x_final, value = sr.target.get(metric.key, (None, float("nan")))
        if x_final is not None and np.isfinite(value):
            ax.axhline(value, color=arm_color("default"), ls="--", lw=1, label="default final")

    name = metric.label.split(" (")[0]
    title = f"{name[0].upper() + name[1:]} vs {sr.stage.unit} ({_band_note(sr)})"
    _save(path, draw, title, sr.stage.unit, metric.label)
    return True


def _loss_plot(path: str, sr: StageReport) -> bool:
    groups = [g for g in sr.arms if g.loss is not None and len(g.loss.x)]
    if not groups:
        return False

    def draw(ax):
        lows, highs = [], []
        for g in groups:
            color = arm_color(g.arm)
            for i, r in enumerate(g.runs):
                its, raw, _ = r.loss()
                ax.plot(its, raw, color=color, alpha=0.18, lw=0.7, label=f"{g.arm} logged" if i == 0 else None)
                lows.append(raw.min())
            c = g.loss
            ax.plot(c.x, c.mean, color=color, lw=1.8, label=f"{g.arm} smoothed")
            if len(g.runs) > 1:
                ax.fill_between(c.x, c.mean - c.std, c.mean + c.std, color=color, alpha=0.2, lw=0)
            highs.append(np.max(c.mean[len(c.mean) // 20:]))
        lo, hi = min(lows), max(highs)
        pad = 0.05 * max(hi - lo, 1e-12)
        ax.set_ylim(lo - pad, hi + pad)  # the first logged points would flatten the rest

    _save(path, draw, f"Training loss vs iteration ({_band_note(sr)}; trailing median of 20 logged points)",
          "iteration", "training loss")
    return True


def _kappa_plot(path: str, sr: StageReport) -> bool:
    if not sr.kappa:
        return False

    def draw(ax):
        for arm, (its, med, lo, hi) in sr.kappa.items():
            color = arm_color(arm)
            # the count in the label: two measured points joined by a line are not a trajectory
            ax.plot(its, med, marker="o", ms=4, color=color,
                    label=f"{arm} (median over sites, {len(its)} measured point{'s' if len(its) != 1 else ''})")
            ax.fill_between(its, lo, hi, color=color, alpha=0.15, lw=0)
        for arm, (its, med) in sr.kappa_heads.items():
            ax.plot(its, med, ls="--", marker="x", ms=4, color=arm_color(arm),
                    label=f"{arm} (median over heads, {len(its)} measured point{'s' if len(its) != 1 else ''})")
        ax.set_yscale("log")

    _save(path, draw, f"Attention conditioning vs {sr.stage.unit} (lr scale {sr.scale:g}; markers: measured points; "
                      "band: min-max over sites)",
          sr.stage.unit, "κ (condition number, log scale)")
    return True


def plot_stage(sr: StageReport, output_dir: str) -> Dict[str, str]:
    """Write the stage's plots into ``output_dir``; returns file name -> path of those written."""
    import os

    written: Dict[str, str] = {}
    jobs: List = [(name, lambda p, m=m: _metric_plot(p, sr, m)) for m, name in sr.stage.plots]
    jobs += [(sr.stage.loss_plot, lambda p: _loss_plot(p, sr)), (sr.stage.kappa_plot, lambda p: _kappa_plot(p, sr))]
    for name, job in jobs:
        path = os.path.join(output_dir, name)
        if job(path):
            written[name] = path
    return written
