"""Family-wise error control over the comparisons with the default arm: Holm–Bonferroni.

A stage's family is every (arm, headline metric) comparison with the default arm at the main
learning-rate scale (detection: AP^b and AP^m; classification: top-1), fixed before looking at the
results. A comparison without a p-value (no paired seed, no interval) stays in the family with p = 1:
it cannot be rejected, and leaving it out would loosen the others' thresholds. Holm's step-down
procedure rejects the hypotheses with the smallest p-values while p_(i) <= alpha / (m - i + 1), which
controls the probability of any false verdict at alpha under every dependence between the comparisons
(they are dependent here: all arms share the default runs, box and mask AP share the detections).
"""
from __future__ import annotations

import numpy as np

__all__ = ["holm_adjust"]


def holm_adjust(p_values) -> np.ndarray:
    """
    Holm-adjusted p-values of a family [..., m] (batch dimensions first; NaN counts as 1): the
    adjusted value of the i-th smallest is max over j <= i of min(1, (m - j + 1) p_(j)). A hypothesis
    is rejected at family-wise level alpha when its adjusted p-value is at most alpha.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim == 0:
        raise ValueError("holm_adjust needs a family of p-values [..., m]; got a scalar")
    p = np.where(np.isnan(p), 1.0, p)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"p-values must lie in [0, 1]; got values in [{p.min()}, {p.max()}]")
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out
