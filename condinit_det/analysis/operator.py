"""The attention Jacobian as a linear operator, for the matrix-free and the per-head exact methods."""
from __future__ import annotations

from typing import Optional

import torch
from torch.func import jvp, vjp, vmap

from .functional import AttentionFunction, eval_mode

__all__ = ["JacobianOperator"]


class JacobianOperator:
    """``J`` as a linear operator on blocks of flat vectors (one vector per row).

    ``matvec(V [b, cols]) -> [b, rows]`` (rows ``J v``); ``rmatvec(U [b, rows]) -> [b, cols]``
    (rows ``J^T u``). The vjp is linearized once at the current weights; ``J v`` uses forward-mode
    AD and falls back to differentiating the (linear) vjp when the layer lacks forward-mode
    support. Blocks are batched with ``torch.func.vmap`` in chunks of ``chunk_size`` vectors.
    """

    def __init__(self, fn: AttentionFunction, *, chunk_size: Optional[int] = None):
        self.fn = fn
        self.shape = (fn.rows, fn.cols)
        self.chunk_size = chunk_size
        self._theta = fn.theta()
        with eval_mode(fn.module):
            _, self._vjp = vjp(fn.flat, self._theta)
        self._forward_mode = True

    def _rmv(self, u: torch.Tensor) -> torch.Tensor:
        return self._vjp(u)[0]

    def _mv_forward(self, v: torch.Tensor) -> torch.Tensor:
        return jvp(self.fn.flat, (self._theta,), (v,))[1]

    def _mv_reverse(self, v: torch.Tensor) -> torch.Tensor:
        # J v = d/du <J^T u, v> at any u: reverse mode through the linear map u -> J^T u.
        zero = torch.zeros(self.shape[0], dtype=v.dtype, device=v.device)
        _, back = vjp(self._rmv, zero)
        return back(v)[0]

    def rmatvec(self, u: torch.Tensor) -> torch.Tensor:
        with eval_mode(self.fn.module):
            return vmap(self._rmv, chunk_size=self.chunk_size)(u)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        with eval_mode(self.fn.module):
            if self._forward_mode:
                try:
                    return vmap(self._mv_forward, chunk_size=self.chunk_size)(v)
                except (NotImplementedError, RuntimeError):
                    self._forward_mode = False
            return vmap(self._mv_reverse, chunk_size=self.chunk_size)(v)
