"""kappa of the attention Jacobian J = d vec f(X) / d vec(W_Q, W_K, W_V) at a fixed input X.

Three ways, same quantity (see :mod:`condinit_det.analysis.functional` for what ``f`` is):

- :func:`exact_conditioning`: exact, from J's block structure by heads (closed-form per-head factors
  for token attention, per-head autodiff otherwise; :mod:`condinit_det.analysis.heads`). Memory
  ``8 * (tokens * dh) * (3 * dh * tokens)`` bytes per head, so real widths fit at moderate token
  counts; refuses above ``max_entries``.
- :func:`dense_conditioning`: the dense Jacobian (``torch.func.jacfwd`` / ``jacrev``, float64) and
  all its singular values, the reference. Memory ``8 * rows * cols`` bytes, so it refuses layers
  above ``max_entries``.
- :func:`estimate_conditioning`: matrix-free, from Jacobian-vector products (``torch.func.jvp``)
  and vector-Jacobian products (``torch.func.vjp``) only; cost per Lanczos step is about one
  forward and one backward pass of the layer.

``J`` has ``rows = numel(output)`` and ``cols = |W_Q| + |W_K| + |W_V|``; kappa is over the
``min(rows, cols)`` singular values.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.func import jacfwd, jacrev

from .functional import AttentionFunction, eval_mode
from .heads import head_spectrum
from .operator import JacobianOperator
from .spectrum import SpectrumResult, exact_spectrum, matrix_free_spectrum

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "attention_jacobian",
    "exact_conditioning",
    "dense_conditioning",
    "estimate_conditioning",
    "JacobianOperator",
]

# 5e7 float64 entries = 400 MB for the dense Jacobian (plus as much again for the SVD).
DEFAULT_MAX_ENTRIES = 50_000_000


def _function(site, inputs, include_output_proj) -> AttentionFunction:
    if isinstance(site, AttentionFunction):
        return site
    if inputs is None:
        raise ValueError("inputs are required (the forward's arguments by name; see capture_site_inputs)")
    return AttentionFunction(site, inputs, include_output_proj=include_output_proj)


def attention_jacobian(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                       max_entries: int = DEFAULT_MAX_ENTRIES, chunk_size: Optional[int] = 256) -> torch.Tensor:
    """The dense Jacobian ``[rows, cols]`` in float64 (columns ordered vec W_Q, vec W_K, vec W_V).

    site: an ``AttentionSite`` with ``inputs``, or an ``AttentionFunction``.
    Raises ValueError when ``rows * cols > max_entries``.
    """
    fn = _function(site, inputs, include_output_proj)
    entries = fn.rows * fn.cols
    if entries > max_entries:
        raise ValueError(
            f"dense Jacobian of attention site {fn.site.name!r} would be {fn.rows} x {fn.cols} = {entries:.3g} "
            f"entries ({entries * 8 / 2**30:.2f} GiB in float64), above max_entries={max_entries:.3g}; use "
            f"method='exact' (exact_conditioning, per head) or 'matrix_free' (estimate_conditioning), reduce the "
            f"captured tokens, or raise max_entries")
    theta = fn.theta()
    # Forward mode needs one pass per column, reverse mode one per row.
    with eval_mode(fn.module):
        if fn.cols <= fn.rows:
            return jacfwd(fn.flat)(theta)
        return jacrev(fn.flat, chunk_size=chunk_size)(theta)


def dense_conditioning(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                       max_entries: int = DEFAULT_MAX_ENTRIES, rank_tol: Optional[float] = None) -> SpectrumResult:
    """kappa(J) from the dense Jacobian's singular values (``method="dense"``, the reference).

    rank_tol: relative tolerance of the numerical rank (default ``max(rows, cols) * eps``).
    """
    jac = attention_jacobian(site, inputs, include_output_proj=include_output_proj, max_entries=max_entries)
    return exact_spectrum(jac, rank_tol=rank_tol)


def exact_conditioning(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                       max_entries: int = DEFAULT_MAX_ENTRIES, rank_tol: Optional[float] = None) -> SpectrumResult:
    """Exact kappa(J) from J's per-head blocks (``method="exact"``); same values and rank test as
    :func:`dense_conditioning`, plus each head's sigma_max, sigma_min and kappa (without W_O).

    max_entries: refuse when the largest matrix formed (one head's factor) would exceed it.
    """
    fn = _function(site, inputs, include_output_proj)
    return head_spectrum(fn, include_output_proj=include_output_proj, rank_tol=rank_tol, max_entries=max_entries)


def estimate_conditioning(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                          tol: float = 1e-4, max_iter: int = 60, block_size: int = 8, rank_tol: float = 1e-7,
                          method: str = "lanczos", seed: int = 0, chunk_size: Optional[int] = None
                          ) -> SpectrumResult:
    """Matrix-free kappa(J) (see :func:`condinit_det.analysis.spectrum.matrix_free_spectrum`).

    tol: relative accuracy of the extreme squared singular values; max_iter: block-Lanczos steps,
    each ``block_size`` vjp and jvp products (batched, ``chunk_size`` at a time; None = all).
    ``result.converged`` is False when the cap was reached first; the returned sigma_min is then an
    upper bound (Ritz values approach it from above), kappa a lower one.
    """
    fn = _function(site, inputs, include_output_proj)
    op = JacobianOperator(fn, chunk_size=chunk_size)
    return matrix_free_spectrum(op.matvec, op.rmatvec, op.shape, tol=tol, max_iter=max_iter,
                                block_size=block_size, rank_tol=rank_tol,
                                method=method, seed=seed, dtype=torch.float64, device=fn.theta().device)
