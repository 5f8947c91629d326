"""Intervals for an arm minus the default arm, each stating its unit of replication.

The design is paired: runs with the same training seed share data order and every non-attention
weight, and every run is evaluated on the same images. Seeds and images are *crossed* factors, so an
arm's difference to default varies with both the training run (seed) and the evaluation set. Every
interval here says which of them it covers (:attr:`Interval.replication`):

- ``"runs"``: training runs (n seeds), the evaluation set held fixed: the paired t-interval of the
  per-seed differences (:func:`t_interval`);
- ``"images"``: evaluation images, one trained model per arm: the percentile interval of an image
  bootstrap (:func:`percentile_interval`); it says nothing about another training run;
- ``"both"``: the two-level bootstrap (:func:`two_level_bootstrap`): seeds resampled, and the images
  resampled once per replicate for every seed and both arms (the crossed design), with its t-scaled
  interval built from the two variance components (see the function).

All functions that take arrays accept leading batch dimensions, so the calibration simulations
(``bench/calibration.py``) run the same code as the report, vectorized.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "BETTER",
    "BOTH",
    "IMAGES",
    "IMAGES_HIGHER",
    "IMAGES_LOWER",
    "IMAGES_SAME",
    "IMAGES_SAME_FAMILY",
    "IMAGE_BOOTSTRAP",
    "METHOD_TRUTH",
    "NOT_DISTINGUISHABLE",
    "NOT_DISTINGUISHABLE_FAMILY",
    "PAIRED_T",
    "RUNS",
    "TWO_LEVEL_PERCENTILE",
    "TWO_LEVEL_T",
    "WORSE",
    "Interval",
    "TwoLevel",
    "bootstrap_p_value",
    "describe_unit",
    "mean_std",
    "paired_t",
    "percentile_interval",
    "report_method",
    "t_interval",
    "two_level_bootstrap",
    "verdict",
    "verdict_text",
]

RUNS, IMAGES, BOTH = "runs", "images", "both"

# The verdicts' wording, for a comparison with ``{reference}`` (the default arm, or the other arm of a contrast).
_WORDING = {
    "better": "better than {reference}",
    "worse": "worse than {reference}",
    "same": "not distinguishable from {reference} at 95%",
    "same_family": "not distinguishable from {reference} at family-wise 95%",
    # One trained model per arm: a statement about these images, never about the initialization.
    "images_higher": "this one trained model scores higher than {reference}'s on these images",
    "images_lower": "this one trained model scores lower than {reference}'s on these images",
    "images_same": "this one trained model is not distinguishable from {reference}'s on these images at 95%",
    "images_same_family": "this one trained model is not distinguishable from {reference}'s on these images at "
                          "family-wise 95%",
}


def verdict_text(kind: str, reference: str = "default") -> str:
    """A verdict's wording against ``reference``; ``kind``: better, worse, same, same_family, images_higher,
    images_lower, images_same or images_same_family."""
    if kind not in _WORDING:
        raise ValueError(f"kind must be one of {sorted(_WORDING)}; got {kind!r}")
    return _WORDING[kind].format(reference=reference)


BETTER = verdict_text("better")
WORSE = verdict_text("worse")
NOT_DISTINGUISHABLE = verdict_text("same")
NOT_DISTINGUISHABLE_FAMILY = verdict_text("same_family")
IMAGES_HIGHER = verdict_text("images_higher")
IMAGES_LOWER = verdict_text("images_lower")
IMAGES_SAME = verdict_text("images_same")
IMAGES_SAME_FAMILY = verdict_text("images_same_family")


# The interval methods, and what each one's 95% covers (the truth its calibration scores it against,
# ``bench/calibration.py``).
IMAGE_BOOTSTRAP = "image bootstrap"
PAIRED_T = "paired t"
TWO_LEVEL_PERCENTILE = "two-level percentile"
TWO_LEVEL_T = "two-level t"
METHOD_TRUTH = {
    IMAGE_BOOTSTRAP: "images",  # this trained model pair on the population of images
    PAIRED_T: "evaluation set",  # over training runs, on these images
    TWO_LEVEL_T: "population",  # over training runs and images: the initialization's effect
}


def report_method(num_seeds: int, per_image: bool) -> Optional[str]:
    """
    The interval the report's verdict uses for ``num_seeds`` paired seeds, with or without per-image data of
    every paired run: one seed — :data:`IMAGE_BOOTSTRAP` (or none); two or more — :data:`TWO_LEVEL_T`, or
    :data:`PAIRED_T` without per-image data. Each has measured coverage >= 0.93 of its truth at every n
    (docs/statistics.md); the plain two-level percentile interval does not at 2-3 seeds and is only shown.
    """
    if num_seeds <= 0:
        return None
    if num_seeds == 1:
        return IMAGE_BOOTSTRAP if per_image else None
    return TWO_LEVEL_T if per_image else PAIRED_T


def describe_unit(replication: str, num_seeds: int) -> str:
    """The unit of replication and sources of variance of an interval, as tables and verdicts print it."""
    if replication == RUNS:
        return f"training runs ({num_seeds} seeds)"
    if replication == IMAGES:
        return "evaluation images (one trained model per arm)"
    if replication == BOTH:
        return f"both (training runs: {num_seeds} seeds; evaluation images)"
    raise ValueError(f"replication must be one of {RUNS!r}, {IMAGES!r}, {BOTH!r}; got {replication!r}")


@dataclass(frozen=True)
class Interval:
    """
    A point estimate with a two-sided confidence interval, how it was obtained and what it covers.

    ``replication``: :data:`RUNS`, :data:`IMAGES` or :data:`BOTH`; ``num_seeds``: paired seeds it uses;
    ``p_value``: two-sided p-value of "no difference" by the same method (NaN when it has none);
    ``se`` / ``df``: standard error and degrees of freedom of a t-type interval (NaN otherwise).
    """

    estimate: float
    low: float
    high: float
    method: str
    level: float = 0.95
    replication: str = RUNS
    num_seeds: int = 0
    p_value: float = float("nan")
    se: float = float("nan")
    df: float = float("nan")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def unit(self) -> str:
        return describe_unit(self.replication, self.num_seeds)


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value); NaN for none or any NaN."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.isnan(v).any():
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def _t_quantile(level: float, df):
    from scipy import stats

    return stats.t.ppf(0.5 + level / 2, df)


def paired_t(differences, level: float = 0.95):
    """
    Student t-interval of the mean of paired differences [..., n] (n - 1 degrees of freedom, n >= 2):
    ``scipy.stats.ttest_1samp`` against 0 and its confidence interval. Returns arrays [...]: (mean, low,
    high, two-sided p-value, standard error). Identical differences (standard error 0) give a zero-width
    interval and p = 0, or p = 1 when they are all 0 (scipy's p is undefined there).
    """
    from scipy import stats

    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 paired differences, got {n}")
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
    return Interval(mean, low, high, f"paired t-interval over {d.size} seeds", level, RUNS, int(d.size), p, se,
                    float(d.size - 1))


def bootstrap_p_value(replicates) -> np.ndarray:
    """
    Two-sided bootstrap p-value of "no difference" from replicates [..., B]: twice the smaller tail
    fraction at 0, (1 + count) / (B + 1) each, at most 1. The 95% percentile interval excludes 0
    about when it is below 0.05.
    """
    r = np.asarray(replicates, dtype=np.float64)
    finite = np.isfinite(r)
    num = finite.sum(axis=-1)
    below = ((r <= 0) & finite).sum(axis=-1)
    above = ((r >= 0) & finite).sum(axis=-1)
    return np.minimum(1.0, 2.0 * (1.0 + np.minimum(below, above)) / (num + 1.0))


def percentile_interval(estimate: float, resampled: Sequence[float], level: float = 0.95,
                        method: str = "paired bootstrap", *, replication: str = IMAGES,
                        num_seeds: int = 1) -> Interval:
    """Percentile interval of bootstrap replicates around ``estimate`` (the full-sample value), with its
    bootstrap p-value (:func:`bootstrap_p_value`)."""
    r = np.asarray(resampled, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        raise ValueError("a percentile interval needs at least one finite bootstrap replicate")
    alpha = (1.0 - level) / 2
    low, high = np.quantile(r, [alpha, 1.0 - alpha])
    return Interval(float(estimate), float(low), float(high), method, level, replication, int(num_seeds),
                    float(bootstrap_p_value(r)))


@dataclass(frozen=True)
class TwoLevel:
    """Results of :func:`two_level_bootstrap`, arrays with the batch shape of its inputs."""

    estimate: np.ndarray  # mean over seeds of the per-seed differences
    replicates: np.ndarray  # [..., B] two-level bootstrap replicates
    percentile_low: np.ndarray
    percentile_high: np.ndarray
    percentile_p_value: np.ndarray
    var_seeds: np.ndarray  # s^2 / n: between-seed variance of the per-seed differences over n
    var_images: np.ndarray  # evaluation-image variance shared by the seeds (>= 0)
    se: np.ndarray  # sqrt(var_seeds + var_images)
    low: np.ndarray  # t-scaled interval (generalized pivot)
    high: np.ndarray
    p_value: np.ndarray  # of the t-scaled interval
    satterthwaite_df: np.ndarray  # Welch-Satterthwaite degrees of freedom (for comparison)
    satterthwaite_low: np.ndarray
    satterthwaite_high: np.ndarray
    num_seeds: int
    level: float

    def interval(self, t_scaled: bool = True) -> Interval:
        """The scalar result as an :class:`Interval` (t-scaled, or the plain percentile interval)."""
        n, level = self.num_seeds, self.level
        if t_scaled:
            return Interval(float(self.estimate), float(self.low), float(self.high),
                            f"two-level bootstrap (seeds x images), t-scaled, {n} seeds", level, BOTH, n,
                            float(self.p_value), float(self.se), float(n - 1))
        return Interval(float(self.estimate), float(self.percentile_low), float(self.percentile_high),
                        f"two-level bootstrap (seeds x images), percentile, {n} seeds", level, BOTH, n,
                        float(self.percentile_p_value))


# Points of the chi-square distribution over which the generalized pivot is averaged (midpoint rule
# in probability: the error of its 95% point is far below the bootstrap's).
_PIVOT_POINTS = 400


def _pivot_scales(var_seeds: np.ndarray, var_images: np.ndarray, n: int) -> np.ndarray:
    """[..., K] standard deviations sqrt(var_seeds (n - 1) / X_k + var_images), X_k quantiles of chi2(n - 1)."""
    from scipy import stats

    x = stats.chi2.ppf((np.arange(_PIVOT_POINTS) + 0.5) / _PIVOT_POINTS, n - 1)
    return np.sqrt(var_seeds[..., None] * (n - 1) / x + var_images[..., None])


def _pivot_tail(value: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """P(|Z| scale > value) averaged over the scales [..., K]; Z standard normal."""
    from scipy.special import ndtr

    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scales > 0, value[..., None] / scales, np.inf)
    return (2.0 * ndtr(-np.abs(z))).mean(axis=-1)


def _pivot_half_width(var_seeds: np.ndarray, var_images: np.ndarray, scales: np.ndarray, n: int,
                      level: float) -> np.ndarray:
    """Half-width h with P(|Z| scale <= h) = level, by bisection (vectorized over the batch). Bracket:
    h >= z sqrt(images) (scale >= sqrt(images)); h <= t' sqrt(seeds) + z' sqrt(images) with t', z' the
    (3 + level) / 4 quantiles (scale <= sqrt(seeds (n - 1) / X) + sqrt(images), then a union bound)."""
    from scipy import stats

    tail = (3.0 + level) / 4
    low = stats.norm.ppf(0.5 + level / 2) * np.sqrt(var_images)
    high = stats.t.ppf(tail, n - 1) * np.sqrt(var_seeds) + stats.norm.ppf(tail) * np.sqrt(var_images)
    for _ in range(32):
        mid = 0.5 * (low + high)
        inside = _pivot_tail(mid, scales) > 1.0 - level
        low, high = np.where(inside, mid, low), np.where(inside, high, mid)
    return 0.5 * (low + high)


def two_level_bootstrap(estimates, replicates, rng: np.random.Generator, *, num_images: int,
                        level: float = 0.95) -> TwoLevel:
    """
    Two-level paired bootstrap of the mean difference over seeds (n >= 2).

    Args:
        estimates: [..., n] per-seed difference (arm minus default, same seed) on the full evaluation set.
        replicates: [..., n, B] the same differences on B image resamples; resample b must be the same
            images for every seed and both arms (seeds and images are crossed: every run is evaluated
            on the same images).
        rng: draws the seed resamples ([..., B, n] seed indices, with replacement).
        num_images: evaluation images (degrees of freedom of the image part, for Satterthwaite's).

    Replicate b is the mean over a resample of the seeds of their differences on image resample b;
    the percentile interval is its quantiles. With few seeds that undercovers (3 seeds have 10 distinct
    resamples and the seed part of its variance is (n - 1) / n too small), so the t-scaled interval is
    built from the two variance components instead:

    - seeds: s^2 / n (s: sample std of the per-seed differences, n - 1 degrees of freedom); it already
      holds the image noise that differs between training runs;
    - images: the part shared by every training run (an image effect that does not average out over
      seeds), estimated by the mean covariance between two seeds' replicates over the image resamples,
      taken as known (it comes from all the images).

    The interval is estimate ± h, h the 97.5% point of |Z| sqrt(s^2 / n (n - 1) / X + images), Z standard
    normal and X chi-square(n - 1) independent: a generalized pivot (the fiducial Behrens–Fisher
    solution), which is Student's t(n - 1) interval when the image part is 0 and the normal one when
    the seed part is 0. At 2-3 seeds no interval is exact for every ratio of the two parts (as in the
    Behrens–Fisher problem): this one errs wide; Welch–Satterthwaite's (also returned) errs narrow.
    """
    est = np.asarray(estimates, dtype=np.float64)
    rep = np.asarray(replicates, dtype=np.float64)
    n, num_b = est.shape[-1], rep.shape[-1]
    if n < 2 or rep.shape[-2:] != (n, num_b) or num_b < 2:
        raise ValueError(f"two_level_bootstrap needs estimates [..., n] and replicates [..., n, B] with n >= 2 seeds "
                         f"and B >= 2 resamples; got {est.shape} and {rep.shape}")
    seeds = rng.integers(0, n, size=est.shape[:-1] + (num_b, n))
    by_resample = np.swapaxes(rep, -1, -2)  # [..., B, n]
    boot = np.take_along_axis(by_resample, seeds, axis=-1).mean(axis=-1)
    alpha = (1.0 - level) / 2
    p_low, p_high = np.quantile(boot, [alpha, 1.0 - alpha], axis=-1)

    estimate = est.mean(axis=-1)
    var_seeds = est.var(axis=-1, ddof=1) / n
    centred = rep - rep.mean(axis=-1, keepdims=True)
    per_seed = (centred ** 2).sum(axis=-1) / (num_b - 1)  # [..., n]
    of_sum = (centred.sum(axis=-2) ** 2).sum(axis=-1) / (num_b - 1)  # variance of the sum over seeds
    var_images = np.maximum((of_sum - per_seed.sum(axis=-1)) / (n * (n - 1)), 0.0)
    var = var_seeds + var_images
    se = np.sqrt(var)

    scales = _pivot_scales(var_seeds, var_images, n)
    half = _pivot_half_width(var_seeds, var_images, scales, n, level)
    p_value = np.where(scales.max(axis=-1) > 0, np.minimum(_pivot_tail(np.abs(estimate), scales), 1.0),
                       np.where(estimate == 0, 1.0, 0.0))

    with np.errstate(divide="ignore", invalid="ignore"):
        df = var ** 2 / (var_seeds ** 2 / (n - 1) + var_images ** 2 / max(num_images - 1, 1))
    df = np.where(var > 0, df, n - 1.0)
    welch = _t_quantile(level, df) * se
    return TwoLevel(estimate, boot, p_low, p_high, bootstrap_p_value(boot), var_seeds, var_images, se,
                    estimate - half, estimate + half, p_value, df, estimate - welch, estimate + welch, n, level)


def verdict(interval: Optional[Interval], higher_is_better: bool = True, *,
            p_adjusted: Optional[float] = None, alpha: float = 0.05, reference: str = "default") -> str:
    """
    The verdict of an interval of an arm minus ``reference``: "no interval"; with ``p_adjusted`` (Holm)
    significant when it is at most ``alpha``, otherwise when the interval excludes 0. Runs or both:
    :data:`BETTER` / :data:`WORSE` / :data:`NOT_DISTINGUISHABLE` (:data:`NOT_DISTINGUISHABLE_FAMILY` with
    ``p_adjusted``); images only: :data:`IMAGES_HIGHER` / :data:`IMAGES_LOWER` / :data:`IMAGES_SAME`
    (:data:`IMAGES_SAME_FAMILY`): one trained model per arm says nothing about the initialization. Against
    another reference than the default arm (a contrast between two arms) the same wording names it
    (:func:`verdict_text`), e.g. "better than scale_matched".
    """
    if interval is None or not (math.isfinite(interval.low) and math.isfinite(interval.high)):
        return "no interval"
    if p_adjusted is not None and math.isfinite(p_adjusted):
        significant = p_adjusted <= alpha
    else:
        significant = interval.low > 0 or interval.high < 0
    up = interval.estimate > 0 if p_adjusted is not None else interval.low > 0
    images = interval.replication == IMAGES
    if not significant:
        kind = "same_family" if p_adjusted is not None else "same"
    elif images:
        kind = "higher" if up else "lower"
    else:
        kind = "better" if up == higher_is_better else "worse"
    return verdict_text(("images_" if images else "") + kind, reference)
