"""One optimizer step of a pretraining recipe with timm's parts, as the epoch loop and bench_gpu_step.py run it."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .config import resolve_lr
from .data import build_mixup


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The largest learning rate over the optimizer's parameter groups."""
    return max(group["lr"] for group in optimizer.param_groups)


def _criterion(augment: Dict, mixup) -> nn.Module:
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if mixup is not None:  # the targets are already smoothed by Mixup
        return SoftTargetCrossEntropy()
    if augment["label_smoothing"] > 0:
        return LabelSmoothingCrossEntropy(smoothing=augment["label_smoothing"])
    return nn.CrossEntropyLoss()


class PretrainStep:
    """The training machinery of one run for ``model`` (already on its device): ``optimizer``, ``scheduler``,
    ``num_epochs`` (timm's count), ``loss_scaler`` (float16 only), ``mixup``, ``ema`` (or None), ``lr``.

    Args:
        nodes: the config's nodes (:func:`condinit_det.pretrain.config.node`).
        amp_dtype: ``torch.float16`` / ``torch.bfloat16`` under autocast, or None (float32).
    """

    def __init__(
        self,
        model: nn.Module,
        nodes: Dict[str, Dict],
        *,
        num_classes: int,
        amp_dtype: Optional[torch.dtype],
        steps_per_epoch: int,
        lr_scale: float = 1.0,
    ):
        from timm.optim import create_optimizer_v2
        from timm.scheduler import create_scheduler_v2
        from timm.utils import ModelEmaV3, NativeScaler

        augment, opt, sched, train = (nodes[k] for k in ("augment", "optimizer", "scheduler", "train"))
        device = next(model.parameters()).device
        self.model, self.amp_dtype = model, amp_dtype
        self.ema = ModelEmaV3(model, decay=float(train["ema"]["decay"])) if train["ema"]["enabled"] else None
        self.lr = resolve_lr(opt, int(train["batch_size"]), lr_scale)
        opt_kwargs = {k: opt[k] for k in ("betas", "eps") if opt[k] is not None}
        self.optimizer = create_optimizer_v2(
            model,
            opt=opt["opt"],
            lr=self.lr,
            weight_decay=opt["weight_decay"],
            momentum=opt["momentum"],
            layer_decay=opt["layer_decay"],
            **opt_kwargs,
        )
        self.scheduler, self.num_epochs = create_scheduler_v2(  # the scheduler node's keys are timm's arguments
            self.optimizer,
            **sched,
            num_epochs=int(train["epochs"]),
            step_on_epochs=False,
            updates_per_epoch=steps_per_epoch,
        )
        # fp16 needs loss scaling (timm's scaler: scale, backward, unscale, clip, step, update); bf16 and fp32 don't
        self.loss_scaler = NativeScaler(device.type) if amp_dtype == torch.float16 else None
        self.mixup = build_mixup(augment, num_classes)
        self.criterion = _criterion(augment, self.mixup)
        self.clip, self.clip_mode = opt["clip_grad"], opt["clip_mode"]
        self._device_type = device.type

    def checkpointables(self) -> Dict[str, object]:
        """What an epoch checkpoint holds besides the model (objects with ``state_dict``)."""
        ema = self.ema.module if self.ema is not None else None
        found = {"optimizer": self.optimizer, "scheduler": self.scheduler, "ema": ema, "scaler": self.loss_scaler}
        return {name: obj for name, obj in found.items() if obj is not None}

    def __call__(self, forward: nn.Module, images: torch.Tensor, targets: torch.Tensor, *, step: int) -> float:
        """One step: mixup, ``forward`` (the model or its DDP wrapper), loss, backward, clipping, optimizer step, then
        the scheduler and the EMA at ``step`` (steps done, this one included). Returns the loss."""
        from timm.utils import dispatch_clip_grad

        if self.mixup is not None:
            images, targets = self.mixup(images, targets)
        with torch.autocast(self._device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.criterion(forward(images), targets)
        self.optimizer.zero_grad(set_to_none=True)
        if self.loss_scaler is not None:
            self.loss_scaler(
                loss, self.optimizer, clip_grad=self.clip, clip_mode=self.clip_mode, parameters=self.model.parameters()
            )
        else:
            loss.backward()
            if self.clip is not None:
                dispatch_clip_grad(self.model.parameters(), value=self.clip, mode=self.clip_mode)
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=step)
        if self.ema is not None:
            self.ema.update(self.model, step=step)
        return loss.item()
