"""Probability of improvement, paired over seeds: P(arm run > default run with the same seed).

As rliable's probability of improvement (Agarwal et al., NeurIPS 2021), but paired: the runs of one
seed share data order and non-attention weights, so each seed contributes one comparison, a win (1),
a tie (1/2) or a loss (0); the estimate is their mean. Two 95% intervals:

- bootstrap: percentile interval over resamples of the seeds (rliable's; with n seeds it takes at
  most n + 1 values, and when every seed wins it is [1, 1]);
- exact: Clopper–Pearson for wins out of n (a tie counts half), which covers at least 95% at every n.

Neither carries a verdict; the difference of means does (:mod:`condinit_det.report.paired`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Improvement", "ImprovementBatch", "probability_of_improvement", "probability_of_improvement_batch"]


@dataclass(frozen=True)
class ImprovementBatch:
    """Arrays with the batch shape of the differences."""

    estimate: np.ndarray
    boot_low: np.ndarray
    boot_high: np.ndarray
    exact_low: np.ndarray
    exact_high: np.ndarray


@dataclass(frozen=True)
class Improvement:
    """P(arm run > default run with the same seed) over ``n`` paired seeds, with both intervals."""

    estimate: float
    boot_low: float
    boot_high: float
    exact_low: float
    exact_high: float
    n: int
    level: float = 0.95


def _wins(d: np.ndarray) -> np.ndarray:
    return (d > 0).sum(axis=-1) + 0.5 * (d == 0).sum(axis=-1)


def probability_of_improvement_batch(differences, rng: np.random.Generator, num_resamples: int = 1000,
                                     level: float = 0.95) -> ImprovementBatch:
    """
    Args:
        differences: [..., n] arm minus default per paired seed (higher is better; negate otherwise).
        rng: draws the seed resamples ([..., B, n] indices).
        num_resamples: B (0: no bootstrap interval, NaN).
    """
    from scipy import stats

    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    if n < 1 or num_resamples < 0:
        raise ValueError(f"probability of improvement needs >= 1 paired seed and >= 0 resamples; got {n} and "
                         f"{num_resamples}")
    wins = _wins(d)
    alpha = (1.0 - level) / 2
    if num_resamples:
        idx = rng.integers(0, n, size=d.shape[:-1] + (int(num_resamples), n))
        resampled = _wins(np.take_along_axis(d[..., None, :], idx, axis=-1)) / n
        boot_low, boot_high = np.quantile(resampled, [alpha, 1.0 - alpha], axis=-1)
    else:  # bootstrap off: the exact interval only
        boot_low = boot_high = np.full(d.shape[:-1], np.nan)
    with np.errstate(invalid="ignore"):
        exact_low = np.where(wins > 0, stats.beta.ppf(alpha, np.maximum(wins, 1e-12), n - wins + 1), 0.0)
        exact_high = np.where(wins < n, stats.beta.ppf(1.0 - alpha, wins + 1, np.maximum(n - wins, 1e-12)), 1.0)
    return ImprovementBatch(wins / n, boot_low, boot_high, exact_low, exact_high)


def probability_of_improvement(differences, rng: np.random.Generator, num_resamples: int = 1000,
                               level: float = 0.95) -> Improvement:
    """The scalar form of :func:`probability_of_improvement_batch` for one vector of differences [n]."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"differences must be a vector [n]; got shape {d.shape}")
    b = probability_of_improvement_batch(d, rng, num_resamples, level)
    return Improvement(float(b.estimate), float(b.boot_low), float(b.boot_high), float(b.exact_low),
                       float(b.exact_high), int(d.size), level)
