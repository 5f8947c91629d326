"""The math of the arms: weight blocks drawn in float64 on the CPU from a caller's generator.

Shapes follow PyTorch ``Linear``: a block for a projection is ``[out, in]``.

- :func:`haar_semi_orthogonal` — a Haar-distributed block with orthonormal rows (or columns),
  so every singular value is 1 (conditioned Q/K).
- :func:`rectangular_identity` — ones on the main diagonal (conditioned V).
- :func:`mimetic_qk` / :func:`mimetic_vo` — the factorisations of Trockman & Kolter's target products.
"""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = [
    "haar_semi_orthogonal",
    "rectangular_identity",
    "mimetic_noise",
    "mimetic_qk",
    "mimetic_vo",
]

_F64 = torch.float64


def haar_semi_orthogonal(rows: int, cols: int, *, generator: torch.Generator) -> torch.Tensor:
    """``[rows, cols]`` block with orthonormal rows (rows <= cols) or columns (rows > cols).

    Draws G with N(0, 1) entries of shape ``[max, min]``, takes the reduced QR G = QR and fixes
    signs with sign(diag(R)), which makes Q Haar-distributed. All singular values equal 1.
    """
    tall, short = max(rows, cols), min(rows, cols)
    g = torch.randn(tall, short, generator=generator, dtype=_F64)
    q, r = torch.linalg.qr(g, mode="reduced")
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    q = q * signs
    return q.T.contiguous() if rows <= cols else q


def rectangular_identity(rows: int, cols: int) -> torch.Tensor:
    """``[rows, cols]`` with ones on the main diagonal: ``x @ I.T`` keeps the first coordinates of x."""
    return torch.eye(rows, cols, dtype=_F64)


def mimetic_noise(rows: int, cols: int, *, std: float, noise: str, generator: torch.Generator) -> torch.Tensor:
    """``[rows, cols]`` zero-mean noise with standard deviation ``std``.

    noise: ``"normal"`` (Gaussian) or ``"uniform"`` (uniform on [-sqrt(3) std, sqrt(3) std]).
    """
    if noise == "normal":
        return torch.randn(rows, cols, generator=generator, dtype=_F64) * std
    if noise == "uniform":
        u = torch.rand(rows, cols, generator=generator, dtype=_F64)
        return (2.0 * u - 1.0) * (3.0 ** 0.5) * std
    raise ValueError(f"noise must be 'normal' or 'uniform', got {noise!r}")


def mimetic_qk(z: torch.Tensor, *, alpha: float, beta: float, head_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """One head's query and key blocks from the noise ``z`` (``[D_in, D_k_in]``).

    Target M = alpha * z + beta * I (rectangular identity when D_in != D_k_in). With the SVD
    M = U S V^T, returns ``W_q = (U[:, :dh] sqrt(S[:dh]))^T`` (``[dh, D_in]``) and
    ``W_k = (V[:, :dh] sqrt(S[:dh]))^T`` (``[dh, D_k_in]``), so ``W_q^T W_k`` is the best rank-dh
    approximation of M.

    Only the top dh right singular vectors are needed, so they come from the symmetric eigensolver
    on M^T M (several times cheaper than a full SVD; this runs once per head), and
    U[:, :dh] S[:dh] = M V[:, :dh].
    """
    m = alpha * z + beta * rectangular_identity(*z.shape)
    if head_dim > min(m.shape):
        raise ValueError(
            f"mimetic Q/K needs head_dim <= min(D_in, D_k_in); got head_dim={head_dim} for a {tuple(m.shape)} target"
        )
    eigvals, eigvecs = torch.linalg.eigh(m.T @ m)  # ascending
    v = eigvecs[:, -head_dim:].flip(-1)
    s = eigvals[-head_dim:].flip(-1).clamp_min(0).sqrt()
    root = s.sqrt()
    w_q = ((m @ v) / root).T  # (U S / sqrt(S))^T = (U sqrt(S))^T
    w_k = (v * root).T
    return w_q.contiguous(), w_k.contiguous()


def mimetic_vo(
    z: torch.Tensor, *, alpha: float, beta: float, dim_v: int, w_v_default: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """Value and output blocks from the noise ``z`` (``[D_v_in, D_out]``).

    Target M = alpha * z - beta * I (rectangular identity when non-square). With the full SVD
    M = U S V^T and r = min(D_v_in, D_out, dim_v), value rows j < r are ``sqrt(s_j) U[:, j]^T`` and
    output columns j < r are ``sqrt(s_j) V[:, j]``. When ``dim_v`` exceeds the rank, the extra
    value rows keep ``w_v_default`` and the matching output columns are zero, so
    ``W_v^T W_o^T = M`` holds exactly whenever dim_v >= min(D_v_in, D_out); otherwise the product
    is the best rank-dim_v approximation of M.

    Returns ``(W_v [dim_v, D_v_in], W_o [D_out, dim_v], exact)``.
    """
    d_v_in, d_out = z.shape
    m = alpha * z - beta * rectangular_identity(d_v_in, d_out)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    r = min(d_v_in, d_out, dim_v)
    root = s[:r].sqrt()
    w_v = w_v_default.to(_F64).clone()
    w_v[:r] = (u[:, :r] * root).T
    w_o = torch.zeros(d_out, dim_v, dtype=_F64)
    w_o[:, :r] = vh[:r].T * root
    return w_v, w_o, dim_v >= min(d_v_in, d_out)
