"""Seed-averaged curves and the convergence metric.

The convergence metric is the paper's: the first x (iteration or epoch) at which an arm reaches
the default arm's final value, and the speed-up ``(1 - x / x_default_final) * 100`` percent.
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Curve", "first_reach", "kappa_curve", "kappa_heads_curve", "seed_mean", "speedup"]


class Curve(NamedTuple):
    """A seed-averaged curve: x [N], mean [N], sample std [N] (0 for one seed)."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @property
    def final(self) -> Tuple[Optional[int], float]:
        return (int(self.x[-1]), float(self.mean[-1])) if len(self.x) else (None, float("nan"))


def seed_mean(curves: Sequence[Tuple[np.ndarray, np.ndarray]], interpolate: bool = False) -> Curve:
    """
    Mean ± std over seeds at the x values every seed has. With ``interpolate`` (training loss,
    logged at possibly different iterations) seeds without two common points are linearly
    interpolated onto the first seed's x values inside the range all of them cover.
    """
    curves = [(np.asarray(x), np.asarray(y, dtype=np.float64)) for x, y in curves]
    if not curves or any(len(x) == 0 for x, _ in curves):
        empty = np.zeros(0)
        return Curve(np.zeros(0, dtype=np.int64), empty, empty)
    common = np.asarray(sorted(set.intersection(*[set(x.tolist()) for x, _ in curves])), dtype=np.int64)
    if interpolate and len(common) < 2 and len(curves) > 1:
        lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
        grid = curves[0][0][(curves[0][0] >= lo) & (curves[0][0] <= hi)]
        vals = np.stack([np.interp(grid, x, y) for x, y in curves])
        common = grid.astype(np.int64)
    else:
        vals = (np.stack([y[np.searchsorted(x, common)] for x, y in curves]) if len(common)
                else np.zeros((len(curves), 0)))
    std = vals.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(common))
    return Curve(common, vals.mean(axis=0), std)


def first_reach(x: np.ndarray, values: np.ndarray, target: float, lower_is_better: bool = False) -> Optional[int]:
    """First x whose value reaches ``target`` (>=, or <= when lower is better); None if never."""
    if not math.isfinite(target):
        return None
    values = np.asarray(values, dtype=np.float64)
    hit = values <= target if lower_is_better else values >= target
    idx = np.nonzero(hit)[0]
    return int(x[idx[0]]) if len(idx) else None


def speedup(reached: Optional[int], default_final: Optional[int]) -> Optional[float]:
    """``(1 - reached / default_final) * 100`` percent; None when not reached."""
    if reached is None or not default_final:
        return None
    return (1.0 - reached / default_final) * 100.0


def kappa_curve(records_per_run: Sequence[List[dict]], unit: str = "iteration"):
    """Median, min and max of κ over sites (and seeds) per ``unit`` (the record field of the stage's x axis:
    ``"iteration"`` or ``"epoch"``), from "conditioning" records."""
    by_it = {}
    for records in records_per_run:
        for r in records:
            if r["kind"] == "conditioning" and r.get("kappa") is not None:
                k = float(r["kappa"])
                if math.isfinite(k) and k > 0:
                    by_it.setdefault(r[unit], []).append(k)
    its = np.asarray(sorted(by_it), dtype=np.int64)
    med = np.asarray([np.median(by_it[i]) for i in its])
    lo = np.asarray([np.min(by_it[i]) for i in its])
    hi = np.asarray([np.max(by_it[i]) for i in its])
    return its, med, lo, hi


def kappa_heads_curve(records_per_run: Sequence[List[dict]], unit: str = "iteration"):
    """Median of the per-head κ (``kappa_heads``) over every head of every site (and seed) per ``unit``.

    Records without per-head values (matrix-free, or W_O kept) are skipped; a rank-deficient head
    (κ stored as null) counts as infinite, so it can move the median. Returns (x values, median).
    """
    by_it = {}
    for records in records_per_run:
        for r in records:
            heads = r.get("kappa_heads") if r["kind"] == "conditioning" else None
            if heads:
                vals = [math.inf if k is None else float(k) for k in heads]
                by_it.setdefault(r[unit], []).extend(vals)
    its = np.asarray(sorted(by_it), dtype=np.int64)
    med = np.asarray([np.median(by_it[i]) for i in its], dtype=float)
    keep = np.isfinite(med)
    return its[keep], med[keep]
