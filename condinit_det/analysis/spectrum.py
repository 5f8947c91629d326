"""Extreme singular values of a linear map: exact (dense) and matrix-free (products only).

Conventions: the map is ``J: R^cols -> R^rows``. Its condition number is
``kappa = sigma_max / sigma_min`` over the ``min(rows, cols)`` singular values. When the smallest
of them is zero to working precision the map is *rank deficient*: ``kappa`` is ``inf`` and the
result says so instead of dividing by (nearly) zero.

The matrix-free estimate runs on the smaller Gram operator ``G = J J^T`` (``rows <= cols``) or
``G = J^T J`` (otherwise), whose eigenvalues are the squared singular values, applied as one
``J^T`` product followed by one ``J`` product. Both ends of the spectrum come from one block
Lanczos run with full reorthogonalization (blocks of vectors, so the products are batched);
the extreme Ritz values converge to the extreme eigenvalues from inside the spectrum and their
residuals bound the error (``|lambda - theta| <= residual``). The smallest eigenvalue converges
slowest: an unconverged run over-estimates sigma_min and under-estimates kappa.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np
import scipy.linalg
import torch

__all__ = [
    "SpectrumResult",
    "exact_spectrum",
    "matrix_free_spectrum",
    "lanczos_extremes",
    "condition_number",
    "singular_values",
    "extreme_singular_values",
]

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SpectrumResult:
    """Extreme singular values of a linear map and how they were obtained.

    kappa: sigma_max / sigma_min, ``inf`` when ``rank_deficient``.
    sigma_min: the smallest of the min(rows, cols) singular values (reported even when ~0).
    rank_deficient: sigma_min <= rank_tol * sigma_max.
    numerical_rank: number of singular values above the tolerance (exact method only, else None).
    converged / iterations / residual_max / residual_min / products: matrix-free convergence
        information (iterations = block steps, products = Gram-operator applications, i.e. pairs
        of J and J^T products);
        residuals are the Ritz residual norms of the extreme Gram eigenpairs relative to the largest
        Gram eigenvalue (0 for the exact method).
    method: "exact", "lanczos" or "eigsh". shape: (rows, cols) of the map.
    structure: how an exact result was formed ("dense", or "closed_form" / "autodiff" for the per-head
        factors of :mod:`condinit_det.analysis.heads`); "" for matrix-free.
    sigma_max_heads / sigma_min_heads / kappa_heads: per attention head, when J is block diagonal by
        heads (the site's values are the max / min over heads); empty otherwise.
    """

    kappa: float
    sigma_max: float
    sigma_min: float
    rank_deficient: bool
    numerical_rank: Optional[int]
    converged: bool
    iterations: int
    residual_max: float
    residual_min: float
    method: str
    shape: Tuple[int, int]
    products: int = 0
    structure: str = ""
    sigma_max_heads: List[float] = field(default_factory=list)
    sigma_min_heads: List[float] = field(default_factory=list)
    kappa_heads: List[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["shape"] = list(self.shape)
        return out


def condition_number(matrix: torch.Tensor) -> float:
    """kappa of a 2-D tensor over its min(rows, cols) singular values (float64; inf when singular)."""
    if matrix.dim() != 2:
        raise ValueError(f"condition_number expects a 2-D matrix, got shape {tuple(matrix.shape)}")
    s = torch.linalg.svdvals(matrix.detach().to(torch.float64))
    if s.numel() == 0:
        raise ValueError(f"condition_number of an empty matrix {tuple(matrix.shape)} is undefined")
    if s[-1] <= 0 or not torch.isfinite(s[0] / s[-1]):
        return math.inf
    return float(s[0] / s[-1])


def _default_rank_tol(rows: int, cols: int) -> float:
    # numpy.linalg.matrix_rank's default: max(M, N) * eps relative to sigma_max.
    return max(rows, cols) * torch.finfo(torch.float64).eps


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """The min(rows, cols) singular values of a 2-D matrix, descending (float64)."""
    m = matrix.detach().to(torch.float64)
    m = m.T if m.shape[0] < m.shape[1] else m
    if m.shape[0] > 2 * m.shape[1]:
        # A = QR has A's singular values in R: the QR of the tall orientation and the SVD of the small
        # square R cost a fraction of an SVD of the whole (4.7 s vs 18 s at 864 x 27648 here).
        m = torch.linalg.qr(m, mode="r")[1]
    return torch.linalg.svdvals(m)


# Below this many singular values a full SVD takes milliseconds; above it, Lanczos on the QR factor is cheaper.
_FULL_SVD_SIZE = 256


def extreme_singular_values(matrix: torch.Tensor) -> Tuple[float, float]:
    """sigma_max and sigma_min of a 2-D matrix over its min(rows, cols) singular values (float64).

    R from the QR of the tall orientation has the matrix's singular values. Above ``_FULL_SVD_SIZE`` of them, the
    extreme eigenvalues of ``R^T R`` come from ARPACK (Lanczos, relative accuracy 1e-12): the largest from products
    with R, the smallest as the largest of ``(R^T R)^{-1}`` through triangular solves with R (nothing squared
    beyond what an SVD of R sees: sigma_min accurate to about ``eps * sigma_max``). That skips the SVD's
    bidiagonalization, most of its cost (BENCHMARKS.md §5). A singular R, or one ARPACK does not settle, gets the
    full SVD.
    """
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
    inverse = LinearOperator((n, n), matvec=lambda v: scipy.linalg.cho_solve((r, False), v, check_finite=False),
                             dtype=np.float64)
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


def exact_spectrum(matrix: torch.Tensor, *, rank_tol: Optional[float] = None) -> SpectrumResult:
    """All singular values of a dense ``[rows, cols]`` matrix (computed in float64).

    rank_tol: relative tolerance for the numerical rank (default ``max(rows, cols) * eps``).
    """
    if matrix.dim() != 2:
        raise ValueError(f"exact_spectrum expects a 2-D matrix, got shape {tuple(matrix.shape)}")
    rows, cols = matrix.shape
    if rows == 0 or cols == 0:
        raise ValueError(f"exact_spectrum of an empty matrix {tuple(matrix.shape)} is undefined")
    tol = _default_rank_tol(rows, cols) if rank_tol is None else float(rank_tol)
    s = singular_values(matrix)
    smax, smin = float(s[0]), float(s[-1])
    rank = int((s > tol * smax).sum()) if smax > 0 else 0
    deficient = rank < min(rows, cols)
    return SpectrumResult(
        kappa=math.inf if deficient else smax / smin,
        sigma_max=smax,
        sigma_min=smin,
        rank_deficient=deficient,
        numerical_rank=rank,
        converged=True,
        iterations=0,
        residual_max=0.0,
        residual_min=0.0,
        method="exact",
        shape=(rows, cols),
        structure="dense",
    )


@dataclass
class _LanczosOut:
    theta_min: float
    theta_max: float
    res_min: float
    res_max: float
    iterations: int
    converged: bool
    products: int = 0


def lanczos_extremes(
    apply: MatVec,
    n: int,
    *,
    block_size: int = 8,
    dtype: torch.dtype = torch.float64,
    device=None,
    tol: float = 1e-4,
    max_iter: int = 60,
    floor: float = 0.0,
    seed: int = 0,
) -> _LanczosOut:
    """Smallest and largest eigenvalue of a symmetric PSD operator on R^n by block Lanczos.

    apply: ``[b, n] -> [b, n]``, the operator applied to each row (a block of b vectors; batching
    the products is what makes this fast). Full reorthogonalization (Gram-Schmidt twice) against
    the whole basis; a random start block from a private generator (the global RNG is untouched).
    max_iter: block steps; the Krylov basis holds at most ``block_size * max_iter`` vectors of
    length n (its memory). The basis stops growing at n, where the Ritz values are exact.
    Converged when both extreme Ritz pairs have residual ``<= tol * theta`` (relative eigenvalue
    accuracy ``tol``), or the small one has ``theta + residual <= floor * theta_max`` (zero to
    the accuracy asked for), or the basis spans an invariant subspace of dimension n.
    """
    if n <= 0:
        raise ValueError(f"operator dimension must be positive, got {n}")
    if max_iter <= 0 or block_size <= 0:
        raise ValueError(f"max_iter and block_size must be positive, got {max_iter} and {block_size}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))

    def random_block(rows: int) -> torch.Tensor:
        return torch.randn(rows, n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

    def orthogonalize(w: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            w = w - (w @ basis.T) @ basis
        return w

    q = torch.linalg.qr(random_block(min(block_size, n)).T).Q.T  # [b, n], orthonormal rows
    blocks = [q]
    diag, off = [], []  # A_j [b_j, b_j]; B_j [b_{j+1}, b_j] with G Q_j = A_j Q_j + B_{j-1}^T Q_{j-1} + B_j^T Q_{j+1}
    products = 0
    out = None
    for step in range(max_iter):
        q = blocks[-1]
        w = apply(q)
        products += q.shape[0]
        a = q @ w.T
        a = 0.5 * (a + a.T)
        w = w - a @ q
        if off:
            w = w - off[-1] @ blocks[-2]
        basis = torch.cat(blocks, dim=0)
        w = orthogonalize(w, basis)
        diag.append(a)
        size = basis.shape[0]
        remaining = n - size
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
        out = _ritz_check(diag, off, coupling, tol, floor)
        out.iterations, out.products = step + 1, products
        if remaining <= 0:
            out.converged, out.res_min, out.res_max = True, 0.0, 0.0
        if out.converged:
            break
        off.append(coupling)
        blocks.append(new)
    assert out is not None
    return out


def _ritz_check(diag, off, last_coupling, tol: float, floor: float) -> _LanczosOut:
    sizes = [a.shape[0] for a in diag]
    m = sum(sizes)
    t = torch.zeros(m, m, dtype=torch.float64)
    start = 0
    for j, a in enumerate(diag):
        b = sizes[j]
        t[start:start + b, start:start + b] = a.to(torch.float64).cpu()
        if j < len(diag) - 1:
            c = off[j].to(torch.float64).cpu()  # [b_{j+1}, b_j]
            t[start + b:start + b + c.shape[0], start:start + b] = c
            t[start:start + b, start + b:start + b + c.shape[0]] = c.T
        start += b
    # T is block tridiagonal (bandwidth < 2 b), and only its two extreme eigenpairs are needed: the
    # banded solver finds them in O(m b^2) instead of a dense O(m^3) eigh at every step.
    tn = t.numpy()
    bandwidth = min(m - 1, 2 * max(sizes) - 1)
    band = np.zeros((bandwidth + 1, m))
    for k in range(bandwidth + 1):
        band[k, :m - k] = np.diagonal(tn, -k)
    coupling = last_coupling.to(torch.float64).cpu().numpy()
    extremes = []
    for index in (0, m - 1):
        theta, vec = scipy.linalg.eig_banded(band, lower=True, select="i", select_range=(index, index))
        last = vec[m - sizes[-1]:, 0]  # the Ritz vector's components on the last block
        extremes.append((float(theta[0]), float(np.linalg.norm(coupling @ last))))
    (tmin, rmin), (tmax, rmax) = extremes
    ok_max = rmax <= tol * abs(tmax)
    ok_min = rmin <= tol * max(tmin, 0.0) or (tmin + rmin) <= floor * tmax
    return _LanczosOut(tmin, tmax, rmin, rmax, len(diag), bool(ok_max and ok_min))


def matrix_free_spectrum(
    matvec: MatVec,
    rmatvec: MatVec,
    shape: Tuple[int, int],
    *,
    tol: float = 1e-4,
    max_iter: int = 60,
    block_size: int = 8,
    rank_tol: float = 1e-7,
    method: str = "lanczos",
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device=None,
) -> SpectrumResult:
    """sigma_max, sigma_min and kappa of ``J`` from products ``J v`` and ``J^T u`` only.

    matvec: ``V [b, cols] -> (J V^T)^T [b, rows]``; rmatvec: ``U [b, rows] -> (J^T U^T)^T [b, cols]``
        (each row of the block is one vector; a plain 1-D-vector function can be batched with
        ``torch.func.vmap``).
    tol: relative accuracy asked of the extreme Gram eigenvalues (sigma^2); sigma is then
        accurate to about tol / 2. max_iter / block_size: block-Lanczos steps and vectors per step.
    rank_tol: sigma_min <= rank_tol * sigma_max is reported as rank deficient (kappa = inf).
        Below about 1e-7 the Gram eigenvalues cannot resolve it in float64.
    method: "lanczos" (block Lanczos, this module) or "eigsh" (scipy's ARPACK on a
        LinearOperator, one vector at a time, two runs; residuals are then NaN).
    """
    rows, cols = int(shape[0]), int(shape[1])
    if rows <= 0 or cols <= 0:
        raise ValueError(f"shape must be positive, got {shape}")
    if method not in ("lanczos", "eigsh"):
        raise ValueError(f"method must be 'lanczos' or 'eigsh', got {method!r}")
    if rows <= cols:
        n = rows

        def gram(u):
            return matvec(rmatvec(u))
    else:
        n = cols

        def gram(v):
            return rmatvec(matvec(v))

    if method == "lanczos":
        out = lanczos_extremes(gram, n, block_size=block_size, dtype=dtype, device=device, tol=tol,
                               max_iter=max_iter, floor=rank_tol ** 2, seed=seed)
    else:
        out = _eigsh_extremes(gram, n, dtype=dtype, device=device, tol=tol, max_iter=max_iter * block_size,
                              floor=rank_tol ** 2, seed=seed)
    smax = math.sqrt(max(out.theta_max, 0.0))
    smin = math.sqrt(max(out.theta_min, 0.0))
    deficient = smin <= rank_tol * smax
    scale = max(abs(out.theta_max), 1e-300)
    return SpectrumResult(
        kappa=math.inf if deficient else smax / smin,
        sigma_max=smax,
        sigma_min=smin,
        rank_deficient=bool(deficient),
        numerical_rank=None,
        converged=out.converged,
        iterations=out.iterations,
        residual_max=out.res_max / scale,
        residual_min=out.res_min / scale,
        method=method,
        shape=(rows, cols),
        products=out.products,
    )


def _eigsh_extremes(gram: MatVec, n: int, *, dtype, device, tol, max_iter, floor, seed) -> _LanczosOut:
    import numpy as np
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    calls = [0]

    def mv(x):
        calls[0] += 1
        t = torch.as_tensor(np.ascontiguousarray(x).reshape(1, -1), dtype=torch.float64).to(device=device, dtype=dtype)
        return gram(t)[0].to(torch.float64).cpu().numpy()

    if n <= 2:
        # ARPACK needs k < n; tiny operators are cheaper to form densely.
        eye = torch.eye(n, dtype=dtype, device=device)
        dense = gram(eye).to(torch.float64).cpu()
        ev = torch.linalg.eigvalsh(0.5 * (dense + dense.T))
        return _LanczosOut(float(ev[0]), float(ev[-1]), 0.0, 0.0, 1, True, n)
    op = LinearOperator((n, n), matvec=mv, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(n)
    converged = True
    values = {}
    for which in ("LA", "SA"):
        try:
            ev = eigsh(op, k=1, which=which, tol=tol, maxiter=max_iter, v0=v0, return_eigenvectors=False)
            values[which] = float(ev[0])
        except ArpackNoConvergence as err:
            converged = False
            ev = err.eigenvalues
            values[which] = float(ev[0]) if len(ev) else float("nan")
    return _LanczosOut(values["SA"], values["LA"], float("nan"), float("nan"), calls[0], converged, calls[0])
