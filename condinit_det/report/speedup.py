"""The speed-up to the default arm's final value, with runs that never reach it kept as censored.

Per seed, an arm *reaches* the same seed's default final value at the first evaluation (iteration or
epoch) where its metric is at least that value (at most, for the training loss); the speed-up is
``(1 - reached / default_final) * 100`` percent. A run that never reaches it is right-censored at its
last evaluation: it would reach it later, if ever, so its speed-up is below
``(1 - last / default_final) * 100``. It is never dropped.

Over seeds (:func:`summarize_reaches`): the fraction of seeds that reached it, and the median speed-up
as Kaplan–Meier gives it (every run is censored at the end of the schedule, after every observed
reach, so the Kaplan–Meier median is the ceil(n / 2)-th best seed, censored seeds counting as worst),
with a distribution-free interval from the order statistics: the k-th best and k-th worst seeds cover
the median with probability 1 - 2 P(Binomial(n, 1/2) < k) (at least that, with ties), censored ones
included (a censored bound reads "below b"). The largest k reaching 95% is used; below 6 seeds none
does, and the interval is [worst, best] with its smaller coverage stated.

One seed (:func:`image_bootstrap_speedup`): the same first reach on resamples of the evaluation images
(each evaluation of the arm and the default's final evaluation scored on the same resample), a
percentile interval over resamples with censored resamples at the bottom. It covers evaluation-set
sampling of these two trained models only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .statistics import IMAGES, RUNS, describe_unit

__all__ = ["Reach", "SpeedupSummary", "first_reach_index", "image_bootstrap_speedup", "median_interval_rank",
           "reach_of", "summarize_reaches"]


@dataclass(frozen=True)
class Reach:
    """One seed: first x at which the arm reaches the same seed's default final value (None: censored)."""

    seed: Optional[int]
    reached: Optional[int]
    last: int  # the arm's last evaluation (the censoring point)
    default_final: int  # x of the default run's final evaluation

    @property
    def censored(self) -> bool:
        return self.reached is None

    @property
    def speedup(self) -> float:
        """Speed-up in percent when reached; otherwise the bound it lies below."""
        x = self.last if self.reached is None else self.reached
        return (1.0 - x / self.default_final) * 100.0


def first_reach_index(values: np.ndarray, target, lower_is_better: bool = False) -> np.ndarray:
    """
    Index of the first evaluation reaching ``target`` along axis 0, or -1 when none does.

    values: [E, ...] one row per evaluation, in increasing x; target broadcasts against values[0].
    """
    v = np.asarray(values, dtype=np.float64)
    hit = v <= target if lower_is_better else v >= target
    hit &= np.isfinite(v)
    first = np.argmax(hit, axis=0)
    return np.where(hit.any(axis=0), first, -1)


def reach_of(seed: Optional[int], x: Sequence[int], values: Sequence[float], target: float, default_final: int,
             lower_is_better: bool = False) -> Optional[Reach]:
    """The :class:`Reach` of one run's curve (x [E], values [E]); None without evaluations or target."""
    x = np.asarray(x, dtype=np.int64)
    if not len(x) or not math.isfinite(target) or not default_final:
        return None
    i = int(first_reach_index(np.asarray(values, dtype=np.float64), target, lower_is_better))
    return Reach(seed, int(x[i]) if i >= 0 else None, int(x[-1]), int(default_final))


