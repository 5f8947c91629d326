"""The attention map as a function of its query, key and value weights, ``f(W_Q, W_K, W_V) = vec(site.module(
**inputs))``, in float64 through the layer's own forward. See docs/conditioning.md#what-is-measured.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["AttentionFunction", "as_function", "bind_inputs", "detached_copy", "eval_mode"]

_QKV = ("q", "k", "v")


def bind_inputs(module: nn.Module, args: tuple, kwargs: dict) -> Dict[str, object]:
    """Name every positional argument of ``module.forward`` (so inputs can be edited by name)."""
    signature = inspect.signature(module.forward)
    named = dict(signature.bind(*args, **kwargs).arguments)
    # **kwargs of the forward arrive as one dict entry; flatten it back.
    for pname, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and pname in named:
            named.update(named.pop(pname))
    return named


def detached_copy(obj, dtype: Optional[torch.dtype] = None):
    """Detached tensors inside nested tuples/lists/dicts: floating ones cast to ``dtype``, the rest (all of them
    when ``dtype`` is None) cloned."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach()
        return obj.to(dtype) if dtype is not None and obj.is_floating_point() else obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(detached_copy(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: detached_copy(v, dtype) for k, v in obj.items()}
    return obj


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` (and children) in eval mode, restoring each one's flag afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, flag in flags:
            m.training = flag


class AttentionFunction:
    """``f(W_Q, W_K, W_V) -> vec(output)`` of an ``AttentionSite`` at fixed ``inputs`` (the forward's arguments by
    name), in float64; a tuple output's first element is f. ``weights``: W_Q [D, D_in], W_K [D, D_k_in], W_V [D_v,
    D_v_in]; ``rows``: output size; ``cols``: weight count; ``output_proj``: "identity", "kept" or "absent"."""

    def __init__(self, site, inputs: Dict[str, object], *, include_output_proj: bool = False):
        self.site = site
        self.module = site.module
        self.include_output_proj = bool(include_output_proj)
        self.dtype = torch.float64
        self.inputs = detached_copy(dict(inputs), self.dtype)
        self.state = {
            name: t.detach().to(self.dtype) if t.is_floating_point() else t.detach()
            for name, t in list(self.module.named_parameters()) + list(self.module.named_buffers())
        }
        self.weights: Tuple[torch.Tensor, ...] = tuple(
            self.state[site.projections[r].weight][site.projections[r].rows].clone() for r in _QKV
        )
        self.output_proj = "kept" if self.include_output_proj else self._identity_output()
        with torch.no_grad():
            out = self(*self.weights)
        self.rows = out.numel()
        self.output_shape = tuple(self._last_shape)
        self.cols = sum(w.numel() for w in self.weights)

    def _identity_output(self) -> str:
        proj = self.site.projections.get("o")
        if proj is None:
            return "absent"
        weight = self.state[proj.weight]
        block = weight[proj.rows]
        if block.shape[0] != block.shape[1] or block.shape[0] != weight.shape[0]:
            raise ValueError(
                f"attention site {self.site.name!r}: the output projection {proj.weight} has shape "
                f"{tuple(block.shape)}; the paper's form replaces it by the identity, which needs a "
                f"square, unfused [D_v, D_v] weight. Pass include_output_proj=True to keep it."
            )
        self.state[proj.weight] = torch.eye(block.shape[0], dtype=weight.dtype, device=weight.device)
        if proj.bias is not None and proj.bias in self.state:
            self.state[proj.bias] = torch.zeros_like(self.state[proj.bias])
        return "identity"

    def __call__(self, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
        # The module's state with the three role blocks substituted (fused weights rebuilt).
        params = dict(self.state)
        for role, w in zip(_QKV, (wq, wk, wv)):
            proj = self.site.projections[role]
            start, stop, step = proj.rows.indices(params[proj.weight].shape[0])
            params[proj.weight] = params[proj.weight].slice_scatter(w, dim=0, start=start, end=stop, step=step)
        # Eval mode; only the math kernel of scaled_dot_product_attention has forward-mode derivatives.
        with eval_mode(self.module), sdpa_kernel([SDPBackend.MATH]):
            out = functional_call(self.module, params, args=(), kwargs=self.inputs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        self._last_shape = out.shape
        return out.reshape(-1)

    def flat(self, theta: torch.Tensor) -> torch.Tensor:
        """``f`` of the flat weight vector ``theta [cols]`` (vec W_Q, vec W_K, vec W_V) -> ``[rows]``."""
        parts = theta.split([w.numel() for w in self.weights])
        return self(*(p.reshape(w.shape) for p, w in zip(parts, self.weights)))

    def theta(self) -> torch.Tensor:
        """The current weights as one flat vector ``[cols]``."""
        return torch.cat([w.reshape(-1) for w in self.weights])

    def projection_inputs(self) -> Optional[Dict[str, torch.Tensor]]:
        """``{role: [M, D_in]}`` tokens entering each q/k/v projection (every call stacked), or None when a projection
        weight is not owned by an ``nn.Linear``."""
        if isinstance(self.module, nn.MultiheadAttention):
            return {
                r: self.inputs[name].reshape(-1, self.inputs[name].shape[-1])
                for r, name in zip(_QKV, ("query", "key", "value"))
            }
        owners = {}
        for role in _QKV:
            wname = self.site.projections[role].weight
            owner = self.module.get_submodule(wname.rsplit(".", 1)[0]) if "." in wname else None
            if not isinstance(owner, nn.Linear):
                return None
            owners[role] = owner
        seen: Dict[nn.Module, List[torch.Tensor]] = {}

        def record(linear, args):
            seen.setdefault(linear, []).append(args[0].detach().reshape(-1, args[0].shape[-1]))

        handles = [linear.register_forward_pre_hook(record) for linear in set(owners.values())]
        try:
            with torch.no_grad():
                self(*self.weights)
        finally:
            for h in handles:
                h.remove()
        return {r: torch.cat(seen[owners[r]], dim=0).to(self.dtype) for r in _QKV}


def as_function(
    site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False
) -> AttentionFunction:
    """``site`` itself when it is an :class:`AttentionFunction`, else the ``AttentionSite``'s function at ``inputs``."""
    if isinstance(site, AttentionFunction):
        return site
    return AttentionFunction(site, inputs, include_output_proj=include_output_proj)
