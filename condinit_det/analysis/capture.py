"""Record the inputs that reach attention sites on a real batch, reduced to a measurable size.

``capture_site_inputs(model, batched_inputs, sites)`` runs ``model(batched_inputs)`` once in eval
mode without gradients, with a forward pre-hook (``with_kwargs=True``) on every chosen site that
stores the forward's arguments by name. The forward is stopped as soon as every site has been
seen once (the heads after the last site never run). The first call of each site is kept.

Reduction (what ``X`` is), so that J stays small enough to measure:

- batch: only the first ``max_batch`` entries of the batch dimension are kept (default 1). For
  windowed layers the batch dimension enumerates windows, so this is the first window(s) of the
  first image; a Swin window mask ``[nW, N, N]`` is cut to match (window i keeps mask i).
  ``nn.MultiheadAttention`` inputs are cut on their batch dimension (dim 1 unless
  ``batch_first``), together with ``key_padding_mask`` and a per-batch ``attn_mask``.
- tokens: when a sequence has more than ``max_tokens`` tokens it is subsampled:
  ``[B, H, W, C]`` inputs (detectron2 ViT / MViT) on a regular spatial grid with stride
  ``ceil(sqrt(H * W / max_tokens))`` (so a global-attention layer still sees the whole image,
  and decomposed relative positions are resampled by the layer itself to the new size);
  ``[B, N, C]`` inputs (timm ViT, XCiT) at ``max_tokens`` evenly spaced indices starting at 0
  (the class token is kept); ``nn.MultiheadAttention`` queries and keys/values likewise, with
  ``attn_mask`` and ``key_padding_mask`` cut accordingly. Swin windows are never subsampled
  (their relative-position bias is tied to the window size); ``max_batch`` bounds them.
The reduction applied is described in ``CapturedInput.reduction``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from .functional import bind_inputs, eval_mode

__all__ = ["CapturedInput", "capture_site_inputs", "reduce_site_inputs"]

_WINDOW_KINDS = ("d2_swin", "timm_swin")


@dataclass
class CapturedInput:
    """The (reduced) forward arguments of one site, by name, and how they were reduced."""

    site: str
    inputs: Dict[str, object]
    reduction: str
    original_shape: tuple


class _Done(Exception):
    """Raised from a hook to stop the forward once every site has been captured."""


def _detach(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_detach(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    return obj


def _even_indices(n: int, keep: int, device) -> torch.Tensor:
    return torch.linspace(0, n - 1, keep, device=device).round().long().unique()


def reduce_site_inputs(site, inputs: Dict[str, object], *, max_batch: int = 1,
                       max_tokens: Optional[int] = 256):
    """Apply the module-doc reduction to one site's named inputs; return (inputs, description)."""
    if max_batch is not None and max_batch <= 0:
        raise ValueError(f"max_batch must be positive or None, got {max_batch}")
    if max_tokens is not None and max_tokens <= 1:
        raise ValueError(f"max_tokens must be at least 2 or None, got {max_tokens}")
    inputs = dict(inputs)
    if site.kind == "mha" or isinstance(site.module, nn.MultiheadAttention):
        return _reduce_mha(site.module, inputs, max_batch, max_tokens)
    names = list(inputs)
    if not names or not isinstance(inputs[names[0]], torch.Tensor):
        raise TypeError(f"site {site.name!r}: the first forward argument must be a tensor, got {names}")
    xname = names[0]
    x = inputs[xname]
    notes = []
    b = x.shape[0]
    if max_batch is not None and b > max_batch:
        x = x[:max_batch]
        notes.append(f"first {max_batch} of {b} along dim 0")
        mask = inputs.get("mask")
        if isinstance(mask, torch.Tensor) and site.kind in _WINDOW_KINDS:
            inputs["mask"] = mask[:max_batch] if mask.shape[0] >= max_batch else mask
    if max_tokens is not None and site.kind not in _WINDOW_KINDS:
        if x.dim() == 4:
            h, w = x.shape[1], x.shape[2]
            if h * w > max_tokens:
                stride = math.ceil(math.sqrt(h * w / max_tokens))
                x = x[:, ::stride, ::stride]
                notes.append(f"tokens {h}x{w} -> {x.shape[1]}x{x.shape[2]} (stride {stride})")
        elif x.dim() == 3 and x.shape[1] > max_tokens:
            if any(isinstance(v, torch.Tensor) for k, v in inputs.items() if k != xname):
                raise ValueError(f"site {site.name!r}: cannot subsample tokens of an input with extra tensor "
                                 f"arguments ({[k for k in inputs if k != xname]}); raise max_tokens or pass None")
            idx = _even_indices(x.shape[1], max_tokens, x.device)
            notes.append(f"tokens {x.shape[1]} -> {idx.numel()} evenly spaced")
            x = x[:, idx]
    inputs[xname] = x
    return inputs, "; ".join(notes) or "none"


