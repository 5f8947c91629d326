"""Every statistic of the report: intervals naming their unit of replication, the verdict read from an interval, the
probability of improvement, the censored speed-up and seed planning (docs/statistics.md defines each one and gives
its measured coverage). Functions of arrays take leading batch dimensions (``bench/calibration.py`` runs them on many
simulated experiments at once). scipy is imported where used: a one-seed report never needs its 0.9 s import."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

RUNS, IMAGES, BOTH = "runs", "images", "both"
UNITS = {
    RUNS: "training runs",
    IMAGES: "evaluation images (one trained model per arm)",
    BOTH: "training runs and evaluation images",
}  # what an interval replicates, as the tables print it
BETTER, WORSE, NO_DIFFERENCE, TOO_FEW_SEEDS = "better", "worse", "no difference shown", "too few seeds"
IMAGE_BOOTSTRAP, PAIRED_T, TWO_LEVEL_T = "image bootstrap", "paired t", "two-level t"  # the intervals' methods


def report_method(num_seeds: int, per_image: bool) -> Optional[str]:
    """The interval the report uses for ``num_seeds`` paired seeds, with or without per-image data of every paired
    run: one seed, :data:`IMAGE_BOOTSTRAP` (or none); more, :data:`TWO_LEVEL_T` (or :data:`PAIRED_T`)."""
    if num_seeds == 1:
        return IMAGE_BOOTSTRAP if per_image else None
    return None if num_seeds < 1 else (TWO_LEVEL_T if per_image else PAIRED_T)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided interval at ``level``, how it was obtained and what it covers.

    ``replication``: :data:`RUNS`, :data:`IMAGES` or :data:`BOTH` (``unit`` words it); ``p_value``: the two-sided p
    of "no difference" by the same method (NaN when it has none); ``se``: a t-type interval's standard error.
    """

    estimate: float
    low: float
    high: float
    method: str
    replication: str = RUNS
    num_seeds: int = 0
    p_value: float = float("nan")
    se: float = float("nan")
    level: float = 0.95

    @property
    def unit(self) -> str:
        return UNITS[self.replication]


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value); NaN for none or any NaN."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.isnan(v).any():
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def paired_t(differences, level: float = 0.95):
    """Student t-interval of the mean of paired differences [..., n] (n >= 2): arrays (mean, low, high, two-sided p,
    standard error). Identical differences give a zero-width interval and p = 0 (p = 1 when all are 0)."""
    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 paired differences, got {n}")
    from scipy import stats

    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's precision-loss note on identical differences
        test = stats.ttest_1samp(d, 0.0, axis=-1)
        interval = test.confidence_interval(level)
    mean = d.mean(axis=-1)
    se = d.std(axis=-1, ddof=1) / math.sqrt(n)
    p = np.where(se > 0, test.pvalue, np.where(mean == 0, 1.0, 0.0))
    return mean, interval.low, interval.high, p, se


def t_interval(differences: Sequence[float], level: float = 0.95) -> Interval:
    """Paired t-interval over seeds (:func:`paired_t`): training-run variance, the evaluation set held fixed."""
    d = np.asarray(differences, dtype=np.float64)
    mean, low, high, p, se = (float(v) for v in paired_t(d, level))
    return Interval(mean, low, high, f"paired t-interval over {d.size} seeds", RUNS, int(d.size), p, se, level)


def bootstrap_p_value(replicates) -> np.ndarray:
    """Two-sided p of "no difference" from bootstrap replicates [..., B]: 2 (1 + smaller tail count) / (B + 1), <= 1."""
    r = np.asarray(replicates, dtype=np.float64)
    finite = np.isfinite(r)
    tail = np.minimum(((r <= 0) & finite).sum(axis=-1), ((r >= 0) & finite).sum(axis=-1))
    return np.minimum(1.0, 2.0 * (1.0 + tail) / (finite.sum(axis=-1) + 1.0))