def median_interval_rank(n: int, level: float = 0.95):
    """(k, coverage): the largest k with P(k-th best <= median <= k-th worst) = 1 - 2 P(Bin(n, 1/2) < k)
    at least ``level``; k = 1 (its coverage, below ``level``) when none is."""
    from scipy import stats

    best = 1
    for k in range(1, n // 2 + 1):
        if 1.0 - 2.0 * stats.binom.cdf(k - 1, n, 0.5) >= level:
            best = k
    return best, float(1.0 - 2.0 * stats.binom.cdf(best - 1, n, 0.5))


@dataclass(frozen=True)
class Bound:
    """A speed-up value, or the bound a censored one lies below."""

    value: float
    below: bool = False

    def text(self, digits: int = 1) -> str:
        return f"< {self.value:.{digits}f}" if self.below else f"{self.value:.{digits}f}"


@dataclass(frozen=True)
class SpeedupSummary:
    """A speed-up over seeds (or over image resamples of one seed), censoring kept."""

    n: int  # seeds
    reached: int  # seeds that reached the default's final value
    estimate: Bound  # Kaplan–Meier median over seeds, or the one seed's value
    low: Optional[Bound]  # interval; None: no interval
    high: Optional[Bound]
    coverage: float  # nominal coverage of the interval (NaN without one)
    method: str
    replication: str
    mean: float = float("nan")  # mean speed-up when every seed reached it
    std: float = float("nan")
    resamples_reached: float = float("nan")  # image bootstrap: fraction of resamples that reached it

    @property
    def fraction(self) -> float:
        return self.reached / self.n if self.n else float("nan")

    @property
    def unit(self) -> str:
        return describe_unit(self.replication, self.n)


def _ranked(reaches: Sequence[Reach]):
    """Seeds from best to worst speed-up; censored seeds last, those with the higher bound first."""
    return sorted(reaches, key=lambda r: (r.censored, -r.speedup))


def _bound(r: Reach) -> Bound:
    return Bound(r.speedup, r.censored)


def summarize_reaches(reaches: Sequence[Reach], level: float = 0.95) -> SpeedupSummary:
    """Fraction reached, Kaplan–Meier median and its order-statistic interval over seeds (module doc)."""
    reaches = list(reaches)
    n = len(reaches)
    if n == 0:
        raise ValueError("summarize_reaches needs at least one seed")
    ranked = _ranked(reaches)
    reached = sum(not r.censored for r in reaches)
    median = _bound(ranked[(n + 1) // 2 - 1])
    values = [r.speedup for r in reaches]
    mean, std = (float(np.mean(values)), float(np.std(values, ddof=1)) if n > 1 else 0.0) if reached == n \
        else (float("nan"), float("nan"))
    if n == 1:
        return SpeedupSummary(1, reached, median, None, None, float("nan"), "one seed: no interval over seeds",
                              RUNS, mean, std)
    k, coverage = median_interval_rank(n, level)
    method = (f"Kaplan–Meier median over {n} seeds; order-statistic interval (seeds {k} and {n + 1 - k} of {n}), "
              f"coverage {coverage:.3f}")
    return SpeedupSummary(n, reached, median, _bound(ranked[n - k]), _bound(ranked[k - 1]), coverage, method,
                          RUNS, mean, std)


def image_bootstrap_speedup(estimate: Reach, x: Sequence[int], arm_resampled: Callable[[int, np.ndarray], np.ndarray],
                            default_final_resampled: np.ndarray, *, level: float = 0.95,
                            lower_is_better: bool = False) -> SpeedupSummary:
    """
    Percentile interval of one seed's speed-up over resamples of the evaluation images.

    Args:
        estimate: the seed's speed-up on the full evaluation set.
        x: [E] the arm's evaluations (increasing).
        arm_resampled: (evaluation index, resample rows [b]) -> the arm's metric at that evaluation on
            those resamples [b]; called in increasing evaluation order, only for resamples that have not
            reached the target yet (later evaluations are never computed once every resample reached it).
        default_final_resampled: [B] the default run's final metric on every resample (the targets).
    """
    targets = np.asarray(default_final_resampled, dtype=np.float64)
    num_b = targets.size
    x = np.asarray(x, dtype=np.int64)
    reach = np.full(num_b, -1, dtype=np.int64)
    for e in range(len(x)):
        open_rows = np.flatnonzero(reach < 0)
        if not open_rows.size:
            break
        values = np.asarray(arm_resampled(e, open_rows), dtype=np.float64)
        hit = (values <= targets[open_rows]) if lower_is_better else (values >= targets[open_rows])
        reach[open_rows[hit & np.isfinite(values)]] = e
    censored = reach < 0
    speedups = np.where(censored, -np.inf, (1.0 - x[np.maximum(reach, 0)] / estimate.default_final) * 100.0)
    ordered = np.sort(speedups)
    alpha = (1.0 - level) / 2
    bound = (1.0 - x[-1] / estimate.default_final) * 100.0

    def at(q: float) -> Bound:
        v = ordered[min(int(math.floor(q * num_b)), num_b - 1)]
        return Bound(bound, True) if not np.isfinite(v) else Bound(float(v))

    return SpeedupSummary(1, int(not estimate.censored), _bound(estimate), at(alpha), at(1.0 - alpha), level,
                          f"image bootstrap of one seed's first reach, B={num_b}, percentile", IMAGES,
                          resamples_reached=float(1.0 - censored.mean()))
