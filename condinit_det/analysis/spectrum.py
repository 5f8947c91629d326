"""Extreme singular values of a matrix (:func:`extreme_singular_values`) or of a map known by its products only
(:func:`matrix_free_spectrum`); kappa is over the min(rows, cols) singular values. See docs/conditioning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np
import scipy.linalg
import torch

__all__ = ["SpectrumResult", "condition_number", "extreme_singular_values", "matrix_free_spectrum", "singular_values"]

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass(kw_only=True)
class SpectrumResult:
    """Extreme singular values of a linear map (over its min(rows, cols) singular values) and how they were obtained.

    kappa: sigma_max / sigma_min, ``inf`` when ``rank_deficient`` (exact: fewer singular values than min(rows, cols)
        above the tolerance, counted in ``numerical_rank``; matrix-free: ``sigma_min <= rank_tol * sigma_max``).
    converged / iterations / products / residual_max / residual_min: matrix-free convergence (block steps, Gram
        operator applications, Ritz residuals relative to the largest Gram eigenvalue).
    method: "exact" or "lanczos"; structure: "closed_form" or "autodiff" for exact results (:mod:`.heads`).
    sigma_max_heads / sigma_min_heads / kappa_heads: per head, when J is block diagonal by heads (exact, no W_O).
    """

    kappa: float
    sigma_max: float
    sigma_min: float
    rank_deficient: bool
    numerical_rank: Optional[int] = None
    converged: bool = True
    iterations: int = 0
    residual_max: float = 0.0
    residual_min: float = 0.0
    method: str
    shape: Tuple[int, int]
    products: int = 0
    structure: str = ""
    sigma_max_heads: List[float] = field(default_factory=list)
    sigma_min_heads: List[float] = field(default_factory=list)
    kappa_heads: List[float] = field(default_factory=list)


def condition_number(matrix: torch.Tensor) -> float:
    """kappa of a 2-D tensor over its min(rows, cols) singular values (float64; inf when singular)."""
    kappa = float(torch.linalg.cond(matrix.detach().to(torch.float64)))
    return kappa if math.isfinite(kappa) else math.inf  # nan for an all-zero matrix


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """The min(rows, cols) singular values of a 2-D matrix, descending (float64)."""
    m = matrix.detach().to(torch.float64)
    m = m.T if m.shape[0] < m.shape[1] else m
    if m.shape[0] > 2 * m.shape[1]:
        # R of A = QR has A's singular values; QR plus the SVD of the small R cost a fraction of A's SVD.
        m = torch.linalg.qr(m, mode="r")[1]
    return torch.linalg.svdvals(m)


# Below this many singular values a full SVD takes milliseconds; above it, Lanczos on the QR factor is cheaper.
_FULL_SVD_SIZE = 256


def extreme_singular_values(matrix: torch.Tensor) -> Tuple[float, float]:
    """(sigma_max, sigma_min) of a 2-D matrix over its min(rows, cols) singular values (float64): above
    ``_FULL_SVD_SIZE`` of them, ARPACK's extreme eigenvalues of ``R^T R`` and of its inverse (triangular solves, nothing
    squared) for R of the tall orientation's QR, else (or where ARPACK fails) the full SVD."""
    m = matrix.detach().to(torch.float64)
    m = m.T if m.shape[0] < m.shape[1] else m
    if m.shape[1] > _FULL_SVD_SIZE:
        r = torch.linalg.qr(m, mode="r")[1].cpu().numpy()
        ends = _lanczos_ends(r) if np.all(np.diagonal(r) != 0) else None
        if ends is not None:
            return ends
        m = torch.from_numpy(r)
    s = singular_values(m)
    return float(s[0]), float(s[-1])


def _lanczos_ends(r: np.ndarray) -> Optional[Tuple[float, float]]:
    """(sigma_max, sigma_min) of an upper-triangular ``r`` with a nonzero diagonal, or None where ARPACK fails."""
    from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh

    n = r.shape[0]
    gram = LinearOperator((n, n), matvec=lambda v: r.T @ (r @ v), dtype=np.float64)
    inverse = LinearOperator(
        (n, n), matvec=lambda v: scipy.linalg.cho_solve((r, False), v, check_finite=False), dtype=np.float64
    )
    start = np.random.default_rng(0).standard_normal(n)  # a private generator: the global RNG stays untouched

    def largest(op):
        # At most 10 restarts (about 200 products, each O(n^2)): beyond that the full SVD is the cheaper route.
        return float(eigsh(op, k=1, which="LA", tol=1e-12, maxiter=10, v0=start, return_eigenvectors=False)[0])

    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            top, inv_top = largest(gram), largest(inverse)
    except (ArpackError, ArpackNoConvergence):
        return None
    if not (math.isfinite(top) and math.isfinite(inv_top) and top > 0 and inv_top > 0):
        return None
    return math.sqrt(top), 1.0 / math.sqrt(inv_top)


