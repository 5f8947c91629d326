"""Exact kappa of the attention Jacobian from per-head factors ``F_h`` with ``F_h F_h^T = J_h J_h^T`` (closed form for
token attention, ``torch.func`` otherwise, each checked against one ``J v``). See docs/conditioning.md#methods.
"""

from __future__ import annotations

import logging
import math
from collections import namedtuple
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import jacfwd, jacrev

from .functional import AttentionFunction, as_function
from .matrix_free import JacobianOperator
from .options import DEFAULT_MAX_ENTRIES
from .spectrum import SpectrumResult, extreme_singular_values, singular_values

__all__ = ["exact_conditioning", "factor_entries", "head_factors"]

_logger = logging.getLogger(__name__)
_QKV = ("q", "k", "v")
# Relative agreement asked of the random-direction check (float64 round-off is ~1e-15).
_CHECK_TOL = 1e-8


def _basis(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal ``[D_in, r]`` basis of a space holding the rows of ``x [M, D_in]`` (I when M >= D_in)."""
    m, d = x.shape
    if m >= d:
        return torch.eye(d, dtype=x.dtype, device=x.device)
    return torch.linalg.qr(x.T).Q


def _bases(fn: AttentionFunction) -> Dict[str, torch.Tensor]:
    """Per role, an orthonormal basis of the tokens entering its projection (I when they cannot be hooked)."""
    xs = fn.projection_inputs()
    if xs is None:
        return {r: torch.eye(w.shape[1], dtype=w.dtype, device=w.device) for r, w in zip(_QKV, fn.weights)}
    return {r: _basis(x) for r, x in xs.items()}


# What the closed form needs (float64): x_q [B, Nq, D_in], x_k / x_v [B, Nk, D_*]; q, k [B, H, N, dh]; v [B, H, Nk,
# dh_v]; attn [B, H, Nq, Nk]; rel [Nq, Nk, dh] or None (logits l_ij += q_i . rel_ij); scale; token_index [B, Nq].
_TokenAttention = namedtuple("_TokenAttention", "x_q x_k x_v q k v attn rel scale token_index")


def _bias(fn: AttentionFunction, role: str) -> Optional[torch.Tensor]:
    proj = fn.site.projections[role]
    b = fn.state.get(proj.bias) if proj.bias else None
    return None if b is None else b[proj.rows if proj.bias_rows is None else proj.bias_rows]


def _token_attention(fn: AttentionFunction, xs, scale: float, *, terms=(), rel=None, index=None) -> _TokenAttention:
    """Per-head q, k, v (biases included) of the inputs ``xs = (x_q, x_k, x_v)`` ``[B, N, D_*]`` and the softmax of
    ``scale q k^T`` plus ``q_i . rel_ij`` and each of ``terms``, in that order; ``index`` defaults to row-major."""
    heads = fn.site.num_heads
    q, k, v = (F.linear(x, w, _bias(fn, r)) for x, w, r in zip(xs, fn.weights, _QKV))
    q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2) for t in (q, k, v))
    logits = scale * q @ k.transpose(-2, -1)
    if rel is not None:
        logits = logits + torch.einsum("bhic,ijc->bhij", q, rel)
    for term in terms:
        logits = logits + term
    if index is None:
        index = torch.arange(q.shape[0] * q.shape[2]).reshape(q.shape[0], q.shape[2])
    return _TokenAttention(*xs, q, k, v, logits.softmax(-1), rel, float(scale), index)


def _d2_vit(fn: AttentionFunction) -> _TokenAttention:
    from detectron2.modeling.backbone.utils import get_rel_pos

    x = fn.inputs["x"]
    bsz, hh, ww, _ = x.shape
    tokens = x.reshape(bsz, hh * ww, -1)
    rel = None
    if fn.module.use_rel_pos:
        rh = get_rel_pos(hh, hh, fn.state["rel_pos_h"])  # [q_h, k_h, dh]
        rw = get_rel_pos(ww, ww, fn.state["rel_pos_w"])
        rel = (rh[:, None, :, None, :] + rw[None, :, None, :, :]).reshape(hh * ww, hh * ww, -1)
    return _token_attention(fn, (tokens,) * 3, fn.module.scale, rel=rel)


def _d2_swin(fn: AttentionFunction) -> _TokenAttention:
    x = fn.inputs["x"]
    mask = fn.inputs.get("mask")
    bsz, n, _ = x.shape
    table = fn.state["relative_position_bias_table"]
    terms = [table[fn.state["relative_position_index"].reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)[None]]
    if mask is not None:
        terms.append(mask[torch.arange(bsz) % mask.shape[0]][:, None])
    return _token_attention(fn, (x,) * 3, fn.module.scale, terms=terms)


def _timm_vit(fn: AttentionFunction) -> Optional[_TokenAttention]:
    m = fn.module
    extra = [k for k, v in fn.inputs.items() if k != "x" and v not in (None, False)]
    plain = all(isinstance(getattr(m, a, None), (nn.Identity, type(None))) for a in ("q_norm", "k_norm", "norm"))
    if extra or not plain or getattr(m, "gate", None) is not None:
        return None  # q/k norms, gates or attention masks: no closed form
    return _token_attention(fn, (fn.inputs["x"],) * 3, m.scale)


def _mask_bias(mask: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)
    return mask.to(dtype)


def _mha(fn: AttentionFunction) -> Optional[_TokenAttention]:
    m: nn.MultiheadAttention = fn.module
    if m.bias_k is not None or m.add_zero_attn or fn.inputs.get("is_causal"):
        return None  # no closed form with bias_k / bias_v, add_zero_attn or is_causal
    query, key, value = (fn.inputs[n] for n in ("query", "key", "value"))
    if query.dim() == 2:
        query, key, value = query[:, None], key[:, None], value[:, None]
        seq_first = True
    else:
        seq_first = not m.batch_first
    if seq_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    bsz, nq, _ = query.shape
    nk, heads = key.shape[1], m.num_heads
    terms = []
    am = _mask_bias(fn.inputs.get("attn_mask"), query.dtype)
    if am is not None:
        terms.append(am.reshape(bsz, heads, nq, nk) if am.dim() == 3 else am)
    kpm = _mask_bias(fn.inputs.get("key_padding_mask"), query.dtype)
    if kpm is not None:
        terms.append(kpm[:, None, None, :])
    index = torch.arange(nq * bsz).reshape(nq, bsz).T if seq_first else None
    return _token_attention(
        fn, (query, key, value), float(fn.weights[0].shape[0] // heads) ** -0.5, terms=terms, index=index
    )


_CLOSED_FORMS = {"d2_vit": _d2_vit, "d2_swin": _d2_swin, "timm_vit": _timm_vit, "mha": _mha}


def _closed_form_factors(fn: AttentionFunction) -> Optional[Tuple[List[torch.Tensor], torch.Tensor, Dict]]:
    """Per-head factors by the closed form of docs/conditioning.md, the query rows' output index and the bases; None
    where the layer has no closed form."""
    extract = _CLOSED_FORMS.get(fn.site.kind)
    t = None if extract is None else extract(fn)
    if t is None:
        return None
    bases = {r: _basis(x.reshape(-1, x.shape[-1])) for r, x in zip(_QKV, (t.x_q, t.x_k, t.x_v))}
    yq, yk, yv = (x @ bases[r] for r, x in zip(_QKV, (t.x_q, t.x_k, t.x_v)))  # [B, N, r]
    a = t.attn
    factors = []
    for h in range(a.shape[1]):
        ah, qh, kh, vh = a[:, h], t.q[:, h], t.k[:, h], t.v[:, h]  # [B, Nq, Nk], [B, N, dh]
        out = ah @ vh  # O_i = V^T a_i, [B, Nq, dh_v]

        # Called only within this head's iteration; the defaults bind this head's factors.
        def vt_lambda(z, vh=vh, ah=ah, out=out):
            # V^T Lambda_i Z for every query i: V^T Diag(a_i) Z - (V^T a_i)(a_i^T Z); z [B, Nk, m] -> [B, Nq, dh_v, m]
            return torch.einsum("bjd,bij,bjm->bidm", vh, ah, z) - out[..., :, None] * (ah @ z)[:, :, None, :]

        m_q = t.scale * vt_lambda(kh)  # s V^T Lambda_i K
        if t.rel is not None:
            # V^T Lambda_i R_i with R_i = rel[i] [Nk, dh] (the same for every sequence)
            m_q = (
                m_q
                + torch.einsum("bjd,bij,ijc->bidc", vh, ah, t.rel)
                - out[..., :, None] * torch.einsum("bij,ijc->bic", ah, t.rel)[:, :, None, :]
            )
        bsz, nq, dv = out.shape
        fq = m_q[..., :, :, None] * yq[:, :, None, None, :]  # [B, Nq, dh_v, dh, r_q]
        fk = t.scale * qh[:, :, None, :, None] * vt_lambda(yk)[:, :, :, None, :]  # [B, Nq, dh_v, dh, r_k]
        ay = ah @ yv  # [B, Nq, r_v]
        eye = torch.eye(dv, dtype=ay.dtype, device=ay.device)
        fv = eye[None, None, :, :, None] * ay[:, :, None, None, :]  # [B, Nq, dh_v, dh_v, r_v]
        factors.append(torch.cat([f.reshape(bsz * nq * dv, -1) for f in (fq, fk, fv)], dim=1))
    return factors, t.token_index.reshape(-1), bases


def _head_deltas(fn: AttentionFunction, bases: Dict[str, torch.Tensor], c: torch.Tensor, h: int):
    """(head h's rows, its rows of dW) of W_Q, W_K, W_V, from its reduced coordinates ``c`` (``C B^T`` per role)."""
    deltas, start = [], 0
    for role, w in zip(_QKV, fn.weights):
        rows, r = w.shape[0] // fn.site.num_heads, bases[role].shape[1]
        deltas.append((slice(h * rows, (h + 1) * rows), c[start : start + rows * r].reshape(rows, r) @ bases[role].T))
        start += rows * r
    return deltas


def _autodiff_factors(fn: AttentionFunction, bases: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """Per-head Jacobians of head h's outputs in the reduced coordinates (torch.func)."""
    heads = fn.site.num_heads
    dv = fn.weights[2].shape[0]
    size = sum(w.shape[0] // heads * bases[r].shape[1] for r, w in zip(_QKV, fn.weights))
    zero = torch.zeros(size, dtype=fn.dtype, device=fn.weights[0].device)
    factors = []
    for h in range(heads):

        def f_h(c, h=h):
            ws = [
                w.slice_scatter(w[rows] + delta, dim=0, start=rows.start, end=rows.stop)
                for w, (rows, delta) in zip(fn.weights, _head_deltas(fn, bases, c, h))
            ]
            return fn(*ws).reshape(-1, heads, dv // heads)[:, h].reshape(-1)

        # Forward mode where a head has no more coordinates than outputs, reverse mode otherwise.
        factors.append(jacfwd(f_h)(zero) if size <= fn.rows // heads else jacrev(f_h, chunk_size=256)(zero))
    return factors


def factor_entries(fn: AttentionFunction) -> int:
    """Float64 entries of the largest matrix the exact route forms (one head's factor; all heads' with W_O)."""
    heads = fn.site.num_heads
    bases = _bases(fn)
    cols = sum(w.shape[0] // heads * bases[r].shape[1] for r, w in zip(_QKV, fn.weights))
    return fn.rows * cols * heads if fn.include_output_proj else fn.rows // heads * cols


def _check(fn: AttentionFunction, factors, bases, token_index, w_out) -> float:
    """Relative difference between the factors' and the layer's own ``J v`` in one random direction."""
    gen = torch.Generator().manual_seed(0)
    coeffs = [torch.randn(f.shape[1], generator=gen, dtype=torch.float64).to(f) for f in factors]
    deltas = [torch.zeros_like(w) for w in fn.weights]
    for h, c in enumerate(coeffs):
        for i, (rows, delta) in enumerate(_head_deltas(fn, bases, c, h)):
            deltas[i][rows] = delta
    jv = JacobianOperator(fn).matvec(torch.cat([d.reshape(-1) for d in deltas])[None])[0]
    heads_out = torch.stack(
        [(f @ c).reshape(-1, f.shape[0] // token_index.numel()) for f, c in zip(factors, coeffs)], dim=1
    )  # [tokens, H, dh_v]
    pre = heads_out.reshape(token_index.numel(), -1)
    if w_out is not None:
        pre = pre @ w_out.T
    mine = torch.empty_like(pre)
    mine[token_index] = pre
    return float((mine.reshape(-1) - jv).norm() / jv.norm().clamp_min(1e-300))


def head_factors(
    fn: AttentionFunction, *, max_entries: Optional[int] = None
) -> Tuple[List[torch.Tensor], str, Optional[torch.Tensor]]:
    """(factors, structure, W_O): per head ``F_h [tokens * dh_v, cols_h]`` with ``F_h F_h^T = J_h J_h^T`` (rows ordered
    token, channel), "closed_form" or "autodiff", and W_O (None unless kept). Raises ValueError when the largest
    matrix formed would exceed ``max_entries``."""
    name = fn.site.name
    heads = fn.site.num_heads
    pre = fn
    w_out = None
    if fn.include_output_proj:
        pre = AttentionFunction(fn.site, fn.inputs, include_output_proj=False)
        proj = fn.site.projections["o"]
        w_out = fn.state[proj.weight][proj.rows]
    if pre.output_shape[-1] != fn.weights[2].shape[0]:
        raise ValueError(
            f"attention site {name!r}: the output's last dimension {pre.output_shape[-1]} is not the "
            f"value width {fn.weights[2].shape[0]}, so its channels cannot be split by head; use "
            f"method='matrix_free'"
        )
    bases = _bases(pre)
    entries = factor_entries(fn)
    if max_entries is not None and entries > max_entries:
        raise ValueError(
            f"exact per-head conditioning of attention site {name!r} would form a {entries:.3g}-entry matrix "
            f"({entries * 8 / 2**30:.2f} GiB in float64), above max_entries={max_entries:.3g}; use "
            f"method='matrix_free' (or fewer tokens, or a larger max_entries)"
        )
    closed = _closed_form_factors(pre)
    if closed is not None:
        factors, token_index, bases = closed
        err = _check(fn, factors, bases, token_index, w_out)
        if err <= _CHECK_TOL:
            return factors, "closed_form", w_out
        _logger.warning(
            "site %s (%s): closed form differs from the layer's Jacobian by %.2e; using autodiff",
            name,
            fn.site.kind,
            err,
        )
    factors = _autodiff_factors(pre, bases)
    tokens = factors[0].shape[0] // (fn.weights[2].shape[0] // heads)
    err = _check(fn, factors, bases, torch.arange(tokens), w_out)
    if not err <= _CHECK_TOL:
        raise RuntimeError(
            f"attention site {name!r} ({fn.site.kind}): J is not block diagonal by heads (a head's "
            f"output moves with another head's weights, relative {err:.2e}); use "
            f"method='matrix_free'"
        )
    return factors, "autodiff", w_out


def exact_conditioning(
    site,
    inputs: Optional[Dict[str, object]] = None,
    *,
    include_output_proj: bool = False,
    max_entries: Optional[int] = DEFAULT_MAX_ENTRIES,
) -> SpectrumResult:
    """Exact kappa(J) of an ``AttentionSite`` at ``inputs`` (or of an ``AttentionFunction``) from its per-head factors
    (:func:`head_factors`; ``max_entries`` None: no limit), with each head's values without W_O; rank deficient when
    fewer than min(rows, cols) singular values exceed ``max(rows, cols) * eps * sigma_max``."""
    fn = as_function(site, inputs, include_output_proj=include_output_proj)
    factors, structure, w_out = head_factors(fn, max_entries=max_entries)
    heads = len(factors)
    tol = max(fn.rows, fn.cols) * torch.finfo(torch.float64).eps
    k_total = min(fn.rows, fn.cols)
    if w_out is None:
        blocks, k_block = list(factors), k_total // heads  # every head has rows / H rows and cols / H columns
    else:
        n_tok = factors[0].shape[0] // (w_out.shape[1] // heads)
        stacked = torch.block_diag(
            *[f.reshape(n_tok, -1, f.shape[1]).transpose(0, 1).reshape(-1, f.shape[1]) for f in factors]
        )  # rows (head, channel, token)
        stacked = stacked.reshape(w_out.shape[1], n_tok, -1)
        blocks, k_block = [torch.einsum("oc,ctk->tok", w_out, stacked).reshape(n_tok * w_out.shape[0], -1)], k_total
    ends = [extreme_singular_values(b) for b in blocks]
    tops = [top for top, _ in ends]
    # A block with fewer than k_block singular values lost columns that J has but cannot use: its sigma_min is 0.
    lows = [low if min(b.shape) >= k_block else 0.0 for b, (_, low) in zip(blocks, ends)]
    smax, smin = max(tops), min(lows)
    floor = tol * smax
    # Counting the singular values above the floor needs all of a block's only where its sigma_min is not above it.
    rank = sum(k_block if low > floor else int((singular_values(b) > floor).sum()) for b, low in zip(blocks, lows))
    deficient = rank < k_total
    per_head = w_out is None
    hkappa = [math.inf if top == 0 or low <= tol * top else top / low for top, low in zip(tops, lows)]
    return SpectrumResult(
        kappa=math.inf if deficient else smax / smin,
        sigma_max=smax,
        sigma_min=smin,
        rank_deficient=deficient,
        numerical_rank=rank,
        method="exact",
        shape=(fn.rows, fn.cols),
        structure=structure,
        sigma_max_heads=tops if per_head else [],
        sigma_min_heads=lows if per_head else [],
        kappa_heads=hkappa if per_head else [],
    )
