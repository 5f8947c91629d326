"""The dense attention Jacobian and its full SVD: the reference the exact per-head route is checked against."""

import math
from types import SimpleNamespace

import torch
from torch.func import jacfwd, jacrev

from condinit_det.analysis import AttentionFunction
from condinit_det.analysis.functional import eval_mode


def dense_jacobian(fn: AttentionFunction) -> torch.Tensor:
    """``J [rows, cols]`` in float64, columns ordered vec W_Q, vec W_K, vec W_V."""
    theta = fn.theta()
    with eval_mode(fn.module):
        return jacfwd(fn.flat)(theta) if fn.cols <= fn.rows else jacrev(fn.flat)(theta)


def dense_spectrum(matrix: torch.Tensor) -> SimpleNamespace:
    """kappa, sigma_max, sigma_min and numerical rank (tolerance ``max(rows, cols) * eps``) from all singular values."""
    s = torch.linalg.svdvals(matrix.to(torch.float64))
    rows, cols = matrix.shape
    rank = int((s > max(rows, cols) * torch.finfo(torch.float64).eps * s[0]).sum())
    deficient = rank < min(rows, cols)
    return SimpleNamespace(
        kappa=math.inf if deficient else float(s[0] / s[-1]),
        sigma_max=float(s[0]),
        sigma_min=float(s[-1]),
        numerical_rank=rank,
        rank_deficient=deficient,
        shape=(rows, cols),
    )


def dense_conditioning(site, inputs, *, include_output_proj=False) -> SimpleNamespace:
    """:func:`dense_spectrum` of the site's dense Jacobian at ``inputs``."""
    return dense_spectrum(dense_jacobian(AttentionFunction(site, inputs, include_output_proj=include_output_proj)))