def _ritz_check(diag, off, last_coupling, tol: float, floor: float) -> Tuple[float, float, float, float, bool]:
    """(theta_min, theta_max, residual_min, residual_max, converged) of the block tridiagonal T of a Lanczos run:
    converged when both extreme Ritz residuals are ``<= tol * theta`` or the small one is zero to ``floor *
    theta_max``."""
    sizes = [a.shape[0] for a in diag]
    m = sum(sizes)
    t = torch.block_diag(*diag).to(torch.float64).cpu()
    start = 0
    for c, b in zip(off, sizes):  # B_j [b_{j+1}, b_j] below A_j, its transpose beside it
        c = c.to(torch.float64).cpu()
        t[start + b : start + b + c.shape[0], start : start + b] = c
        t[start : start + b, start + b : start + b + c.shape[0]] = c.T
        start += b
    # T is block tridiagonal (bandwidth < 2 b), and only its two extreme eigenpairs are needed: the
    # banded solver finds them in O(m b^2) instead of a dense O(m^3) eigh at every step.
    tn = t.numpy()
    bandwidth = min(m - 1, 2 * max(sizes) - 1)
    band = np.zeros((bandwidth + 1, m))
    for k in range(bandwidth + 1):
        band[k, : m - k] = np.diagonal(tn, -k)
    coupling = last_coupling.to(torch.float64).cpu().numpy()
    extremes = []
    for index in (0, m - 1):
        theta, vec = scipy.linalg.eig_banded(band, lower=True, select="i", select_range=(index, index))
        last = vec[m - sizes[-1] :, 0]  # the Ritz vector's components on the last block
        extremes.append((float(theta[0]), float(np.linalg.norm(coupling @ last))))
    (tmin, rmin), (tmax, rmax) = extremes
    ok_max = rmax <= tol * abs(tmax)
    ok_min = rmin <= tol * max(tmin, 0.0) or (tmin + rmin) <= floor * tmax
    return tmin, tmax, rmin, rmax, bool(ok_max and ok_min)


def matrix_free_spectrum(
    matvec: MatVec,
    rmatvec: MatVec,
    shape: Tuple[int, int],
    *,
    tol: float = 1e-4,
    max_iter: int = 60,
    block_size: int = 8,
    rank_tol: float = 1e-7,
    seed: int = 0,
    device=None,
) -> SpectrumResult:
    """sigma_max, sigma_min and kappa of ``J`` from ``matvec: V [b, cols] -> [b, rows]`` and ``rmatvec: U [b, rows]
    -> [b, cols]`` only: block Lanczos on the smaller Gram operator from a private random start, at most ``max_iter``
    steps of ``block_size`` products until the extreme sigma^2 are within ``tol`` (else sigma_min is over-estimated);
    rank deficient when sigma_min <= rank_tol * sigma_max.
    """
    rows, cols = int(shape[0]), int(shape[1])
    if max_iter <= 0 or block_size <= 0:
        raise ValueError(f"max_iter and block_size must be positive, got {max_iter} and {block_size}")
    n = min(rows, cols)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))

    def gram(x):  # J J^T on R^rows or J^T J on R^cols, whichever is smaller
        return matvec(rmatvec(x)) if rows <= cols else rmatvec(matvec(x))

    def random_block(size: int) -> torch.Tensor:
        return torch.randn(size, n, generator=gen, dtype=torch.float64).to(device)

    def orthogonalize(w: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            w = w - (w @ basis.T) @ basis
        return w

    q = torch.linalg.qr(random_block(min(block_size, n)).T).Q.T  # [b, n], orthonormal rows
    blocks = [q]
    diag, off = [], []  # A_j [b_j, b_j]; B_j [b_{j+1}, b_j] with G Q_j = A_j Q_j + B_{j-1}^T Q_{j-1} + B_j^T Q_{j+1}
    products = 0
    for _ in range(max_iter):
        q = blocks[-1]
        w = gram(q)
        products += q.shape[0]
        a = q @ w.T
        a = 0.5 * (a + a.T)
        w = w - a @ q
        if off:
            w = w - off[-1] @ blocks[-2]
        basis = torch.cat(blocks, dim=0)
        w = orthogonalize(w, basis)
        diag.append(a)
        remaining = n - basis.shape[0]
        if remaining > 0:
            # Rank-revealing split of the residual block; directions below round-off are dropped
            # (the start block's Krylov space became invariant) and replaced by fresh random ones.
            u, s, vh = torch.linalg.svd(w.T, full_matrices=False)  # w.T = u s vh, u [n, b]
            scale = max(float(s[0]) if s.numel() else 0.0, max(float(x.abs().max()) for x in diag))
            keep = int((s > 1e-10 * scale).sum()) if scale > 0 else 0
            keep = min(keep, remaining)
            new = u[:, :keep].T
            coupling = s[:keep, None] * vh[:keep]  # [keep, b_j]
            fill = min(q.shape[0], remaining) - keep
            if fill > 0:
                extra = orthogonalize(random_block(fill), torch.cat([basis, new], dim=0))
                extra = torch.linalg.qr(extra.T).Q.T
                new = torch.cat([new, extra], dim=0)
                coupling = torch.cat([coupling, coupling.new_zeros(fill, q.shape[0])], dim=0)
        else:
            new, coupling = None, w.new_zeros(0, q.shape[0])
        theta_min, theta_max, res_min, res_max, converged = _ritz_check(diag, off, coupling, tol, rank_tol**2)
        if remaining <= 0:  # the basis spans R^n: T is the whole operator
            converged, res_min, res_max = True, 0.0, 0.0
        if converged:
            break
        off.append(coupling)
        blocks.append(new)
    smax = math.sqrt(max(theta_max, 0.0))
    smin = math.sqrt(max(theta_min, 0.0))
    deficient = smin <= rank_tol * smax
    scale = max(abs(theta_max), 1e-300)
    return SpectrumResult(
        kappa=math.inf if deficient else smax / smin,
        sigma_max=smax,
        sigma_min=smin,
        rank_deficient=bool(deficient),
        converged=converged,
        iterations=len(diag),
        residual_max=res_max / scale,
        residual_min=res_min / scale,
        method="lanczos",
        shape=(rows, cols),
        products=products,
    )