def _reduce_mha(module: nn.MultiheadAttention, inputs, max_batch, max_tokens):
    bdim = 0 if module.batch_first else 1
    tdim = 1 - bdim
    q, k, v = inputs.get("query"), inputs.get("key"), inputs.get("value")
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError("nn.MultiheadAttention inputs must include query, key and value tensors")
    notes = []
    if q.dim() == 3 and max_batch is not None and q.shape[bdim] > max_batch:
        b = q.shape[bdim]
        q, k, v = (t.narrow(bdim, 0, max_batch) for t in (q, k, v))
        notes.append(f"first {max_batch} of {b} along batch dim {bdim}")
        kpm = inputs.get("key_padding_mask")
        if isinstance(kpm, torch.Tensor):
            inputs["key_padding_mask"] = kpm[:max_batch]
        am = inputs.get("attn_mask")
        if isinstance(am, torch.Tensor) and am.dim() == 3:
            inputs["attn_mask"] = am[:max_batch * module.num_heads]
    if max_tokens is not None and q.dim() == 3:
        am = inputs.get("attn_mask")
        kpm = inputs.get("key_padding_mask")
        if q.shape[tdim] > max_tokens:
            idx = _even_indices(q.shape[tdim], max_tokens, q.device)
            notes.append(f"queries {q.shape[tdim]} -> {idx.numel()}")
            q = q.index_select(tdim, idx)
            if isinstance(am, torch.Tensor):
                am = am.index_select(am.dim() - 2, idx)
        if k.shape[tdim] > max_tokens:
            idx = _even_indices(k.shape[tdim], max_tokens, k.device)
            notes.append(f"keys {k.shape[tdim]} -> {idx.numel()}")
            same_kv = inputs.get("key") is inputs.get("value")
            k = k.index_select(tdim, idx)
            v = k if same_kv else v.index_select(tdim, idx)
            if isinstance(am, torch.Tensor):
                am = am.index_select(am.dim() - 1, idx)
            if isinstance(kpm, torch.Tensor):
                inputs["key_padding_mask"] = kpm.index_select(1, idx)
        if isinstance(am, torch.Tensor):
            inputs["attn_mask"] = am
    # Keep self-attention recognisable (the same tensor object) after the cuts.
    if inputs["query"] is inputs["key"] is inputs["value"]:
        k = v = q
    inputs.update(query=q, key=k, value=v)
    return inputs, "; ".join(notes) or "none"


def capture_site_inputs(model: nn.Module, batched_inputs, sites: Sequence, *, max_batch: Optional[int] = 1,
                        max_tokens: Optional[int] = 256) -> Dict[str, CapturedInput]:
    """Run ``model(batched_inputs)`` and return ``{site.name: CapturedInput}`` (see module doc).

    sites: ``AttentionSite`` objects of ``model`` (``find_attention(model)``). The model runs in eval
    mode under ``torch.no_grad()``; its training flags are restored. Raises RuntimeError naming the
    sites that the forward never reached.
    """
    sites = list(sites)
    if not sites:
        raise ValueError("no attention sites to capture; pass find_attention(model) or a selection of it")
    captured: Dict[str, CapturedInput] = {}
    wanted = {s.name for s in sites}

    def make_hook(site):
        def hook(module, args, kwargs):
            if site.name in captured:
                return None
            named = bind_inputs(module, _detach(tuple(args)), _detach(dict(kwargs)))
            first = next(iter(named.values()), None)
            shape = tuple(first.shape) if isinstance(first, torch.Tensor) else ()
            reduced, how = reduce_site_inputs(site, named, max_batch=max_batch, max_tokens=max_tokens)
            captured[site.name] = CapturedInput(site.name, reduced, how, shape)
            if set(captured) >= wanted:
                raise _Done
            return None
        return hook

    handles = [s.module.register_forward_pre_hook(make_hook(s), with_kwargs=True) for s in sites]
    try:
        with torch.no_grad(), eval_mode(model):
            model(batched_inputs)
    except _Done:
        pass
    finally:
        for h in handles:
            h.remove()
    missing = sorted(wanted - set(captured))
    if missing:
        raise RuntimeError(f"the forward pass never reached attention site(s) {missing}; check that the batch "
                           f"goes through them (e.g. a decoder that only runs in training mode)")
    return captured


def token_matrix(site, inputs: Dict[str, object]) -> torch.Tensor:
    """The tokens entering the site's query projection as ``[N, D_in]`` (float64).

    Obtained by running the site once on ``inputs`` with a pre-hook on the query projection's
    Linear (modules with an input projection parameter, like nn.MultiheadAttention, use ``query``).
    """
    proj = site.projections["q"]
    owner_name = proj.weight.rsplit(".", 1)[0] if "." in proj.weight else ""
    owner = site.module.get_submodule(owner_name) if owner_name else None
    if isinstance(owner, nn.Linear):
        seen: List[torch.Tensor] = []

        def hook(module, args):
            seen.append(args[0].detach())
            raise _Done

        handle = owner.register_forward_pre_hook(hook)
        try:
            with torch.no_grad(), eval_mode(site.module):
                site.module(**inputs)
        except _Done:
            pass
        finally:
            handle.remove()
        if not seen:
            raise RuntimeError(f"site {site.name!r}: the query projection {owner_name!r} was not called")
        x = seen[0]
    elif "query" in inputs:
        x = inputs["query"]
    else:
        raise RuntimeError(f"site {site.name!r}: cannot find the tokens entering the query projection {proj.weight}")
    return x.reshape(-1, x.shape[-1]).to(torch.float64)
