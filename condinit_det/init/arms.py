"""The arms' math: weight blocks ``[out, in]`` (batched: ``[count, out, in]``, one per head) drawn in float32 on the
CPU from a caller's generator, factorized in the working precision on the input's device. Definitions, precision and
solvers: docs/arms.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .options import SOLVERS

__all__ = [
    "TopSingular",
    "haar_semi_orthogonal_batch",
    "mimetic_noise_batch",
    "mimetic_qk_batch",
    "mimetic_vo",
    "sign_convention",
    "standard_normal",
    "top_singular",
    "working_dtype",
]

_F64 = torch.float64
_F32 = torch.float32


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision an arm computes in for parameters of ``dtype``: float64 for float64, else float32."""
    return _F64 if dtype == _F64 else _F32


def _working(z: torch.Tensor) -> torch.Tensor:
    """float32 and float64 as they are, other dtypes in float64."""
    return z if z.dtype in (_F32, _F64) else z.to(_F64)


@contextlib.contextmanager
def _full_fp32(device: torch.device):
    """CUDA float32 matrix products without TF32 inside the block (TF32 would leave CholeskyQR orthogonal only to
    about 1e-3); the backend's own setting is restored, so either of torch's TF32 interfaces reads back."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def sign_convention(u: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Column j of ``u`` ``[..., p, k]`` and of ``v`` ``[..., q, k]`` flipped together so that the largest-magnitude
    entry of ``u[..., :, j]`` is positive (the first one on a tie); ``u diag(s) v^T`` is unchanged."""
    idx = u.abs().argmax(dim=-2, keepdim=True)
    signs = torch.where(torch.gather(u, -2, idx) < 0, -1.0, 1.0).to(u.dtype)
    return u * signs, v * signs


