import math

import numpy as np
import pytest
from scipy import stats

from condinit_det.report.statistics import (
    BETTER,
    BOTH,
    IMAGES,
    NO_DIFFERENCE,
    PAPER_DELTA,
    RUNS,
    TOO_FEW_SEEDS,
    UNITS,
    WORSE,
    Interval,
    Reach,
    bootstrap_p_value,
    mean_std,
    median_interval_rank,
    paired_t,
    percentile_interval,
    plan_seeds,
    power,
    probability_of_improvement,
    reach_of,
    seeds_needed,
    summarize_reaches,
    t_interval,
    two_level_bootstrap,
    verdict,
)

T_975_2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables: 4.303)


def test_mean_std_is_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))
    assert all(math.isnan(v) for v in mean_std([1.0, float("nan")]))


def test_t_interval_known_answer():
    iv = t_interval([1.0, 2.0, 3.0])
    half = T_975_2 * 1.0 / math.sqrt(3)  # sd 1, n 3: 2.484
    assert iv.estimate == pytest.approx(2.0)
    assert (iv.low, iv.high) == pytest.approx((2.0 - half, 2.0 + half))
    assert half == pytest.approx(2.484, abs=1e-3)
    assert "3 seeds" in iv.method
    assert iv.replication == RUNS and iv.unit == "training runs" and iv.num_seeds == 3
    # p of t = 2 / (1 / sqrt 3) with 2 degrees of freedom
    assert iv.p_value == pytest.approx(2 * stats.t.sf(2 * math.sqrt(3), 2))
    assert verdict(iv) == NO_DIFFERENCE  # [-0.48, 4.48] contains 0


def test_paired_t_is_vectorized():
    d = np.array([[1.0, 2.0, 3.0], [3.0, 3.5, 4.0]])
    mean, low, high, p, se = paired_t(d)
    for row in range(2):
        iv = t_interval(d[row])
        assert (mean[row], low[row], high[row], p[row]) == pytest.approx((iv.estimate, iv.low, iv.high, iv.p_value))


def test_verdicts_read_the_interval_at_the_family_level_and_need_two_seeds():
    clear = t_interval([3.0, 3.5, 4.0, 3.2])
    assert clear.low > 0 and verdict(clear) == BETTER
    worse = t_interval([-3.0, -3.5, -4.0])
    assert verdict(worse) == WORSE
    # lower is better (e.g. iterations): a positive difference is worse
    assert verdict(clear, higher_is_better=False) == WORSE
    assert verdict(None) == TOO_FEW_SEEDS
    # identical differences: a zero-width interval away from 0, p = 0
    two = t_interval([2.0, 2.0])
    assert verdict(two) == BETTER and two.p_value == 0.0 and verdict(t_interval([0.0, 0.0])) == NO_DIFFERENCE
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])
    # p = 0.0136: its 95% interval excludes 0, the interval at a family of 6's level (1 - 0.05 / 6) covers it, as
    # 6 p > 0.05 says
    d = [7.0, 5.0, 5.0]
    assert t_interval(d).low > 0 and 6 * t_interval(d).p_value > 0.05
    wide = t_interval(d, 1 - 0.05 / 6)
    assert wide.level == pytest.approx(1 - 0.05 / 6) and wide.low < 0 < wide.high and verdict(wide) == NO_DIFFERENCE
    # one trained model per arm: never a verdict on the initialization, however clear its interval
    images = percentile_interval(2.0, np.linspace(1.0, 3.0, 101))
    assert images.unit == UNITS[IMAGES] == "evaluation images (one trained model per arm)"
    assert images.low > 0 and verdict(images) == TOO_FEW_SEEDS
    assert UNITS[BOTH] == "training runs and evaluation images"


def test_percentile_interval_and_bootstrap_p_value():
    reps = np.arange(1, 1001, dtype=float)
    iv = percentile_interval(500.0, reps)
    assert iv.low == pytest.approx(np.quantile(reps, 0.025)) and iv.high == pytest.approx(np.quantile(reps, 0.975))
    assert iv.low <= 500.0 <= iv.high and iv.low > 0
    assert isinstance(iv, Interval) and iv.estimate == 500.0 and iv.replication == IMAGES
    # no replicate at or below 0: p = 2 (1 + 0) / (B + 1)
    assert iv.p_value == pytest.approx(2 / 1001)
    assert bootstrap_p_value(np.r_[-np.ones(30), np.ones(70)]) == pytest.approx(2 * 31 / 101)
    assert bootstrap_p_value(np.zeros(10)) == 1.0
    with pytest.raises(ValueError):
        percentile_interval(0.0, [float("nan")])


