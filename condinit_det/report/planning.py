"""Seed planning: how many paired seeds per arm detect a given difference.

A comparison with the default arm is a two-sided paired t-test over seeds. With ``comparisons``
comparisons in the family, Holm's first (strictest) threshold is level / comparisons, so planning at
that level guarantees the power for every comparison whatever the others' p-values (Bonferroni's
bound on Holm). Power at n seeds: P(|T| > t_{1 - a / 2}(n - 1)) for T noncentral t with n - 1 degrees
of freedom and noncentrality delta / sqrt(std^2 / n + shared), ``std`` the standard deviation of the
per-seed paired differences and ``shared`` the evaluation-image variance common to every training run
(it does not shrink with more seeds: when it alone keeps the power below the target, no number of
seeds suffices and more evaluation images are needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

__all__ = ["PAPER_DELTA", "PRIOR_DIFFERENCE_STD", "SeedPlan", "detectable_difference", "plan_seeds", "power",
           "seeds_needed"]

# The paper's claimed gains (default -> conditioned, COCO, XCiT-S12 Mask R-CNN): box AP 44.9 -> 45.5,
# mask AP 40.1 -> 40.6.
PAPER_DELTA = {"bbox": 0.6, "segm": 0.5}
# Seed std of a paired difference when none is measured: detectron2's ViTDet-B Mask R-CNN seeds vary by
# ~0.10 box / mask AP per run on COCO; two independent runs differ by sqrt(2) x 0.10.
PRIOR_DIFFERENCE_STD = {"bbox": round(math.sqrt(2) * 0.10, 2), "segm": round(math.sqrt(2) * 0.10, 2)}

_MAX_SEEDS = 100_000


def _check(delta: float, std: float, level: float, comparisons: int, target: float, shared: float) -> None:
    bad = []
    if not (math.isfinite(delta) and delta > 0):
        bad.append(f"delta must be > 0 (the difference to detect), got {delta}")
    if not (math.isfinite(std) and std >= 0):
        bad.append(f"std must be >= 0 (std of the per-seed paired differences), got {std}")
    if not 0 < level < 1:
        bad.append(f"level must be in (0, 1) (e.g. 0.05), got {level}")
    if comparisons < 1:
        bad.append(f"comparisons must be >= 1 (arms x metrics in the family), got {comparisons}")
    if not 0 < target < 1:
        bad.append(f"power must be in (0, 1) (e.g. 0.8), got {target}")
    if not (math.isfinite(shared) and shared >= 0):
        bad.append(f"shared image variance must be >= 0, got {shared}")
    if bad:
        raise ValueError("; ".join(bad))


def power(n: int, delta: float, std: float, *, level: float = 0.05, comparisons: int = 1,
          shared_variance: float = 0.0) -> float:
    """Power of the two-sided paired t-test at level / comparisons with n >= 2 seeds (module doc)."""
    from scipy import stats

    _check(delta, std, level, comparisons, 0.5, shared_variance)
    if n < 2:
        return 0.0
    se = math.sqrt(std ** 2 / n + shared_variance)
    if se == 0:
        return 1.0
    df, crit = n - 1, stats.t.ppf(1.0 - level / comparisons / 2, n - 1)
    nc = delta / se
    upper, lower = stats.nct.sf(crit, df, nc), stats.nct.cdf(-crit, df, nc)
    # scipy's noncentral t returns NaN far in its tails; the normal limit is exact enough there
    if not math.isfinite(upper):
        upper = stats.norm.sf(crit - nc)
    if not math.isfinite(lower):
        lower = stats.norm.cdf(-crit - nc)
    return float(min(upper + lower, 1.0))


def seeds_needed(delta: float, std: float, *, power_target: float = 0.8, level: float = 0.05, comparisons: int = 1,
                 shared_variance: float = 0.0) -> Optional[int]:
    """Smallest n >= 2 seeds per arm with :func:`power` >= ``power_target``; None when no n reaches it."""
    _check(delta, std, level, comparisons, power_target, shared_variance)
    if power(_MAX_SEEDS, delta, std, level=level, comparisons=comparisons,
             shared_variance=shared_variance) < power_target:
        return None
    low, high = 1, 2
    while power(high, delta, std, level=level, comparisons=comparisons, shared_variance=shared_variance) < power_target:
        low, high = high, min(2 * high, _MAX_SEEDS)
    while high - low > 1:  # power increases with n
        mid = (low + high) // 2
        if power(mid, delta, std, level=level, comparisons=comparisons,
                 shared_variance=shared_variance) >= power_target:
            high = mid
        else:
            low = mid
    return high


def detectable_difference(n: int, std: float, *, power_target: float = 0.8, level: float = 0.05,
                          comparisons: int = 1, shared_variance: float = 0.0) -> float:
    """Smallest difference detected with ``power_target`` by n >= 2 seeds (bisection on :func:`power`)."""
    if n < 2:
        return float("inf")
    _check(1.0, std, level, comparisons, power_target, shared_variance)
    scale = math.sqrt(std ** 2 / n + shared_variance)
    if scale == 0:
        return 0.0
    low, high = 0.0, scale
    while power(n, high, std, level=level, comparisons=comparisons, shared_variance=shared_variance) < power_target:
        high *= 2
    for _ in range(60):
        mid = 0.5 * (low + high)
        if power(n, mid, std, level=level, comparisons=comparisons, shared_variance=shared_variance) >= power_target:
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class SeedPlan:
    """Seeds per arm needed to detect ``delta`` (``needed``; None: none suffices) and what it assumed."""

    delta: float
    delta_source: str  # "given", "the paper's claimed gain", "the observed difference"
    std: float
    std_source: str  # "observed over n seeds", "given", "assumed: ..."
    comparisons: int
    level: float
    power: float
    needed: Optional[int]
    shared_variance: float = 0.0
    seeds_now: int = 0
    detectable_now: float = float("nan")  # smallest difference the current seeds detect

    def text(self, metric: str = "", digits: int = 3) -> str:
        """"to detect Δ = 0.6 AP^b with the observed std 0.10 (...): n ≥ 3 seeds per arm"."""
        name = f" {metric}" if metric else ""
        head = (f"to detect Δ = {self.delta:.{digits}g}{name} ({self.delta_source}) with std {self.std:.{digits}g} "
                f"of the paired differences ({self.std_source}) at {self.power:.0%} power, two-sided level "
                f"{self.level:g}" + (f" Holm-adjusted over {self.comparisons} comparisons" if self.comparisons > 1
                                     else ""))
        if self.needed is None:
            return head + ": no number of seeds suffices (the evaluation-image variance shared by every run is " \
                          "too large: more evaluation images are needed)"
        return head + f": n ≥ {self.needed} seeds per arm"


def plan_seeds(delta: float, std: float, *, delta_source: str = "given", std_source: str = "given",
               comparisons: int = 1, level: float = 0.05, power_target: float = 0.8, shared_variance: float = 0.0,
               seeds_now: int = 0) -> SeedPlan:
    """A :class:`SeedPlan` (and, with ``seeds_now`` >= 2, the difference those seeds detect)."""
    needed = seeds_needed(delta, std, power_target=power_target, level=level, comparisons=comparisons,
                          shared_variance=shared_variance)
    detectable = detectable_difference(seeds_now, std, power_target=power_target, level=level,
                                       comparisons=comparisons, shared_variance=shared_variance) \
        if seeds_now >= 2 else float("nan")
    return SeedPlan(delta, delta_source, std, std_source, comparisons, level, power_target, needed, shared_variance,
                    seeds_now, detectable)
