"""The terms of Theorem 3.1 (Saratchandran & Lucey) and the bound on kappa(J) they give.

For one head h with token matrix X [N, D_in] (one sequence), query/key/value blocks
W_Q^h, W_K^h [dh, D_in], W_V^h [dv, D_in] and attention matrix
A_h = softmax(X W_Q^h^T (X W_K^h^T)^T / sqrt(dh)) (row-wise softmax, [N, N]):

    bound_h = kappa(X)^3 * kappa(Lambda_h) * kappa(W_V^h) * (kappa(W_Q^h) + kappa(W_K^h))
              + kappa(X) * kappa(A_h)

Reading of the softmax terms (the paper's notation leaves them implicit):

- kappa(softmax) = kappa(A_h): the condition number of the head's attention matrix.
- kappa(Lambda(softmax)): Lambda(z) = Diag(z) - z z^T is the Jacobian of softmax at a row z;
  the row-wise softmax's Jacobian is block diagonal with blocks Lambda(a_i) over the rows a_i of
  A_h. Each block is singular along the all-ones vector (softmax ignores a common shift of its
  logits), so the condition number is taken on the complement of that direction:
  max_i lambda_max(Lambda(a_i)) / min_i lambda_min+(Lambda(a_i)), with lambda_min+ the smallest of
  the other N - 1 eigenvalues. It is inf when a probability underflows to 0.

Every kappa of a matrix is sigma_max / sigma_min over its min(rows, cols) singular values (inf when
singular). The layer's reported ``bound`` is the largest head bound; whole-matrix kappa(W_Q),
kappa(W_K), kappa(W_V) are reported next to the per-head ones. These terms follow the paper's f
(no biases, relative positions, masks or pooling) on the token matrix entering the q projection.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List

import torch

from .spectrum import condition_number

__all__ = ["BoundTerms", "theorem_terms", "lambda_softmax_condition", "attention_matrices"]


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

    def to_dict(self) -> dict:
        return asdict(self)


def attention_matrices(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Row-softmax attention matrices ``[heads, N, N]`` of the paper's f (float64, no biases)."""
    x = x.to(torch.float64)
    dh = wq.shape[0] // num_heads
    q = (x @ wq.to(torch.float64).T).reshape(x.shape[0], num_heads, dh).transpose(0, 1)
    k = (x @ wk.to(torch.float64).T).reshape(x.shape[0], num_heads, dh).transpose(0, 1)
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
    """kappa of the row-softmax Jacobian diag_i(Lambda(a_i)) on the complement of the ones direction.

    attn: ``[N, N]`` row-stochastic. Lambda(a) = Diag(a) - a a^T has eigenvalues interlacing the
    sorted a (a_1 >= lam_1 >= a_2 >= ... >= a_N >= lam_N = 0); lam_1 and lam_{N-1} are the roots of
    the secular equation 1 = sum_j a_j^2 / (a_j - lam) inside [a_2, a_1] and [a_N, a_{N-1}].
    """
    a = attn.to(torch.float64)
    n = a.shape[-1]
    if n < 2:
        raise ValueError("kappa(Lambda(softmax)) needs at least 2 tokens (Lambda is 0 for a single token)")
    if bool((a <= 0).any()):
        return math.inf  # an underflowed probability adds a second null direction
    d, _ = torch.sort(a, dim=1, descending=True)
    tiny = 1e-13 * d[:, 0]
    # A tie at an interval's ends pins the eigenvalue there (deflation); otherwise bisect.
    top = torch.where(d[:, 0] - d[:, 1] <= tiny, d[:, 0], _secular_root(d, d[:, 1].clone(), d[:, 0].clone()))
    if n == 2:
        bottom = top
    else:
        bottom = torch.where(d[:, -2] - d[:, -1] <= tiny, d[:, -1],
                             _secular_root(d, d[:, -1].clone(), d[:, -2].clone()))
    smallest = float(bottom.min())
    if smallest <= 0:
        return math.inf
    return float(top.max()) / smallest


def theorem_terms(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, *,
                  num_heads: int) -> BoundTerms:
    """Theorem 3.1 terms for token matrix ``x [N, D_in]`` and weights ``[out, in]`` (see module doc).

    Self-attention form: the same X feeds queries, keys and values.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be the token matrix [N, D_in], got shape {tuple(x.shape)}")
    for name, w in (("W_Q", wq), ("W_K", wk), ("W_V", wv)):
        if w.dim() != 2 or w.shape[1] != x.shape[1]:
            raise ValueError(f"{name} must be [out, {x.shape[1]}] to act on X [N, {x.shape[1]}], got {tuple(w.shape)}")
        if w.shape[0] % num_heads:
            raise ValueError(f"{name} has {w.shape[0]} rows, not a multiple of num_heads={num_heads}")
    kx = condition_number(x)
    attn = attention_matrices(x, wq, wk, num_heads)
    dh, dv = wq.shape[0] // num_heads, wv.shape[0] // num_heads
    heads = {k: [] for k in ("q", "k", "v", "a", "l", "b")}
    for h in range(num_heads):
        kq = condition_number(wq[h * dh:(h + 1) * dh])
        kk = condition_number(wk[h * dh:(h + 1) * dh])
        kv = condition_number(wv[h * dv:(h + 1) * dv])
        ka = condition_number(attn[h])
        kl = lambda_softmax_condition(attn[h])
        b = kx ** 3 * kl * kv * (kq + kk) + kx * ka
        for key, val in zip("qkvalb", (kq, kk, kv, ka, kl, b)):
            heads[key].append(val)
    return BoundTerms(
        bound=max(heads["b"]),
        kappa_x=kx,
        kappa_wq=condition_number(wq),
        kappa_wk=condition_number(wk),
        kappa_wv=condition_number(wv),
        kappa_softmax=max(heads["a"]),
        kappa_lambda=max(heads["l"]),
        tokens=int(x.shape[0]),
        bound_heads=heads["b"],
        kappa_wq_heads=heads["q"],
        kappa_wk_heads=heads["k"],
        kappa_wv_heads=heads["v"],
        kappa_softmax_heads=heads["a"],
        kappa_lambda_heads=heads["l"],
    )

