"""The attention map as a function of its query, key and value weights, through the layer's own forward.

``AttentionFunction(site, inputs)`` is ``f(W_Q, W_K, W_V) = vec(output of site.module(**inputs))``
with every other parameter and buffer of the module held fixed. The weights are substituted with
``torch.func.functional_call``, so whatever the module does (windows, relative positions, masks,
XCiT's cross-covariance attention and temperature, pooling, ``nn.MultiheadAttention``'s
``(query, key, value)`` signature) is part of ``f``. Fused ``qkv`` weights are rebuilt from the
three role blocks, so rows that belong to no role keep their value.

Output projection: by default (``include_output_proj=False``, the paper's form) the output
projection is replaced by the identity (weight ``I``, bias ``0``) during evaluation, so ``f`` is
``concat_h softmax(.) V_h`` plus whatever else the module does before its output projection
(e.g. the q/k/v biases and relative positions). This needs a square output projection; others
raise. With ``include_output_proj=True`` the module's output projection is kept.
For ``nn.MultiheadAttention`` (and any module returning a tuple) ``f`` is the first output.
Evaluation is in float64 with the module in eval mode (no dropout), and with the math kernel of
``scaled_dot_product_attention`` (same values; the fused kernels lack forward-mode derivatives).
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Dict, Iterator, Tuple

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["AttentionFunction", "bind_inputs", "eval_mode", "cast_floating"]

_QKV = ("q", "k", "v")


def bind_inputs(module: nn.Module, args: tuple, kwargs: dict) -> Dict[str, object]:
    """Name every positional argument of ``module.forward`` (so inputs can be edited by name)."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"inputs do not match {type(module).__name__}.forward{inspect.signature(module.forward)}: "
                        f"{err}") from err
    named = dict(bound.arguments)
    # **kwargs of the forward arrive as one dict entry; flatten it back.
    for pname, param in inspect.signature(module.forward).parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and pname in named:
            named.update(named.pop(pname))
        if param.kind is inspect.Parameter.VAR_POSITIONAL and pname in named:
            raise TypeError(f"{type(module).__name__}.forward takes *{pname}; its inputs cannot be named")
    return named


def cast_floating(obj, dtype: torch.dtype):
    """Detached copy of tensors (floating ones cast to ``dtype``) inside nested tuples/lists/dicts."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach()
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_floating(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floating(v, dtype) for k, v in obj.items()}
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
    """``f(W_Q, W_K, W_V) -> vec(output)`` for one attention site at fixed inputs.

    site: an ``AttentionSite`` (``condinit_det.init.find_attention``).
    inputs: the forward's arguments by name (see :func:`bind_inputs`); tensors are cast to ``dtype``.
    Attributes: ``weights`` = (W_Q [D, D_in], W_K [D, D_k_in], W_V [D_v, D_v_in]) at the current
    values; ``rows`` = output size; ``cols`` = total weight count; ``output_shape``.
    """

    def __init__(self, site, inputs: Dict[str, object], *, include_output_proj: bool = False,
                 dtype: torch.dtype = torch.float64):
        self.site = site
        self.module = site.module
        self.include_output_proj = bool(include_output_proj)
        self.dtype = dtype
        for role in _QKV:
            if role not in site.projections:
                raise ValueError(f"attention site {site.name!r} has no {role!r} projection")
        self.inputs = cast_floating(dict(inputs), dtype)
        self.state = {name: t.detach().to(dtype) if t.is_floating_point() else t.detach()
                      for name, t in list(self.module.named_parameters()) + list(self.module.named_buffers())}
        self.weights: Tuple[torch.Tensor, ...] = tuple(
            self._param(site.projections[r].weight)[site.projections[r].rows].clone() for r in _QKV)
        self.output_proj = "kept" if self.include_output_proj else self._identity_output()
        with torch.no_grad(), eval_mode(self.module):
            out = self(*self.weights)
        self.rows = out.numel()
        self.output_shape = tuple(self._last_shape)
        self.cols = sum(w.numel() for w in self.weights)

    def _param(self, name: str) -> torch.Tensor:
        if name not in self.state:
            raise KeyError(f"{name!r} is not a parameter or buffer of {type(self.module).__name__} "
                           f"(site {self.site.name!r})")
        return self.state[name]

    def _identity_output(self) -> str:
        proj = self.site.projections.get("o")
        if proj is None:
            return "absent"
        weight = self._param(proj.weight)
        block = weight[proj.rows]
        if block.shape[0] != block.shape[1] or block.shape[0] != weight.shape[0]:
            raise ValueError(
                f"attention site {self.site.name!r}: the output projection {proj.weight} has shape "
                f"{tuple(block.shape)}; replacing it by the identity (include_output_proj=False, the paper's "
                f"form without W_O) needs a square, unfused [D_v, D_v] weight. Pass include_output_proj=True "
                f"to measure the layer with its output projection.")
        self.state[proj.weight] = torch.eye(block.shape[0], dtype=weight.dtype, device=weight.device)
        if proj.bias is not None and proj.bias in self.state:
            self.state[proj.bias] = torch.zeros_like(self.state[proj.bias])
        return "identity"

    def parameters_with(self, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The module's state with the three role blocks substituted (fused weights rebuilt)."""
        params = dict(self.state)
        for role, w in zip(_QKV, (wq, wk, wv)):
            proj = self.site.projections[role]
            rows = proj.rows
            if rows == slice(None):
                params[proj.weight] = w
                continue
            if rows.step not in (None, 1):
                raise ValueError(f"site {self.site.name!r}: strided row block {rows} is not supported")
            base = params[proj.weight]
            start, stop, _ = rows.indices(base.shape[0])
            params[proj.weight] = base.slice_scatter(w, dim=0, start=start, end=stop)
        return params

    def __call__(self, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
        # The math kernel of scaled_dot_product_attention is the one with forward-mode and
        # higher-order derivatives (the fused CPU/GPU kernels have neither).
        with sdpa_kernel([SDPBackend.MATH]):
            out = functional_call(self.module, self.parameters_with(wq, wk, wv), args=(), kwargs=self.inputs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"site {self.site.name!r} returned {type(out).__name__}; expected a tensor "
                            f"(or a tuple whose first element is the attention output)")
        self._last_shape = out.shape
        return out.reshape(-1)

    # Flat-vector views, convenient for dense Jacobians and Krylov methods.
    def split(self, theta: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Flat ``[cols]`` vector -> (W_Q, W_K, W_V) shaped like ``weights``."""
        parts, start = [], 0
        for w in self.weights:
            parts.append(theta[start:start + w.numel()].reshape(w.shape))
            start += w.numel()
        return tuple(parts)

    def flat(self, theta: torch.Tensor) -> torch.Tensor:
        """``f`` of a flat weight vector ``[cols]`` -> ``[rows]``."""
        return self(*self.split(theta))

    def theta(self) -> torch.Tensor:
        return torch.cat([w.reshape(-1) for w in self.weights])
