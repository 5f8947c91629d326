"""Small statistics for comparing arms: mean ± std over seeds, paired intervals and verdicts.

The design of an arm comparison is paired: runs with the same training seed share data order
and every non-attention weight, so an arm is compared with the default arm through the
per-seed differences. With two or more paired seeds the interval is a Student t-interval over
those differences; with one seed it is the percentile interval of a paired bootstrap over
evaluation images (:mod:`condinit_det.evaluation.bootstrap`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "BETTER",
    "NOT_DISTINGUISHABLE",
    "WORSE",
    "Interval",
    "mean_std",
    "percentile_interval",
    "t_interval",
    "verdict",
]

BETTER = "better than default"
WORSE = "worse than default"
NOT_DISTINGUISHABLE = "not distinguishable from default at 95%"


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval and how it was obtained."""

    estimate: float
    low: float
    high: float
    method: str
    level: float = 0.95

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value); NaN for none or any NaN."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.isnan(v).any():
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def t_interval(differences: Sequence[float], level: float = 0.95) -> Interval:
    """Student t-interval for the mean of paired differences (n - 1 degrees of freedom, n >= 2)."""
    from scipy import stats

    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        raise ValueError(f"a t-interval needs at least 2 paired differences, got {d.size}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1)) * sd / math.sqrt(d.size)
    return Interval(mean, mean - half, mean + half, f"paired t-interval over {d.size} seeds", level)


def percentile_interval(estimate: float, resampled: Sequence[float], level: float = 0.95,
                        method: str = "paired bootstrap") -> Interval:
    """Percentile interval of bootstrap replicates around ``estimate`` (the full-sample value)."""
    r = np.asarray(resampled, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        raise ValueError("a percentile interval needs at least one finite bootstrap replicate")
    alpha = (1.0 - level) / 2
    low, high = np.quantile(r, [alpha, 1.0 - alpha])
    return Interval(float(estimate), float(low), float(high), method, level)


def verdict(interval: Optional[Interval], higher_is_better: bool = True) -> str:
    """One of :data:`BETTER`, :data:`WORSE`, :data:`NOT_DISTINGUISHABLE` (interval excludes 0 or not)."""
    if interval is None or not (math.isfinite(interval.low) and math.isfinite(interval.high)):
        return "no interval"
    if interval.low > 0:
        return BETTER if higher_is_better else WORSE
    if interval.high < 0:
        return WORSE if higher_is_better else BETTER
    return NOT_DISTINGUISHABLE