def _orthogonal(n, length):
    """n centred, mutually orthogonal vectors of equal norm (rows of a Hadamard-like sign matrix)."""
    from scipy.linalg import hadamard

    h = hadamard(length)[1 : n + 1].astype(float)
    return h / h.std(axis=1, ddof=1, keepdims=True)


def test_two_level_without_shared_image_variance_is_the_t_interval():
    # per-seed image replicates uncorrelated across seeds: no shared image variance, the interval is Student's
    est = np.array([1.0, 2.0, 3.0])
    reps = est[:, None] + 0.3 * _orthogonal(3, 64)
    two = two_level_bootstrap(est, reps, np.random.default_rng(0))
    assert float(two.var_images) == pytest.approx(0.0, abs=1e-12) and float(two.var_seeds) == pytest.approx(1 / 3)
    for level in (0.95, 1 - 0.05 / 6):
        iv, t = two.interval(level), t_interval(est, level)
        assert (iv.low, iv.high) == pytest.approx((t.low, t.high), rel=2e-3) and iv.level == level
    assert iv.p_value == pytest.approx(t.p_value, rel=2e-3)
    assert iv.replication == BOTH and iv.unit == "training runs and evaluation images" and iv.num_seeds == 3


def test_two_level_shared_image_variance_known_answer():
    # every seed moves the same way on every image resample: all of it is shared, var = var(u)
    u = _orthogonal(1, 64)[0] * 0.5
    est = np.array([1.0, 1.0, 1.0, 1.0])  # no seed spread: the normal interval with the image variance
    two = two_level_bootstrap(est, est[:, None] + u[None], np.random.default_rng(0))
    assert float(two.var_images) == pytest.approx(0.25) and float(two.var_seeds) == 0.0
    assert (two.interval().low, two.interval().high) == pytest.approx(
        (1 - 1.959964 * 0.5, 1 + 1.959964 * 0.5), rel=1e-5
    )
    assert float(two.p_value) == pytest.approx(2 * stats.norm.sf(1.0 / 0.5), rel=1e-4)
    # replicates: every seed resample of a constant mean is that mean, shifted by the image part of resample b
    assert two.replicates == pytest.approx(1.0 + u)
    # both parts: between the t-interval of the seeds alone and the sum of the two half-widths
    est2 = np.array([0.5, 1.0, 1.5, 1.0])
    two2 = two_level_bootstrap(est2, est2[:, None] + u[None], np.random.default_rng(0))
    t = t_interval(est2)
    half = float(two2.half_width())
    assert t.high - t.estimate < half < (t.high - t.estimate) + 1.959964 * 0.5
    with pytest.raises(ValueError, match="n >= 2 seeds"):
        two_level_bootstrap(est[:1], u[None], np.random.default_rng(0))


def test_two_level_is_vectorized_and_seeded():
    rng = np.random.default_rng(3)
    est, reps = rng.normal(size=(4, 3)), rng.normal(size=(4, 3, 50))
    batch = two_level_bootstrap(est, reps, np.random.default_rng(1))
    assert batch.half_width().shape == (4,) and batch.replicates.shape == (4, 50)
    again = two_level_bootstrap(est, reps, np.random.default_rng(1))
    assert np.array_equal(batch.replicates, again.replicates)
    for k in range(4):
        one = two_level_bootstrap(est[k], reps[k], np.random.default_rng(9))
        assert float(one.half_width(0.99)) == pytest.approx(batch.half_width(0.99)[k])
        assert float(one.p_value) == pytest.approx(batch.p_value[k])


def test_the_two_level_interval_at_level_1_minus_a_excludes_zero_exactly_when_p_is_below_a():
    # the verdict reads the interval and the adjusted p is m p: they must agree at every family size m
    rng = np.random.default_rng(4)
    est = rng.normal(2.0, 1.0, size=(2000, 3))
    reps = est[..., None] + rng.normal(0.0, 0.5, size=(2000, 1, 40)) + rng.normal(0.0, 0.5, size=(2000, 3, 40))
    two = two_level_bootstrap(est, reps, np.random.default_rng(0))
    for m in (1, 3, 6, 16):
        excludes = np.abs(two.estimate) > two.half_width(1 - 0.05 / m)
        assert np.array_equal(excludes, m * two.p_value < 0.05), m
        assert 0 < excludes.sum() < excludes.size  # both outcomes occur


