import math

import numpy as np
import pytest

from condinit_det.report.statistics import (BETTER, NOT_DISTINGUISHABLE, WORSE, Interval, mean_std, percentile_interval,
                                t_interval, verdict)

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
    assert verdict(iv) == NOT_DISTINGUISHABLE  # [-0.48, 4.48] contains 0


def test_verdicts():
    clear = t_interval([3.0, 3.5, 4.0, 3.2])
    assert clear.low > 0 and verdict(clear) == BETTER
    assert verdict(t_interval([-3.0, -3.5, -4.0])) == WORSE
    assert verdict(t_interval([1.0, -1.0, 0.5])) == NOT_DISTINGUISHABLE
    # lower is better (e.g. iterations): a positive interval is worse
    assert verdict(clear, higher_is_better=False) == WORSE
    assert verdict(None) == "no interval"
    # identical differences: a zero-width interval away from 0
    assert verdict(t_interval([2.0, 2.0])) == BETTER
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])


def test_percentile_interval():
    reps = np.arange(1, 1001, dtype=float)
    iv = percentile_interval(500.0, reps)
    assert iv.low == pytest.approx(np.quantile(reps, 0.025)) and iv.high == pytest.approx(np.quantile(reps, 0.975))
    assert iv.contains(500.0) and not iv.contains(0.0)
    assert isinstance(iv, Interval) and iv.estimate == 500.0
    with pytest.raises(ValueError):
        percentile_interval(0.0, [float("nan")])