def standard_normal(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """float32 N(0, 1) samples of ``shape`` drawn on the CPU from ``generator``, whatever the parameters' dtype or
    device."""
    return torch.randn(shape, generator=generator, dtype=_F32)


# Wide blocks (columns >= this x rows) are orthonormalized by CholeskyQR: a Gaussian block of that
# shape has a condition number of at most about 3, so its orthogonality error, about eps * cond^2,
# matches Householder's, at about half the cost.
_CHOLESKY_MIN_ASPECT = 4


def _orthonormal_rows(h: torch.Tensor) -> torch.Tensor:
    """``Q^T`` of the reduced QR ``h^T = Q R`` with diag(R) >= 0 (``h [..., n, m]``, n <= m): CholeskyQR for wide
    blocks whose Gram matrix is numerically positive definite, else Householder; that QR is unique, so both agree."""
    n, m = h.shape[-2:]
    if m >= _CHOLESKY_MIN_ASPECT * n:
        with _full_fp32(h.device):
            lower, info = torch.linalg.cholesky_ex(h @ h.mT)
            if not bool((info != 0).any()):
                eye = torch.eye(n, dtype=h.dtype, device=h.device).expand_as(lower)
                return torch.linalg.solve_triangular(lower, eye, upper=False) @ h
    q, r = torch.linalg.qr(h.mT, mode="reduced")
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    signs = torch.where(diag < 0, -1.0, 1.0).to(q.dtype)  # sign(0) taken as +1
    return (q * signs.unsqueeze(-2)).mT


def haar_semi_orthogonal_batch(
    count: int,
    rows: int,
    cols: int,
    *,
    generator: torch.Generator,
    device: Optional[torch.device] = None,
    dtype: torch.dtype = _F64,
) -> torch.Tensor:
    """``[count, rows, cols]`` independent Haar blocks with orthonormal rows (rows <= cols) or columns: with one draw H
    ``[count, min(rows, cols), max(rows, cols)]``, the Q of the reduced QR ``H^T = Q R`` (diag(R) > 0), transposed when
    rows <= cols; in ``dtype`` on ``device`` (default: the CPU)."""
    short, tall = min(rows, cols), max(rows, cols)
    h = standard_normal(count, short, tall, generator=generator).to(device=device, dtype=dtype)
    q_t = _orthonormal_rows(h)
    return q_t if rows <= cols else q_t.mT


def mimetic_noise_batch(
    count: int, rows: int, cols: int, *, std: float, noise: str, generator: torch.Generator, dtype: torch.dtype = _F64
) -> torch.Tensor:
    """``[count, rows, cols]`` zero-mean noise of standard deviation ``std``, ``"normal"`` or ``"uniform"`` (on
    [-sqrt(3) std, sqrt(3) std]): one float32 draw on the CPU, converted to ``dtype`` before it is scaled."""
    if noise == "normal":
        return standard_normal(count, rows, cols, generator=generator).to(dtype).mul_(std)
    if noise == "uniform":
        u = torch.empty(count, rows, cols, dtype=_F32).uniform_(0.0, 1.0, generator=generator).to(dtype)
        return u.mul_(2.0).sub_(1.0).mul_((3.0**0.5) * std)
    raise ValueError(f"noise must be 'normal' or 'uniform', got {noise!r}")


# "auto" takes the subspace solver on the CPU from this size on (below it the dense SVD is as
# fast), when k + oversampling leaves at least half of the spectrum out.
_SUBSPACE_MIN_DIM = 192


@dataclass
class TopSingular:
    """The top k triplets ``m ≈ u diag(s) v^T`` of each matrix of a batch: u ``[B, p, k]``, s ``[B, k]`` (descending),
    v ``[B, q, k]``; ``solver`` the one used, ``fallback`` ``[B]`` True where the subspace check failed and the dense
    SVD was used, ``estimate`` ``[B]`` the check's bound on the rank-k product's relative error (0 when dense)."""

    u: torch.Tensor
    s: torch.Tensor
    v: torch.Tensor
    solver: str
    fallback: torch.Tensor
    estimate: torch.Tensor


def _resolve_solver(solver: str, m: torch.Tensor, k: int, oversample: int) -> str:
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    small = min(m.shape[-2:])
    if solver == "subspace" and k + 1 > small:
        raise ValueError(f"the subspace solver needs k < min(m.shape[-2:]); got k={k} for {tuple(m.shape[-2:])}")
    if solver != "auto":
        return solver
    if m.device.type != "cpu" or small < _SUBSPACE_MIN_DIM or 2 * (k + oversample) > small:
        return "dense"
    return "subspace"


def _dense_top(m: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(m.to(_F64), full_matrices=False)
    return tuple(x.to(m.dtype) for x in (u[..., :k], s[..., :k], vh[..., :k, :].mT))


def top_singular(
    m: torch.Tensor, k: int, *, solver: str = "auto", oversample: Optional[int] = None, tol: float = 1e-4
) -> TopSingular:
    """The top-k singular triplets of each matrix of ``m`` (``[B, p, q]``, float32 or float64), in m's dtype, signed by
    :func:`sign_convention` whatever the solver (the solvers: docs/arms.md#how-the-arms-are-computed).

    Args:
        solver: ``"dense"`` (float64 SVD, the reference), ``"subspace"`` (CPU: subset eigensolver on the float32 Gram
            matrix and a Rayleigh–Ritz step; a matrix failing its check is recomputed densely) or ``"auto"``.
        oversample: extra eigenvectors in the subspace block (default ``max(16, k // 4)``).
        tol: bound on the relative Frobenius error of the rank-k product (subspace solver).
    """
    if m.dim() != 3:
        raise ValueError(f"top_singular takes a batch [B, p, q], got shape {tuple(m.shape)}")
    m = _working(m)
    small = min(m.shape[-2:])
    if not 1 <= k <= small:
        raise ValueError(f"k must be in [1, {small}] for a {tuple(m.shape[-2:])} matrix, got {k}")
    if oversample is None:
        oversample = max(0, min(max(16, k // 4), small - k))
    solver = _resolve_solver(solver, m, k, oversample)
    batch = m.shape[0]
    if solver == "dense":
        u, s, v = _dense_top(m, k)
        u, v = sign_convention(u, v)
        zeros = torch.zeros(batch, dtype=m.dtype, device=m.device)
        return TopSingular(u, s, v, solver, torch.zeros(batch, dtype=torch.bool, device=m.device), zeros)
    if m.device.type != "cpu":
        raise ValueError("the subspace solver runs on the CPU; use solver='dense' on other devices")
    # Work with the q <= p orientation: the right singular vectors are the Gram's eigenvectors.
    wide = m.shape[-2] < m.shape[-1]
    mm = m.mT if wide else m
    u, s, v, fallback, estimate = _subspace_top(mm, k, max(1, min(oversample, small - k)), tol)
    if wide:
        u, v = v, u
    u, v = sign_convention(u, v)
    return TopSingular(u, s, v, solver, fallback, estimate)


def _subspace_top(m: torch.Tensor, k: int, oversample: int, tol: float):
    import numpy as np
    import scipy.linalg

    batch, _, q = m.shape
    width = k + oversample
    m32 = m.to(_F32).numpy()
    blocks = np.empty((batch, q, width), dtype=np.float32)
    eig32 = np.empty((batch, width), dtype=np.float64)
    for i in range(batch):  # LAPACK has no batched subset solver: one dense q x q solve per matrix
        side = np.ascontiguousarray(m32[i])
        # side^T side of one buffer is NumPy's ?syrk; ?syevr reads its upper triangle.
        w, vec = scipy.linalg.eigh(
            side.T @ side, lower=False, subset_by_index=(q - width, q - 1), driver="evr", check_finite=False
        )
        blocks[i] = vec[:, ::-1]
        eig32[i] = w[::-1]
    del m32
    basis = _orthonormal_rows(torch.from_numpy(blocks).to(m.dtype).mT).mT  # orthonormal columns
    y = torch.bmm(m, basis)  # [B, p, width]
    theta, w = torch.linalg.eigh(torch.bmm(y.mT, y))  # Rayleigh-Ritz of m^T m on the block
    theta, w = theta.flip(-1), w.flip(-1)
    v_all = torch.bmm(basis, w)
    z = torch.bmm(y, w)  # = m v_all = u s
    s_all = torch.linalg.vector_norm(z, dim=-2)
    u = z[..., :k] / torch.where(s_all[..., :k] > 0, s_all[..., :k], 1.0).unsqueeze(-2)
    s, v = s_all[..., :k], v_all[..., :k]
    # Check. (m^T u - v s) s is the residual of the Ritz pairs of m^T m; over the gap to
    # the rest of the block it bounds the sine of the angle to the true top-k subspace
    # (Davis-Kahan), and s_1 sqrt(2) times that bounds the change of the rank-k product.
    resid = torch.linalg.matrix_norm((torch.bmm(m.mT, u) - v * s.unsqueeze(-2)) * s.unsqueeze(-2))
    ritz = s_all.square()
    gap = ritz[:, k - 1] - ritz[:, width - 1]
    scale = torch.linalg.vector_norm(s, dim=-1)
    estimate = (2**0.5) * s[:, 0] * resid / (gap * scale)
    estimate = torch.where((gap > 0) & (scale > 0), estimate, torch.full_like(estimate, float("inf")))
    # A block that is invariant but not the top one would pass the residual test; its Ritz values
    # then fall short of the top float32 eigenvalues by about the gap, in sum.
    shortfall = (torch.from_numpy(eig32).to(m.dtype) - theta).abs().sum(-1)
    ok = (estimate <= tol) & (shortfall <= 0.25 * gap) & torch.isfinite(estimate)
    fallback = ~ok
    if bool(fallback.any()):
        idx = fallback.nonzero().flatten()
        du, ds, dv = _dense_top(m[idx], k)
        u, s, v = u.clone(), s.clone(), v.clone()
        u[idx], s[idx], v[idx] = du, ds, dv
    return u, s, v, fallback, estimate


def _add_rect_identity_(m: torch.Tensor, value: float) -> torch.Tensor:
    torch.diagonal(m, dim1=-2, dim2=-1).add_(value)
    return m


def mimetic_qk_batch(
    z: torch.Tensor, *, alpha: float, beta: float, head_dim: int, solver: str = "auto"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Query and key blocks ``W_q = (U sqrt(S))^T`` ``[H, dh, D_in]`` and ``W_k = (V sqrt(S))^T`` ``[H, dh, D_k_in]``
    from the top-dh triplets of each head's target ``M = alpha z + beta I`` (``z [H, D_in, D_k_in]``; rectangular
    identity), so ``W_q^T W_k`` is M's best rank-dh approximation; in z's working precision, on z's device."""
    if head_dim > min(z.shape[-2:]):
        raise ValueError(
            f"mimetic Q/K needs head_dim <= min(D_in, D_k_in); got head_dim={head_dim} for a "
            f"{tuple(z.shape[-2:])} target"
        )
    m = _add_rect_identity_(_working(z) * alpha, beta)
    top = top_singular(m, head_dim, solver=solver)
    root = top.s.sqrt().unsqueeze(-2)
    return (top.u * root).mT.contiguous(), (top.v * root).mT.contiguous()


def _gram_eigenvectors(side: torch.Tensor) -> torch.Tensor:
    """Every eigenvector of ``side^T side`` by descending eigenvalue: on the CPU by NumPy's ``?syrk`` and scipy's
    ``?syevd`` (the roundings the arm's values are made with), elsewhere ``torch.linalg.eigh``."""
    if side.device.type != "cpu":
        return torch.linalg.eigh(side.mT @ side)[1].flip(-1)
    import numpy as np
    import scipy.linalg

    a = np.ascontiguousarray(side.numpy())
    _, vec = scipy.linalg.eigh(a.T @ a, lower=False, driver="evd", check_finite=False)
    return torch.from_numpy(vec[:, ::-1].copy())


def mimetic_vo(
    z: torch.Tensor, *, alpha: float, beta: float, dim_v: int, w_v_default: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """Value and output blocks from the noise ``z`` ``[D_v_in, D_out]``, in z's dtype on z's device.

    With the SVD of the target ``M = alpha z - beta I`` = U S V^T (from the smaller Gram matrix, so that
    ``M V V^T = M`` however small a singular value is) and r = min(D_v_in, D_out, dim_v), value rows j < r are
    ``sqrt(s_j) U[:, j]^T`` and output columns j < r ``sqrt(s_j) V[:, j]``; further value rows keep ``w_v_default``
    and their output columns are zero. Returns ``(W_v [dim_v, D_v_in], W_o [D_out, dim_v], exact)``, exact when
    ``W_v^T W_o^T = M`` (dim_v >= min(D_v_in, D_out); else it is M's best rank-dim_v approximation).
    """
    d_v_in, d_out = z.shape
    m = _add_rect_identity_(_working(z) * alpha, -beta)
    r = min(d_v_in, d_out, dim_v)
    left = d_v_in < d_out  # decompose on the smaller side
    side = m.mT if left else m  # [rows >= cols]
    with _full_fp32(m.device):
        basis = _gram_eigenvectors(side)[:, :r]  # right singular vectors of `side`
        image = side @ basis  # = U S of `side`
    # M's left singular vectors are `basis` when side = M^T, else `image` (U S, the same signs).
    if left:
        basis, image = sign_convention(basis, image)
    else:
        image, basis = sign_convention(image, basis)
    s = torch.linalg.vector_norm(image, dim=0)
    root = s.sqrt()
    scaled = image / torch.where(root > 0, root, 1.0)  # U sqrt(S); a zero column stays zero
    other = basis * root  # V sqrt(S)
    if left:  # side = M^T: its right vectors are M's left ones
        value_rows, out_cols = other, scaled
    else:
        value_rows, out_cols = scaled, other
    w_v = w_v_default.to(device=m.device, dtype=m.dtype).clone()
    w_v[:r] = value_rows.T
    w_o = torch.zeros(d_out, dim_v, dtype=m.dtype, device=m.device)
    w_o[:, :r] = out_cols
    return w_v, w_o, dim_v >= min(d_v_in, d_out)