def test_probability_of_improvement():
    imp = probability_of_improvement([1.0, -1.0, 2.0, 0.0], np.random.default_rng(0), 2000)
    assert imp.estimate == pytest.approx(2.5 / 4)  # two wins, a tie counts half
    assert imp.boot_low <= imp.estimate <= imp.boot_high
    # Clopper-Pearson for 2.5 wins of 4
    assert imp.exact_low == pytest.approx(stats.beta.ppf(0.025, 2.5, 2.5))
    assert imp.exact_high == pytest.approx(stats.beta.ppf(0.975, 3.5, 1.5))
    every = probability_of_improvement([1.0, 2.0, 3.0], np.random.default_rng(0), 500)
    assert (every.estimate, every.boot_low, every.boot_high) == (1.0, 1.0, 1.0)  # the bootstrap cannot see past it
    assert every.exact_high == 1.0 and every.exact_low == pytest.approx(0.025 ** (1 / 3))
    batch = probability_of_improvement(np.array([[1.0, -1.0], [1.0, 2.0]]), np.random.default_rng(0), 0)
    assert batch.estimate.tolist() == [0.5, 1.0] and np.isnan(batch.boot_low).all() and batch.exact_low[1] > 0
    with pytest.raises(ValueError, match=">= 1 paired seed"):
        probability_of_improvement(np.ones((2, 0)), np.random.default_rng(0))


def test_power_and_seeds_needed():
    # n -> large: the t-test's power tends to the normal one
    z = stats.norm.ppf(0.975)
    nc = 0.5 / math.sqrt(1.0 / 400)
    assert power(400, 0.5, 1.0) == pytest.approx(stats.norm.sf(z - nc) + stats.norm.cdf(-z - nc), abs=2e-3)
    n = seeds_needed(0.6, 0.1, comparisons=4)
    assert n == 4  # 3 seeds: t(0.99375, 2) = 8.86 is too wide
    assert power(n, 0.6, 0.1, comparisons=4) >= 0.8 > power(n - 1, 0.6, 0.1, comparisons=4)
    # larger std, more comparisons: more seeds
    assert seeds_needed(0.6, 0.3) < seeds_needed(0.6, 0.3, comparisons=6) < seeds_needed(0.6, 0.6, comparisons=6)
    # shared image variance alone keeps the power below 80%: no number of seeds suffices
    assert seeds_needed(0.6, 0.1, shared_variance=0.5**2) is None
    plan = plan_seeds(PAPER_DELTA["bbox"], 0.14, delta_source="the paper's claimed gain", comparisons=4)
    assert plan.needed == seeds_needed(0.6, 0.14, comparisons=4)
    assert (
        plan.text().endswith(f"n ≥ {plan.needed} seeds per arm") and "Δ = 0.6 (the paper's claimed gain)" in plan.text()
    )
    with pytest.raises(ValueError, match="delta must be > 0.*std must be >= 0"):
        seeds_needed(0.0, -1.0)


def test_order_statistic_interval_for_the_median():
    assert median_interval_rank(5) == (1, pytest.approx(1 - 2 / 32))  # below 95%: [worst, best]
    assert median_interval_rank(6) == (1, pytest.approx(1 - 2 / 64))
    k, coverage = median_interval_rank(10)
    assert k == 2 and coverage == pytest.approx(1 - 2 * stats.binom.cdf(1, 10, 0.5)) and coverage >= 0.95


def test_censored_speedups_are_kept():
    # default final at 100; seeds reach at 60, 80, 70, never (last evaluation 100), never (90)
    reaches = [
        Reach(0, 60, 100, 100),
        Reach(1, 80, 100, 100),
        Reach(2, 70, 100, 100),
        Reach(3, None, 100, 100),
        Reach(4, None, 90, 100),
    ]
    sp = summarize_reaches(reaches)
    assert (sp.n, sp.reached) == (5, 3)
    # best to worst: 40, 30, 20, then the censored ones (< 10 before < 0): the median is the 3rd, 20
    assert sp.estimate.speedup == pytest.approx(20.0) and not sp.estimate.censored
    assert median_interval_rank(5)[0] == 1
    assert sp.high.speedup == pytest.approx(40.0) and not sp.high.censored
    assert sp.low.censored and sp.low.speedup == pytest.approx(0.0)  # the worst seed: below 0
    # most seeds censored: the median itself is a bound
    sp = summarize_reaches([Reach(0, 50, 100, 100), Reach(1, None, 100, 100), Reach(2, None, 100, 100)])
    assert (sp.estimate.speedup, sp.estimate.censored) == (0.0, True)
    every = summarize_reaches([Reach(0, 50, 100, 100), Reach(1, 75, 100, 100)])
    assert every.reached == 2 and (every.low.speedup, every.estimate.speedup, every.high.speedup) == (25.0, 50.0, 50.0)
    r = reach_of(7, [10, 20, 30], [1.0, 5.0, 9.0], target=4.0, default_final=30)
    assert (r.reached, r.speedup) == (20, pytest.approx(100 / 3))
    assert reach_of(7, [10, 20], [1.0, 2.0], target=4.0, default_final=30).censored
    assert reach_of(7, [10, 20], [3.0, 2.0], target=2.5, default_final=20, lower_is_better=True).reached == 20
