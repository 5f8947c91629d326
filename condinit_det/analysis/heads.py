"""Exact kappa of the attention Jacobian from its per-head block structure.

With ``f`` = the heads' outputs before the output projection (the default, see
:mod:`condinit_det.analysis.functional`), head h's output channels depend only on head h's rows of
W_Q, W_K and W_V. Ordered by head, ``J = d vec f / d vec(W_Q, W_K, W_V)`` is block diagonal,
``J = diag(J_1, ..., J_H)``, and its singular values are the union of the heads'.

Column reduction. ``f`` depends on a projection weight W only through ``X W^T`` (X: the tokens
entering that projection, all sequences stacked), so with B an orthonormal basis ``[D_in, r]`` of
a space containing X's rows, ``J_h`` and ``F_h = J_h (I (x) B)`` have the same Gram matrix
``J_h J_h^T`` and therefore the same singular values. B comes from the QR of ``X^T`` when X has
fewer rows than columns (r = rows), else B = I. ``F_h`` has ``N * dh_v`` rows and
``dh * r_q + dh * r_k + dh_v * r_v`` columns (ViTDet-B, 16 tokens: 1024 x 3072 per head instead of
one 12288 x 1769472 J).

How ``F_h`` is formed:

- token attention (``d2_vit`` with decomposed relative positions, ``d2_swin``, ``timm_vit`` without
  q/k norms, gates or masks, ``mha`` without ``bias_k`` / ``add_zero_attn``): closed form. For
  query i of a sequence (softmax row a_i, Jacobian ``Lambda_i = Diag(a_i) - a_i a_i^T``, logits
  ``l_ij = s q_i.k_j + q_i.r_ij + const``, ``G_i = dl_i/dq_i = s K + R_i``, values V, reduced
  tokens y = B^T x):
  ``dO_i/dW_Q = M_i (x) y_i^T`` with ``M_i = V^T Lambda_i G_i``;
  ``dO_i/dW_K = s q_i^T (x) (V^T Lambda_i Y_k)``; ``dO_i/dW_V = I (x) (a_i^T Y_v)``.
  (Their Gram blocks are ``(y_i.y_j) M_i M_j^T``, ``s^2 (q_i.q_j) V^T Lambda_i Y Y^T Lambda_j V``
  and ``(a_i^T Y Y^T a_j) I``.)
- every other layout (XCiT / DaViT channel attention, MViT pooling, class attention, anything the
  closed form does not recognise): per-head Jacobians by ``torch.func`` of the layer's own
  forward in the reduced coordinates ``W^h + C B^T``.

Every factor is checked against one product ``J v`` of the layer's own forward (forward-mode AD)
in a random direction; a closed form that disagrees is replaced by the autodiff route.
With the output projection kept (``include_output_proj=True``) J is ``(I (x) W_O)`` times the
block-diagonal one: the heads' factors are stacked into one matrix, multiplied by W_O per token,
and its singular values taken (no per-head values then).

The extreme singular values come from the QR of each factor's tall orientation (float64, no Gram
matrix, so nothing is squared) and Lanczos on R
(:func:`condinit_det.analysis.spectrum.extreme_singular_values`): sigma_min is accurate to about
``eps * sigma_max``, as for the dense Jacobian's SVD. All of a factor's singular values are taken
only to count the numerical rank where its sigma_min is at the rank tolerance.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import jacfwd, jacrev

from .functional import AttentionFunction, eval_mode
from .operator import JacobianOperator
from .spectrum import SpectrumResult, extreme_singular_values, singular_values

__all__ = ["head_factors", "head_spectrum", "HeadFactors", "factor_entries"]

_logger = logging.getLogger(__name__)
_QKV = ("q", "k", "v")
# Relative agreement asked of the random-direction check (float64 round-off is ~1e-15).
_CHECK_TOL = 1e-8


@dataclass
class HeadFactors:
    """Per-head factors ``F_h`` with ``F_h F_h^T = J_h J_h^T``, and the full J's shape.

    factors: H tensors ``[N_out * dh_v, cols_h]``, rows ordered (token, channel of the head).
    shape: (rows, cols) of the full Jacobian J. structure: "closed_form" or "autodiff".
    """

    factors: List[torch.Tensor]
    shape: Tuple[int, int]
    structure: str


def _basis(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal ``[D_in, r]`` basis of a space holding the rows of ``x [M, D_in]`` (I when M >= D_in)."""
    m, d = x.shape
    if m >= d:
        return torch.eye(d, dtype=x.dtype, device=x.device)
    return torch.linalg.qr(x.T).Q


