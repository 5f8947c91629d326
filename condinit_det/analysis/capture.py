"""The inputs that reach attention sites on a real batch (one eval-mode forward, stopped once every site has been
seen), reduced to a measurable size: the first ``max_batch`` entries (or windows) and at most ``max_tokens`` tokens.
See docs/conditioning.md#methods.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from .functional import bind_inputs, detached_copy, eval_mode

__all__ = ["CapturedInput", "capture_site_inputs"]

_WINDOW_KINDS = ("d2_swin", "timm_swin")


@dataclass
class CapturedInput:
    """The (reduced) forward arguments of one site, by name, and how they were reduced."""

    site: str
    inputs: Dict[str, object]
    reduction: str


class _Done(Exception):
    """Raised from a hook to stop the forward once every site has been captured."""


def _even_indices(n: int, keep: int, device) -> torch.Tensor:
    return torch.linspace(0, n - 1, keep, device=device).round().long().unique()


def _reduce_site_inputs(site, inputs: Dict[str, object], *, max_batch: Optional[int], max_tokens: Optional[int]):
    """The module doc's reduction of one site's named inputs; returns (inputs, description)."""
    if max_batch is not None and max_batch <= 0:
        raise ValueError(f"max_batch must be positive or None, got {max_batch}")
    if max_tokens is not None and max_tokens <= 1:
        raise ValueError(f"max_tokens must be at least 2 or None, got {max_tokens}")
    inputs = dict(inputs)
    if site.kind == "mha" or isinstance(site.module, nn.MultiheadAttention):
        return _reduce_mha(site.module, inputs, max_batch, max_tokens)
    xname = next(iter(inputs))
    x = inputs[xname]
    notes = []
    b = x.shape[0]
    if max_batch is not None and b > max_batch:
        x = x[:max_batch]
        notes.append(f"first {max_batch} of {b} along dim 0")
        if inputs.get("mask") is not None and site.kind in _WINDOW_KINDS:
            inputs["mask"] = inputs["mask"][:max_batch]  # one mask per window: those of the windows kept
    if max_tokens is not None and site.kind not in _WINDOW_KINDS:
        if x.dim() == 4:
            h, w = x.shape[1], x.shape[2]
            if h * w > max_tokens:
                stride = math.ceil(math.sqrt(h * w / max_tokens))
                x = x[:, ::stride, ::stride]
                notes.append(f"tokens {h}x{w} -> {x.shape[1]}x{x.shape[2]} (stride {stride})")
        elif x.dim() == 3 and x.shape[1] > max_tokens:
            if any(isinstance(v, torch.Tensor) for k, v in inputs.items() if k != xname):
                raise ValueError(
                    f"site {site.name!r}: cannot subsample tokens of an input with extra tensor "
                    f"arguments ({[k for k in inputs if k != xname]}); raise max_tokens or pass None"
                )
            idx = _even_indices(x.shape[1], max_tokens, x.device)
            notes.append(f"tokens {x.shape[1]} -> {idx.numel()} evenly spaced")
            x = x[:, idx]
    inputs[xname] = x
    return inputs, "; ".join(notes) or "none"


def _reduce_mha(module: nn.MultiheadAttention, inputs, max_batch, max_tokens):
    bdim = 0 if module.batch_first else 1
    tdim = 1 - bdim
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    am, kpm = inputs.get("attn_mask"), inputs.get("key_padding_mask")
    notes = []
    if q.dim() == 3 and max_batch is not None and q.shape[bdim] > max_batch:
        b = q.shape[bdim]
        q, k, v = (t.narrow(bdim, 0, max_batch) for t in (q, k, v))
        notes.append(f"first {max_batch} of {b} along batch dim {bdim}")
        kpm = None if kpm is None else kpm[:max_batch]
        if am is not None and am.dim() == 3:
            am = am[: max_batch * module.num_heads]
    if max_tokens is not None and q.dim() == 3 and q.shape[tdim] > max_tokens:
        idx = _even_indices(q.shape[tdim], max_tokens, q.device)
        notes.append(f"queries {q.shape[tdim]} -> {idx.numel()}")
        q = q.index_select(tdim, idx)
        am = None if am is None else am.index_select(am.dim() - 2, idx)
    if max_tokens is not None and q.dim() == 3 and k.shape[tdim] > max_tokens:
        idx = _even_indices(k.shape[tdim], max_tokens, k.device)
        notes.append(f"keys {k.shape[tdim]} -> {idx.numel()}")
        k = k.index_select(tdim, idx)
        v = k if inputs["key"] is inputs["value"] else v.index_select(tdim, idx)
        am = None if am is None else am.index_select(am.dim() - 1, idx)
        kpm = None if kpm is None else kpm.index_select(1, idx)
    # Keep self-attention recognisable (the same tensor object) after the cuts.
    if inputs["query"] is inputs["key"] is inputs["value"]:
        k = v = q
    inputs.update(query=q, key=k, value=v)
    inputs.update({name: mask for name, mask in (("attn_mask", am), ("key_padding_mask", kpm)) if mask is not None})
    return inputs, "; ".join(notes) or "none"


def capture_site_inputs(
    model: nn.Module, batched_inputs, sites: Sequence, *, max_batch: Optional[int] = 1, max_tokens: Optional[int] = 256
) -> Dict[str, CapturedInput]:
    """``{site.name: CapturedInput}`` for ``sites`` (``AttentionSite`` objects of ``model``) from one forward of
    ``model(batched_inputs)`` (see module doc); raises RuntimeError naming the sites the forward never reached."""
    captured: Dict[str, CapturedInput] = {}
    wanted = {s.name for s in sites}

    def hook(site, module, args, kwargs):
        if site.name not in captured:
            named = bind_inputs(module, detached_copy(tuple(args)), detached_copy(dict(kwargs)))
            reduced, how = _reduce_site_inputs(site, named, max_batch=max_batch, max_tokens=max_tokens)
            captured[site.name] = CapturedInput(site.name, reduced, how)
        if set(captured) >= wanted:
            raise _Done

    handles = [s.module.register_forward_pre_hook(functools.partial(hook, s), with_kwargs=True) for s in sites]
    try:
        with torch.no_grad(), eval_mode(model), contextlib.suppress(_Done):
            model(batched_inputs)
    finally:
        for h in handles:
            h.remove()
    missing = sorted(wanted - set(captured))
    if missing:
        raise RuntimeError(
            f"the forward pass never reached attention site(s) {missing}; check that the batch "
            f"goes through them (e.g. a decoder that only runs in training mode)"
        )
    return captured
