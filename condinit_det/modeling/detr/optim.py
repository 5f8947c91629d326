"""Optimizer pieces of the DETR recipe: a lower backbone learning rate and full-model gradient
clipping (DETR clips the global gradient norm of all parameters to 0.1)."""

from typing import Iterable, Optional

import torch

__all__ = ["AdamWFullModelClip", "backbone_lr_factor"]


def backbone_lr_factor(param_name: str, *, factor: float = 0.1, prefix: str = "backbone.") -> float:
    """LR multiplier for ``get_default_optimizer_params(lr_factor_func=...)``: ``factor`` for
    parameters under ``prefix``, 1 elsewhere."""
    return factor if param_name.startswith(prefix) else 1.0


class AdamWFullModelClip(torch.optim.AdamW):
    """AdamW that first rescales the gradients of all its parameters so that their joint L2 norm
    is at most ``clip_max_norm`` (None or <= 0 disables clipping)."""

    def __init__(self, params: Iterable, *, clip_max_norm: Optional[float] = 0.1, **kwargs):
        super().__init__(params, **kwargs)
        self.clip_max_norm = clip_max_norm

    def step(self):
        # No closure: detectron2's trainers step once per backward pass, after it.
        if self.clip_max_norm is not None and self.clip_max_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], self.clip_max_norm)
        super().step()