def _projection_inputs(fn: AttentionFunction) -> Dict[str, torch.Tensor]:
    """Tokens entering each of the q/k/v projections as ``[M, D_in]`` (every call stacked)."""
    site, module = fn.site, fn.module
    if isinstance(module, nn.MultiheadAttention):
        return {r: fn.inputs[name].reshape(-1, fn.inputs[name].shape[-1])
                for r, name in zip(_QKV, ("query", "key", "value"))}
    seen: Dict[str, List[torch.Tensor]] = {}
    handles = []
    owners = {}
    for role in _QKV:
        wname = site.projections[role].weight
        owner_name = wname.rsplit(".", 1)[0] if "." in wname else ""
        owner = module.get_submodule(owner_name) if owner_name else None
        if not isinstance(owner, nn.Linear):
            raise _Unsupported(f"the {role} weight {wname!r} is not owned by an nn.Linear")
        owners[role] = owner_name
    for owner_name in set(owners.values()):
        def hook(mod, args, name=owner_name):
            seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]))
        handles.append(module.get_submodule(owner_name).register_forward_pre_hook(hook))
    try:
        with torch.no_grad(), eval_mode(module):
            fn(*fn.weights)
    finally:
        for h in handles:
            h.remove()
    return {r: torch.cat(seen[owners[r]], dim=0).to(fn.dtype) for r in _QKV}


class _Unsupported(Exception):
    """The closed form does not apply to this layer (the autodiff route is used)."""


