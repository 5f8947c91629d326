"""Matrix-free kappa of the attention Jacobian from ``J v`` (jvp) and ``J^T u`` (vjp) products only. See
docs/conditioning.md.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.func import jvp, vjp, vmap

from .functional import AttentionFunction, as_function
from .spectrum import SpectrumResult, matrix_free_spectrum

__all__ = ["JacobianOperator", "estimate_conditioning"]


class JacobianOperator:
    """``J`` of an :class:`AttentionFunction` on blocks of vectors (one per row, batched with ``torch.func.vmap``):
    ``matvec(V [b, cols]) -> [b, rows]`` and ``rmatvec(U [b, rows]) -> [b, cols]``. ``J v`` is forward-mode AD, or
    reverse mode through the (linear) vjp where the layer lacks forward-mode support.
    """

    def __init__(self, fn: AttentionFunction):
        self.fn = fn
        self.shape = (fn.rows, fn.cols)
        self._theta = fn.theta()
        _, self._vjp = vjp(fn.flat, self._theta)
        self._forward_mode = True

    def _rmv(self, u: torch.Tensor) -> torch.Tensor:
        return self._vjp(u)[0]

    def _mv_reverse(self, v: torch.Tensor) -> torch.Tensor:
        # J v = d/du <J^T u, v> at any u: reverse mode through the linear map u -> J^T u.
        zero = torch.zeros(self.shape[0], dtype=v.dtype, device=v.device)
        _, back = vjp(self._rmv, zero)
        return back(v)[0]

    def rmatvec(self, u: torch.Tensor) -> torch.Tensor:
        return vmap(self._rmv)(u)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        if self._forward_mode:
            try:
                return vmap(lambda x: jvp(self.fn.flat, (self._theta,), (x,))[1])(v)
            except (NotImplementedError, RuntimeError):
                self._forward_mode = False
        return vmap(self._mv_reverse)(v)


def estimate_conditioning(
    site, inputs: Optional[Dict[str, object]] = None, *, include_output_proj: bool = False, **options
) -> SpectrumResult:
    """Matrix-free kappa(J) of an ``AttentionSite`` at ``inputs`` (or of an ``AttentionFunction``); ``options``: those
    of :func:`.spectrum.matrix_free_spectrum`. Unconverged, sigma_min is an upper bound and kappa a lower one."""
    fn = as_function(site, inputs, include_output_proj=include_output_proj)
    op = JacobianOperator(fn)
    return matrix_free_spectrum(op.matvec, op.rmatvec, op.shape, device=fn.theta().device, **options)
