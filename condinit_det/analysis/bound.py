"""The terms of Theorem 3.1 (Saratchandran & Lucey) and the bound on kappa(J) they give, on the paper's f (no biases,
relative positions, masks or pooling). See docs/conditioning.md#methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

import torch

from .spectrum import condition_number

__all__ = ["BoundTerms", "lambda_softmax_condition", "theorem_terms"]


@dataclass
class BoundTerms:
    """Theorem 3.1 terms for one attention layer (per-head lists in head order)."""

    bound: float
    kappa_x: float
    kappa_wq: float
    kappa_wk: float
    kappa_wv: float
    kappa_softmax: float  # max over heads of kappa(A_h)
    kappa_lambda: float  # max over heads of kappa(Lambda(softmax)) on 1-complement
    tokens: int
    bound_heads: List[float] = field(default_factory=list)
    kappa_wq_heads: List[float] = field(default_factory=list)
    kappa_wk_heads: List[float] = field(default_factory=list)
    kappa_wv_heads: List[float] = field(default_factory=list)
    kappa_softmax_heads: List[float] = field(default_factory=list)
    kappa_lambda_heads: List[float] = field(default_factory=list)


def _attention_matrices(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Row-softmax attention matrices ``[heads, N, N]`` of the paper's f (float64, no biases)."""
    x = x.to(torch.float64)
    dh = wq.shape[0] // num_heads
    q, k = ((x @ w.to(torch.float64).T).reshape(x.shape[0], num_heads, dh).transpose(0, 1) for w in (wq, wk))
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dh), dim=-1)


def _secular_root(d: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, iters: int = 200) -> torch.Tensor:
    """Root in (lo, hi) of 1 - sum_j d_j^2 / (d_j - lam), per row (bisection; the function decreases)."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        g = 1.0 - (d * d / (d - mid[:, None])).sum(dim=1)
        lo = torch.where(g > 0, mid, lo)
        hi = torch.where(g > 0, hi, mid)
    return 0.5 * (lo + hi)


def lambda_softmax_condition(attn: torch.Tensor) -> float:
    """kappa of the row-softmax Jacobian diag_i(Lambda(a_i)) of ``attn [N, N]`` on the complement of the ones: the
    extreme nonzero eigenvalues of Lambda(a) = Diag(a) - a a^T are roots of the secular equation
    1 = sum_j a_j^2 / (a_j - lam) inside [a_2, a_1] and [a_N, a_{N-1}] (they interlace the sorted a)."""
    a = attn.to(torch.float64)
    n = a.shape[-1]
    if bool((a <= 0).any()):
        return math.inf  # an underflowed probability adds a second null direction
    d, _ = torch.sort(a, dim=1, descending=True)
    tiny = 1e-13 * d[:, 0]
    # A tie at an interval's ends pins the eigenvalue there (deflation); otherwise bisect.
    top = torch.where(d[:, 0] - d[:, 1] <= tiny, d[:, 0], _secular_root(d, d[:, 1].clone(), d[:, 0].clone()))
    bottom = (
        top
        if n == 2
        else torch.where(d[:, -2] - d[:, -1] <= tiny, d[:, -1], _secular_root(d, d[:, -1].clone(), d[:, -2].clone()))
    )
    smallest = float(bottom.min())
    if smallest <= 0:
        return math.inf
    return float(top.max()) / smallest


def theorem_terms(
    x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, *, num_heads: int
) -> BoundTerms:
    """Theorem 3.1 terms for token matrix ``x [N, D_in]`` feeding queries, keys and values, weights ``[out, D_in]``;
    per head h the bound is ``kappa(X)^3 kappa(Lambda_h) kappa(W_V^h) (kappa(W_Q^h) + kappa(W_K^h)) + kappa(X)
    kappa(A_h)``."""
    for name, w in (("W_Q", wq), ("W_K", wk), ("W_V", wv)):
        if w.shape[1] != x.shape[1]:  # e.g. the keys of cross-attention from another width
            raise ValueError(f"{name} must be [out, {x.shape[1]}] to act on X [N, {x.shape[1]}], got {tuple(w.shape)}")
    kx = condition_number(x)
    attn = _attention_matrices(x, wq, wk, num_heads)
    dh, dv = wq.shape[0] // num_heads, wv.shape[0] // num_heads
    kq, kk = ([condition_number(block) for block in w.split(dh)] for w in (wq, wk))
    kv = [condition_number(block) for block in wv.split(dv)]
    ka = [condition_number(a) for a in attn]
    kl = [lambda_softmax_condition(a) for a in attn]
    bounds = [kx**3 * lam * v * (q + k) + kx * a for q, k, v, a, lam in zip(kq, kk, kv, ka, kl)]
    return BoundTerms(
        bound=max(bounds),
        kappa_x=kx,
        kappa_wq=condition_number(wq),
        kappa_wk=condition_number(wk),
        kappa_wv=condition_number(wv),
        kappa_softmax=max(ka),
        kappa_lambda=max(kl),
        tokens=int(x.shape[0]),
        bound_heads=bounds,
        kappa_wq_heads=kq,
        kappa_wk_heads=kk,
        kappa_wv_heads=kv,
        kappa_softmax_heads=ka,
        kappa_lambda_heads=kl,
    )