@dataclass
class _TokenAttention:
    """What the closed form needs, for B sequences and H heads (float64).

    x_q [B, Nq, D_in], x_k / x_v [B, Nk, D_*]; q, k [B, H, N, dh]; v [B, H, Nk, dh_v];
    attn [B, H, Nq, Nk] (softmax probabilities); rel [Nq, Nk, dh] or None (the q-dependent part of
    the logits, ``l_ij += q_i . rel_ij``); scale s; token_index [B, Nq]: each query's row in f's output.
    """

    x_q: torch.Tensor
    x_k: torch.Tensor
    x_v: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn: torch.Tensor
    rel: Optional[torch.Tensor]
    scale: float
    token_index: torch.Tensor


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = t.shape
    return t.reshape(b, n, heads, d // heads).transpose(1, 2)


def _bias(fn: AttentionFunction, role: str) -> Optional[torch.Tensor]:
    proj = fn.site.projections[role]
    b = fn.state.get(proj.bias) if proj.bias else None
    return None if b is None else b[proj.rows if proj.bias_rows is None else proj.bias_rows]


def _fused_qkv(fn: AttentionFunction, x: torch.Tensor):
    """q, k, v ``[B, H, N, dh]`` (biases included) of a fused-``qkv`` site on tokens ``x [B, N, D_in]``."""
    return [_split_heads(F.linear(x, w, _bias(fn, r)), fn.site.num_heads) for r, w in zip(_QKV, fn.weights)]


def _d2_vit(fn: AttentionFunction) -> _TokenAttention:
    from detectron2.modeling.backbone.utils import get_rel_pos

    m = fn.module
    x = fn.inputs["x"]
    bsz, hh, ww, _ = x.shape
    tokens = x.reshape(bsz, hh * ww, -1)
    q, k, v = _fused_qkv(fn, tokens)
    logits = m.scale * q @ k.transpose(-2, -1)
    rel = None
    if m.use_rel_pos:
        rh = get_rel_pos(hh, hh, fn.state["rel_pos_h"])  # [q_h, k_h, dh]
        rw = get_rel_pos(ww, ww, fn.state["rel_pos_w"])
        rel = (rh[:, None, :, None, :] + rw[None, :, None, :, :]).reshape(hh * ww, hh * ww, -1)
        logits = logits + torch.einsum("bhic,ijc->bhij", q, rel)
    index = torch.arange(bsz * hh * ww).reshape(bsz, hh * ww)
    return _TokenAttention(tokens, tokens, tokens, q, k, v, logits.softmax(-1), rel, float(m.scale), index)


def _d2_swin(fn: AttentionFunction) -> _TokenAttention:
    m = fn.module
    x = fn.inputs["x"]
    mask = fn.inputs.get("mask")
    bsz, n, _ = x.shape
    q, k, v = _fused_qkv(fn, x)
    logits = m.scale * q @ k.transpose(-2, -1)
    table = fn.state["relative_position_bias_table"]
    bias = table[fn.state["relative_position_index"].reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
    logits = logits + bias[None]
    if mask is not None:
        logits = logits + mask[torch.arange(bsz) % mask.shape[0]][:, None]
    index = torch.arange(bsz * n).reshape(bsz, n)
    return _TokenAttention(x, x, x, q, k, v, logits.softmax(-1), None, float(m.scale), index)


def _timm_vit(fn: AttentionFunction) -> _TokenAttention:
    m = fn.module
    extra = [k for k, v in fn.inputs.items() if k != "x" and v not in (None, False)]
    plain = all(isinstance(getattr(m, a, None), (nn.Identity, type(None))) for a in ("q_norm", "k_norm", "norm"))
    if extra or not plain or getattr(m, "gate", None) is not None:
        raise _Unsupported("q/k norms, gates or attention masks")
    x = fn.inputs["x"]
    bsz, n, _ = x.shape
    q, k, v = _fused_qkv(fn, x)
    attn = (m.scale * q @ k.transpose(-2, -1)).softmax(-1)
    return _TokenAttention(x, x, x, q, k, v, attn, None, float(m.scale), torch.arange(bsz * n).reshape(bsz, n))


def _mask_bias(mask: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)
    return mask.to(dtype)


def _mha(fn: AttentionFunction) -> _TokenAttention:
    m: nn.MultiheadAttention = fn.module
    if m.bias_k is not None or m.add_zero_attn:
        raise _Unsupported("bias_k / bias_v or add_zero_attn")
    if fn.inputs.get("is_causal"):
        raise _Unsupported("is_causal")
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
    q, k, v = (_split_heads(F.linear(t, w, _bias(fn, r)), heads)
               for t, w, r in zip((query, key, value), fn.weights, _QKV))
    scale = float(q.shape[-1]) ** -0.5
    logits = scale * q @ k.transpose(-2, -1)
    am = _mask_bias(fn.inputs.get("attn_mask"), logits.dtype)
    if am is not None:
        logits = logits + (am.reshape(bsz, heads, nq, nk) if am.dim() == 3 else am)
    kpm = _mask_bias(fn.inputs.get("key_padding_mask"), logits.dtype)
    if kpm is not None:
        logits = logits + kpm[:, None, None, :]
    index = torch.arange(bsz * nq).reshape(bsz, nq)
    if seq_first:
        index = torch.arange(nq * bsz).reshape(nq, bsz).T
    return _TokenAttention(query, key, value, q, k, v, logits.softmax(-1), None, scale, index)


_CLOSED_FORMS = {"d2_vit": _d2_vit, "d2_swin": _d2_swin, "timm_vit": _timm_vit, "mha": _mha}


def _closed_form_factors(fn: AttentionFunction) -> Tuple[List[torch.Tensor], torch.Tensor, Dict[str, torch.Tensor]]:
    """Per-head factors from the closed form; also the query rows' output index and the bases."""
    extract = _CLOSED_FORMS.get(fn.site.kind)
    if extract is None:
        raise _Unsupported(f"no closed form for site kind {fn.site.kind!r}")
    t = extract(fn)
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
            m_q = m_q + torch.einsum("bjd,bij,ijc->bidc", vh, ah, t.rel) \
                - out[..., :, None] * torch.einsum("bij,ijc->bic", ah, t.rel)[:, :, None, :]
        bsz, nq, dv = out.shape
        dq = qh.shape[-1]
        fq = m_q[..., :, :, None] * yq[:, :, None, None, :]  # [B, Nq, dh_v, dh, r_q]
        fk = t.scale * qh[:, :, None, :, None] * vt_lambda(yk)[:, :, :, None, :]  # [B, Nq, dh_v, dh, r_k]
        ay = ah @ yv  # [B, Nq, r_v]
        eye = torch.eye(dv, dtype=ay.dtype, device=ay.device)
        fv = eye[None, None, :, :, None] * ay[:, :, None, None, :]  # [B, Nq, dh_v, dh_v, r_v]
        rows = bsz * nq * dv
        factors.append(torch.cat([fq.reshape(rows, dq * yq.shape[-1]), fk.reshape(rows, dq * yk.shape[-1]),
                                  fv.reshape(rows, dv * yv.shape[-1])], dim=1))
    return factors, t.token_index.reshape(-1), bases


def _head_rows(fn: AttentionFunction, role: str, h: int) -> slice:
    n = fn.weights[_QKV.index(role)].shape[0] // fn.site.num_heads
    return slice(h * n, (h + 1) * n)


def _autodiff_factors(fn: AttentionFunction, bases: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """Per-head Jacobians of head h's outputs in the reduced coordinates (torch.func)."""
    heads = fn.site.num_heads
    dv = fn.weights[2].shape[0]
    shapes = [(w.shape[0] // heads, bases[r].shape[1]) for r, w in zip(_QKV, fn.weights)]
    sizes = [a * b for a, b in shapes]
    factors = []
    for h in range(heads):
        def f_h(c, h=h):
            ws = []
            start = 0
            for role, w, (rows, r), size in zip(_QKV, fn.weights, shapes, sizes):
                delta = c[start:start + size].reshape(rows, r) @ bases[role].T
                start += size
                sl = _head_rows(fn, role, h)
                ws.append(w.slice_scatter(w[sl] + delta, dim=0, start=sl.start, end=sl.stop))
            out = fn(*ws).reshape(-1, heads, dv // heads)
            return out[:, h].reshape(-1)

        zero = torch.zeros(sum(sizes), dtype=fn.dtype, device=fn.weights[0].device)
        n_rows = fn.rows // heads
        with eval_mode(fn.module):
            jac = jacfwd(f_h)(zero) if sum(sizes) <= n_rows else jacrev(f_h, chunk_size=256)(zero)
        factors.append(jac)
    return factors


def factor_entries(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False) -> int:
    """Float64 entries of the largest matrix the exact per-head method forms (one head's factor, or the
    stacked factor when the output projection is kept)."""
    fn = site if isinstance(site, AttentionFunction) else AttentionFunction(site, inputs,
                                                                            include_output_proj=include_output_proj)
    return _entries(fn, _projection_ranks(fn))


def _projection_ranks(fn: AttentionFunction) -> Dict[str, int]:
    try:
        xs = _projection_inputs(fn)
        return {r: min(x.shape) for r, x in xs.items()}
    except _Unsupported:
        return {r: w.shape[1] for r, w in zip(_QKV, fn.weights)}


def _entries(fn: AttentionFunction, ranks: Dict[str, int]) -> int:
    heads = fn.site.num_heads
    cols = sum(w.shape[0] // heads * ranks[r] for r, w in zip(_QKV, fn.weights))
    if fn.include_output_proj:
        return fn.rows * cols * heads
    return fn.rows // heads * cols


def _check(fn: AttentionFunction, factors, bases, token_index, w_out) -> float:
    """Relative difference between the factors' and the layer's own ``J v`` in one random direction."""
    heads = fn.site.num_heads
    gen = torch.Generator().manual_seed(0)
    coeffs = [torch.randn(f.shape[1], generator=gen, dtype=torch.float64).to(f) for f in factors]
    shapes = [(w.shape[0] // heads, bases[r].shape[1]) for r, w in zip(_QKV, fn.weights)]
    deltas = [torch.zeros_like(w) for w in fn.weights]
    for h, c in enumerate(coeffs):
        start = 0
        for i, (role, (rows, r)) in enumerate(zip(_QKV, shapes)):
            deltas[i][_head_rows(fn, role, h)] = c[start:start + rows * r].reshape(rows, r) @ bases[role].T
            start += rows * r
    jv = JacobianOperator(fn).matvec(torch.cat([d.reshape(-1) for d in deltas])[None])[0]
    heads_out = torch.stack([(f @ c).reshape(-1, f.shape[0] // token_index.numel())
                             for f, c in zip(factors, coeffs)], dim=1)  # [tokens, H, dh_v]
    pre = heads_out.reshape(token_index.numel(), -1)
    if w_out is not None:
        pre = pre @ w_out.T
    mine = torch.empty_like(pre)
    mine[token_index] = pre
    return float((mine.reshape(-1) - jv).norm() / jv.norm().clamp_min(1e-300))


def head_factors(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                 max_entries: Optional[int] = None,
                 structure: str = "auto") -> Tuple[HeadFactors, Optional[torch.Tensor]]:
    """The per-head factors of J (see module doc) and W_O (None unless the output projection is kept).

    structure: "auto" (closed form when the layout has one, else autodiff), "closed_form" or "autodiff".
    max_entries: refuse (ValueError) when the largest matrix formed would exceed it.
    """
    if structure not in ("auto", "closed_form", "autodiff"):
        raise ValueError(f"structure must be 'auto', 'closed_form' or 'autodiff', got {structure!r}")
    fn = site if isinstance(site, AttentionFunction) else AttentionFunction(site, inputs,
                                                                            include_output_proj=include_output_proj)
    name = fn.site.name
    heads = fn.site.num_heads
    pre = fn
    w_out = None
    if fn.include_output_proj:
        pre = AttentionFunction(fn.site, fn.inputs, include_output_proj=False)
        proj = fn.site.projections["o"]
        w_out = fn.state[proj.weight][proj.rows]
    if pre.output_shape[-1] != fn.weights[2].shape[0]:
        raise ValueError(f"attention site {name!r}: the output's last dimension {pre.output_shape[-1]} is not the "
                         f"value width {fn.weights[2].shape[0]}, so its channels cannot be split by head; use "
                         f"method='dense' (small layers) or 'matrix_free'")
    try:
        xs = _projection_inputs(pre)
        bases = {r: _basis(x) for r, x in xs.items()}
    except _Unsupported:
        bases = {r: torch.eye(w.shape[1], dtype=w.dtype, device=w.device) for r, w in zip(_QKV, fn.weights)}
    entries = _entries(fn, {r: b.shape[1] for r, b in bases.items()})
    if max_entries is not None and entries > max_entries:
        raise ValueError(
            f"exact per-head conditioning of attention site {name!r} would form a {entries:.3g}-entry matrix "
            f"({entries * 8 / 2**30:.2f} GiB in float64), above max_entries={max_entries:.3g}; use "
            f"method='matrix_free' (or fewer tokens, or a larger max_entries)")
    factors = token_index = None
    used = "autodiff"
    if structure in ("auto", "closed_form"):
        try:
            factors, token_index, bases = _closed_form_factors(pre)
            used = "closed_form"
        except _Unsupported as why:
            if structure == "closed_form":
                raise ValueError(f"attention site {name!r} ({fn.site.kind}): no closed form ({why})") from None
    if factors is not None:
        err = _check(fn, factors, bases, token_index, w_out)
        if not err <= _CHECK_TOL:
            if structure == "closed_form":
                raise RuntimeError(f"attention site {name!r}: the closed-form Jacobian differs from the layer's own "
                                   f"by {err:.2e} (relative) in a random direction")
            _logger.warning("site %s (%s): closed form differs from the layer's Jacobian by %.2e; using autodiff",
                            name, fn.site.kind, err)
            factors = None
    if factors is None:
        factors = _autodiff_factors(pre, bases)
        used = "autodiff"
        tokens = factors[0].shape[0] // (fn.weights[2].shape[0] // heads)
        err = _check(fn, factors, bases, torch.arange(tokens), w_out)
        if not err <= _CHECK_TOL:
            raise RuntimeError(f"attention site {name!r} ({fn.site.kind}): J is not block diagonal by heads (a "
                               f"head's output moves with another head's weights, relative {err:.2e}); use "
                               f"method='dense' (small layers) or 'matrix_free'")
    return HeadFactors(factors, (fn.rows, fn.cols), used), w_out


def head_spectrum(site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False,
                  rank_tol: Optional[float] = None, max_entries: Optional[int] = None,
                  structure: str = "auto") -> SpectrumResult:
    """Exact kappa(J) from the per-head factors (``method="exact"``; see module doc).

    Same conventions as :func:`condinit_det.analysis.spectrum.exact_spectrum` on the dense J:
    kappa over the min(rows, cols) singular values, rank deficient when fewer than that many exceed
    ``rank_tol * sigma_max`` (default ``max(rows, cols) * eps``). Without the output projection the
    result also carries each head's sigma_max, sigma_min and kappa (kappa inf when the head's own
    block is rank deficient at the same relative tolerance).
    """
    hf, w_out = head_factors(site, inputs, include_output_proj=include_output_proj, max_entries=max_entries,
                             structure=structure)
    rows, cols = hf.shape
    heads = len(hf.factors)
    tol = max(rows, cols) * torch.finfo(torch.float64).eps if rank_tol is None else float(rank_tol)
    k_total = min(rows, cols)
    if w_out is None:
        blocks, k_block = list(hf.factors), k_total // heads  # every head has rows / H rows and cols / H columns
    else:
        n_tok = hf.factors[0].shape[0] // (w_out.shape[1] // heads)
        stacked = torch.block_diag(*[f.reshape(n_tok, -1, f.shape[1]).transpose(0, 1).reshape(-1, f.shape[1])
                                     for f in hf.factors])  # rows (head, channel, token)
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
        kappa=math.inf if deficient else smax / smin, sigma_max=smax, sigma_min=smin, rank_deficient=deficient,
        numerical_rank=rank, converged=True, iterations=0, residual_max=0.0, residual_min=0.0, method="exact",
        shape=(rows, cols), structure=hf.structure, sigma_max_heads=tops if per_head else [],
        sigma_min_heads=lows if per_head else [], kappa_heads=hkappa if per_head else [])