def percentile_interval(estimate: float, resampled: Sequence[float], method: str = "image bootstrap") -> Interval:
    """95% percentile interval of one seed's image-bootstrap replicates around ``estimate``, with their p-value."""
    r = np.asarray(resampled, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        raise ValueError("a percentile interval needs at least one finite bootstrap replicate")
    low, high = np.quantile(r, [0.025, 0.975])
    return Interval(float(estimate), float(low), float(high), method, IMAGES, 1, float(bootstrap_p_value(r)))


@dataclass(frozen=True)
class TwoLevel:
    """Results of :func:`two_level_bootstrap`, arrays with the batch shape of its inputs."""

    estimate: np.ndarray
    replicates: np.ndarray  # [..., B]
    percentile_low: np.ndarray
    percentile_high: np.ndarray
    percentile_p_value: np.ndarray
    var_seeds: np.ndarray  # s^2 / n
    var_images: np.ndarray  # evaluation-image variance shared by the seeds (>= 0)
    p_value: np.ndarray  # of the t-scaled interval
    num_seeds: int

    @property
    def se(self) -> np.ndarray:
        return np.sqrt(self.var_seeds + self.var_images)

    def half_width(self, level: float = 0.95) -> np.ndarray:
        """h of the t-scaled interval estimate ± h at ``level``."""
        return _pivot_half_width(self.var_seeds, self.var_images, self.num_seeds, level)

    def interval(self, level: float = 0.95) -> Interval:
        """The scalar t-scaled interval at ``level``."""
        est, h = float(self.estimate), float(self.half_width(level))
        method = f"two-level bootstrap (seeds x images), t-scaled, {self.num_seeds} seeds"
        return Interval(est, est - h, est + h, method, BOTH, self.num_seeds, float(self.p_value), float(self.se), level)

    def percentile(self) -> Interval:
        """The scalar 95% percentile interval of the replicates."""
        return Interval(
            float(self.estimate),
            float(self.percentile_low),
            float(self.percentile_high),
            f"two-level bootstrap (seeds x images), percentile, {self.num_seeds} seeds",
            BOTH,
            self.num_seeds,
            float(self.percentile_p_value),
        )


# The generalized pivot integrates over X by the midpoint rule in t at the probabilities u = t^3 of X (weights du,
# summing to 1): dense where X is small, the heavy tail that a family's level (e.g. 99.7%) reaches.
_T = (np.arange(100) + 0.5) / 100
_PIVOT_U, _PIVOT_WEIGHTS = _T**3, _T**2 / (_T**2).sum()


def _pivot_scales(var_seeds: np.ndarray, var_images: np.ndarray, n: int) -> np.ndarray:
    """[..., K] sqrt(s^2 / n (n - 1) / X + v) at K quantiles of X, chi-square with n - 1 degrees of freedom."""
    from scipy import stats

    chi2 = stats.chi2.ppf(_PIVOT_U, n - 1)
    return np.sqrt(var_seeds[..., None] * (n - 1) / chi2 + var_images[..., None])


def _pivot_tail(value: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """P(|Z| scale > value) integrated over the scales [..., K]; Z standard normal."""
    from scipy.special import ndtr

    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scales > 0, value[..., None] / scales, np.inf)
    return (2.0 * ndtr(-np.abs(z))) @ _PIVOT_WEIGHTS


def _pivot_half_width(var_seeds: np.ndarray, var_images: np.ndarray, n: int, level: float) -> np.ndarray:
    """h with P(|Z| scale > h) = 1 - level, by Newton's method from max(t sqrt(seeds), z sqrt(images)), which is at
    most h: the tail is convex and decreasing in h, so every step stays below h and converges to it."""
    from scipy import stats

    scales = _pivot_scales(var_seeds, var_images, n)
    h = np.maximum(
        stats.t.ppf(0.5 + level / 2, n - 1) * np.sqrt(var_seeds), stats.norm.ppf(0.5 + level / 2) * np.sqrt(var_images)
    )
    for _ in range(10):
        with np.errstate(divide="ignore", invalid="ignore"):
            z = h[..., None] / scales
            slope = -(np.sqrt(2 / np.pi) * np.exp(-0.5 * z**2) / scales) @ _PIVOT_WEIGHTS
            h = np.where(slope < 0, h - (_pivot_tail(h, scales) - (1.0 - level)) / slope, h)
    return h


def two_level_bootstrap(estimates, replicates, rng: np.random.Generator) -> TwoLevel:
    """Two-level paired bootstrap of the mean difference over n >= 2 seeds (docs/statistics.md, "Intervals") from
    ``estimates`` [..., n], the per-seed differences (or any fixed weighted sum of a seed's arms), and ``replicates``
    [..., n, B], the same on B image resamples, each the same images for every seed and arm; ``rng`` draws the seed
    resamples of the percentile interval. The t-scaled interval is the generalized pivot of the seeds' variance
    s^2 / n and the evaluation-image variance every run shares; its p is the pivot's tail at |estimate|, so its
    interval at level 1 - a excludes 0 exactly when p < a."""
    est = np.asarray(estimates, dtype=np.float64)
    rep = np.asarray(replicates, dtype=np.float64)
    n, num_b = est.shape[-1], rep.shape[-1]
    if n < 2 or rep.shape[-2:] != (n, num_b) or num_b < 2:
        raise ValueError(
            f"two_level_bootstrap needs estimates [..., n] and replicates [..., n, B] with n >= 2 seeds "
            f"and B >= 2 resamples; got {est.shape} and {rep.shape}"
        )
    seeds = rng.integers(0, n, size=est.shape[:-1] + (num_b, n))
    boot = np.take_along_axis(np.swapaxes(rep, -1, -2), seeds, axis=-1).mean(axis=-1)  # [..., B]
    p_low, p_high = np.quantile(boot, [0.025, 0.975], axis=-1)
    estimate = est.mean(axis=-1)
    var_seeds = est.var(axis=-1, ddof=1) / n
    centred = rep - rep.mean(axis=-1, keepdims=True)
    per_seed = (centred**2).sum(axis=-1) / (num_b - 1)  # [..., n]
    of_sum = (centred.sum(axis=-2) ** 2).sum(axis=-1) / (num_b - 1)  # variance of the sum over seeds
    var_images = np.maximum((of_sum - per_seed.sum(axis=-1)) / (n * (n - 1)), 0.0)
    scales = _pivot_scales(var_seeds, var_images, n)
    p_value = np.where(
        scales.max(axis=-1) > 0,
        np.minimum(_pivot_tail(np.abs(estimate), scales), 1.0),
        np.where(estimate == 0, 1.0, 0.0),
    )
    return TwoLevel(estimate, boot, p_low, p_high, bootstrap_p_value(boot), var_seeds, var_images, p_value, n)


def verdict(interval: Optional[Interval], higher_is_better: bool = True) -> str:
    """The verdict read from the interval at its family's level (of an arm minus its reference, or an effect):
    :data:`TOO_FEW_SEEDS` without one over two or more seeds, :data:`BETTER` or :data:`WORSE` where it excludes zero,
    else :data:`NO_DIFFERENCE`."""
    if interval is None or interval.num_seeds < 2:
        return TOO_FEW_SEEDS
    if not (interval.low > 0 or interval.high < 0):
        return NO_DIFFERENCE
    return BETTER if (interval.low > 0) == higher_is_better else WORSE


@dataclass(frozen=True)
class Improvement:
    """P(arm run > reference run with the same seed): estimate, seed-bootstrap interval, exact Clopper–Pearson."""

    estimate: np.ndarray
    boot_low: np.ndarray
    boot_high: np.ndarray
    exact_low: np.ndarray
    exact_high: np.ndarray


def _wins(d: np.ndarray) -> np.ndarray:
    return (d > 0).sum(axis=-1) + 0.5 * (d == 0).sum(axis=-1)


def probability_of_improvement(
    differences, rng: np.random.Generator, num_resamples: int = 1000, level: float = 0.95
) -> Improvement:
    """Paired probability of improvement from the differences [..., n] (a win counts 1, a tie 1/2); B =
    ``num_resamples`` seed resamples drawn by ``rng`` (0: no bootstrap interval)."""
    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    if n < 1 or num_resamples < 0:
        raise ValueError(
            f"probability of improvement needs >= 1 paired seed and >= 0 resamples; got {n} and {num_resamples}"
        )
    from scipy import stats

    wins = _wins(d)
    alpha = (1.0 - level) / 2
    if num_resamples:
        idx = rng.integers(0, n, size=d.shape[:-1] + (int(num_resamples), n))
        resampled = _wins(np.take_along_axis(d[..., None, :], idx, axis=-1)) / n
        boot_low, boot_high = np.quantile(resampled, [alpha, 1.0 - alpha], axis=-1)
    else:
        boot_low = boot_high = np.full(d.shape[:-1], np.nan)
    with np.errstate(invalid="ignore"):
        exact_low = np.where(wins > 0, stats.beta.ppf(alpha, np.maximum(wins, 1e-12), n - wins + 1), 0.0)
        exact_high = np.where(wins < n, stats.beta.ppf(1.0 - alpha, wins + 1, np.maximum(n - wins, 1e-12)), 1.0)
    return Improvement(wins / n, boot_low, boot_high, exact_low, exact_high)


@dataclass(frozen=True)
class Reach:
    """One seed: the first x at which the arm reaches the reference's final value (None: censored at ``last``)."""

    seed: Optional[int]
    reached: Optional[int]
    last: int  # the arm's last evaluation
    default_final: int  # x of the reference run's final evaluation

    @property
    def censored(self) -> bool:
        return self.reached is None

    @property
    def speedup(self) -> float:
        """(1 - x / default_final) x 100 when reached, else the bound it lies below."""
        x = self.last if self.reached is None else self.reached
        return (1.0 - x / self.default_final) * 100.0


def first_reach(
    x: Sequence[int], values: Sequence[float], target: float, lower_is_better: bool = False
) -> Optional[int]:
    """The first x whose value reaches ``target`` (>=, or <= when lower is better); None if none does."""
    if not math.isfinite(target):
        return None
    values = np.asarray(values, dtype=np.float64)
    hit = np.flatnonzero(values <= target if lower_is_better else values >= target)
    return int(np.asarray(x)[hit[0]]) if hit.size else None


def reach_of(
    seed: Optional[int],
    x: Sequence[int],
    values: Sequence[float],
    target: float,
    default_final: int,
    lower_is_better: bool = False,
) -> Optional[Reach]:
    """The :class:`Reach` of one run's curve (x [E], values [E]); None without evaluations or target."""
    if not len(x) or not math.isfinite(target) or not default_final:
        return None
    return Reach(seed, first_reach(x, values, target, lower_is_better), int(x[-1]), int(default_final))


def median_interval_rank(n: int, level: float = 0.95) -> Tuple[int, float]:
    """(k, coverage): the largest k whose k-th best and worst seeds cover the median with 1 - 2 P(Bin(n, 1/2) < k)
    >= ``level``, else k = 1 and its smaller coverage."""
    from scipy import stats

    coverage = [float(1.0 - 2.0 * stats.binom.cdf(k - 1, n, 0.5)) for k in range(1, n // 2 + 2)]
    best = max([k for k in range(1, n // 2 + 1) if coverage[k - 1] >= level], default=1)
    return best, coverage[best - 1]


@dataclass(frozen=True)
class SpeedupSummary:
    """A speed-up over seeds, censoring kept: the Kaplan–Meier median and its order-statistic interval, each the
    :class:`Reach` of the seed at that rank (its ``speedup``, a bound when ``censored``)."""

    n: int  # seeds
    reached: int  # seeds that reached the reference's final value
    estimate: Reach
    low: Optional[Reach]  # None: no interval (one seed)
    high: Optional[Reach]
    coverage: float  # nominal coverage of the interval (NaN without one)
    method: str


def summarize_reaches(reaches: Sequence[Reach], level: float = 0.95) -> SpeedupSummary:
    """Seeds reached, the Kaplan–Meier median (ceil(n / 2)-th best, censored last), its order-statistic interval."""
    reaches = list(reaches)
    n = len(reaches)
    if n == 0:
        raise ValueError("summarize_reaches needs at least one seed")
    ranked = sorted(reaches, key=lambda r: (r.censored, -r.speedup))
    reached = sum(not r.censored for r in reaches)
    median = ranked[(n + 1) // 2 - 1]
    if n == 1:
        return SpeedupSummary(1, reached, median, None, None, float("nan"), "one seed: no interval over seeds")
    k, coverage = median_interval_rank(n, level)
    method = (
        f"Kaplan–Meier median over {n} seeds; order-statistic interval (seeds {k} and {n + 1 - k} of {n}), "
        f"coverage {coverage:.3f}"
    )
    return SpeedupSummary(n, reached, median, ranked[n - k], ranked[k - 1], coverage, method)


# The paper's claimed gains (default -> conditioned, COCO, XCiT-S12 Mask R-CNN): box AP 44.9 -> 45.5, mask 40.1 -> 40.6.
PAPER_DELTA = {"bbox": 0.6, "segm": 0.5}
# The std of a paired difference on COCO when none is measured: detectron2's ViTDet-B Mask R-CNN seeds vary by ~0.10
# box / mask AP per run; two independent runs differ by sqrt(2) x 0.10. Only for runs on COCO.
COCO_DIFFERENCE_STD = {"bbox": round(math.sqrt(2) * 0.10, 2), "segm": round(math.sqrt(2) * 0.10, 2)}
_MAX_SEEDS = 100_000


def _check(delta: float, std: float, level: float, comparisons: int, target: float, shared: float) -> None:
    checks = [
        (math.isfinite(delta) and delta > 0, f"delta must be > 0 (the difference to detect), got {delta}"),
        (math.isfinite(std) and std >= 0, f"std must be >= 0 (of the per-seed paired differences), got {std}"),
        (0 < level < 1, f"level must be in (0, 1) (e.g. 0.05), got {level}"),
        (comparisons >= 1, f"comparisons must be >= 1 (arms x metrics in the family), got {comparisons}"),
        (0 < target < 1, f"power must be in (0, 1) (e.g. 0.8), got {target}"),
        (math.isfinite(shared) and shared >= 0, f"shared image variance must be >= 0, got {shared}"),
    ]
    bad = [message for ok, message in checks if not ok]
    if bad:
        raise ValueError("; ".join(bad))


def power(
    n: int, delta: float, std: float, *, level: float = 0.05, comparisons: int = 1, shared_variance: float = 0.0
) -> float:
    """Power of the two-sided paired t-test over n >= 2 seeds at level / comparisons (the family's Bonferroni level),
    noncentrality delta / sqrt(std^2 / n + shared_variance)."""
    _check(delta, std, level, comparisons, 0.5, shared_variance)
    if n < 2:
        return 0.0
    se = math.sqrt(std**2 / n + shared_variance)
    if se == 0:
        return 1.0
    from scipy import stats

    df, crit = n - 1, stats.t.ppf(1.0 - level / comparisons / 2, n - 1)
    nc = delta / se
    upper, lower = stats.nct.sf(crit, df, nc), stats.nct.cdf(-crit, df, nc)
    # scipy's noncentral t returns NaN far in its tails; the normal limit is exact enough there
    upper = upper if math.isfinite(upper) else stats.norm.sf(crit - nc)
    lower = lower if math.isfinite(lower) else stats.norm.cdf(-crit - nc)
    return float(min(upper + lower, 1.0))


def seeds_needed(
    delta: float,
    std: float,
    *,
    power_target: float = 0.8,
    level: float = 0.05,
    comparisons: int = 1,
    shared_variance: float = 0.0,
) -> Optional[int]:
    """Smallest n >= 2 seeds per arm with :func:`power` >= ``power_target``; None when none reaches it."""
    _check(delta, std, level, comparisons, power_target, shared_variance)

    def enough(n: int) -> bool:
        return (
            power(n, delta, std, level=level, comparisons=comparisons, shared_variance=shared_variance) >= power_target
        )

    if not enough(_MAX_SEEDS):
        return None
    low, high = 1, 2
    while not enough(high):
        low, high = high, min(2 * high, _MAX_SEEDS)
    while high - low > 1:  # power increases with n
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class SeedPlan:
    """Seeds per arm needed to detect ``delta`` (``needed``; None: no number suffices) and what it assumed."""

    delta: float
    delta_source: str  # "given", "the paper's claimed gain", "the observed difference"
    std: float
    std_source: str  # "observed over n seeds", "given", "assumed: ..."
    comparisons: int
    level: float
    power: float
    needed: Optional[int]

    def text(self) -> str:
        """``"to detect Δ = 0.6 (given) with std 0.1 ...: n ≥ 4 seeds per arm"``."""
        family = f" / {self.comparisons} (a family of {self.comparisons} comparisons)" if self.comparisons > 1 else ""
        head = (
            f"to detect Δ = {self.delta:.3g} ({self.delta_source}) with std {self.std:.3g} of the paired "
            f"differences ({self.std_source}) at {self.power:.0%} power, two-sided level {self.level:g}{family}"
        )
        if self.needed is None:
            return (
                head + ": no number of seeds suffices (the evaluation-image variance shared by every run is "
                "too large: more evaluation images are needed)"
            )
        return head + f": n ≥ {self.needed} seeds per arm"


def plan_seeds(
    delta: float,
    std: float,
    *,
    delta_source: str = "given",
    std_source: str = "given",
    comparisons: int = 1,
    level: float = 0.05,
    power_target: float = 0.8,
    shared_variance: float = 0.0,
) -> SeedPlan:
    """The :class:`SeedPlan` of :func:`seeds_needed`."""
    return SeedPlan(
        delta,
        delta_source,
        std,
        std_source,
        comparisons,
        level,
        power_target,
        seeds_needed(
            delta, std, power_target=power_target, level=level, comparisons=comparisons, shared_variance=shared_variance
        ),
    )
