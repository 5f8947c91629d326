"""Top-1 / top-5 evaluation; with several processes every image is evaluated once and the results gathered.

Process ``r`` of ``W`` evaluates images ``r, r + W, ...`` (no padding, no duplicates); the
per-image predictions are gathered and put back in dataset order, so a distributed evaluation
gives the same numbers as a single process (up to float rounding of the summed loss).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..utils.distributed import sync_buffers
from .data import build_eval_loader, eval_indices

__all__ = ["EvalResult", "evaluate", "sync_buffers"]


@dataclass
class EvalResult:
    """Per-image arrays in dataset order ([N] each) and the summary in percent."""

    labels: np.ndarray  # int64, true class
    top1: np.ndarray  # int64, predicted class
    top5_hit: np.ndarray  # uint8, 1 when the true class is among the top-5 (top-K for K < 5 classes)
    loss: np.ndarray  # float64, cross-entropy per image

    @property
    def top1_acc(self) -> float:
        return float((self.top1 == self.labels).mean() * 100.0)

    @property
    def top5_acc(self) -> float:
        return float(self.top5_hit.mean() * 100.0)

    @property
    def mean_loss(self) -> float:
        return float(self.loss.mean())

    def summary(self) -> Dict[str, float]:
        return {"top1": self.top1_acc, "top5": self.top5_acc, "eval_loss": self.mean_loss}

    def predictions(self, epoch: int) -> dict:
        """The ``eval_predictions.json`` payload."""
        return {"epoch": int(epoch), "labels": self.labels.tolist(), "top1": self.top1.tolist(),
                "top5_hit": self.top5_hit.astype(int).tolist()}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@torch.no_grad()
def evaluate(model: nn.Module, dataset, *, device: torch.device, batch_size: int, workers: int,
             amp_dtype: Optional[torch.dtype] = None) -> EvalResult:
    """Evaluate ``model`` (not a DDP wrapper) on ``dataset``; every process returns the full result."""
    world = dist.get_world_size() if _distributed() else 1
    rank = dist.get_rank() if _distributed() else 0
    sync_buffers(model)
    indices = eval_indices(len(dataset), world_size=world, rank=rank)
    loader = build_eval_loader(dataset, indices, batch_size=batch_size, workers=workers,
                               pin_memory=device.type == "cuda")
    was_training = model.training
    model.eval()
    labels, preds, hits, losses = [], [], [], []
    autocast = (torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None
                else contextlib.nullcontext())
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with autocast:
            logits = model(images)
        logits = logits.float()
        k = min(5, logits.shape[1])
        topk = logits.topk(k, dim=1).indices
        labels.append(targets.cpu())
        preds.append(topk[:, 0].cpu())
        hits.append((topk == targets[:, None]).any(dim=1).cpu())
        losses.append(F.cross_entropy(logits, targets, reduction="none").double().cpu())
    model.train(was_training)

    def cat(xs, dtype):
        # A process with an empty shard saw no batch; it still contributes typed, empty arrays.
        return torch.cat(xs).numpy() if xs else np.zeros(0, dtype=dtype)

    local = (np.asarray(indices, dtype=np.int64), cat(labels, np.int64), cat(preds, np.int64),
             cat(hits, np.bool_).astype(np.uint8), cat(losses, np.float64))
    if world > 1:
        from detectron2.utils import comm

        parts = comm.all_gather(local)
    else:
        parts = [local]
    order = np.concatenate([p[0] for p in parts])
    merged = [np.empty(len(dataset), dtype=parts[0][i].dtype) for i in range(1, 5)]
    for i, arr in enumerate(merged, start=1):
        arr[order] = np.concatenate([p[i] for p in parts])
    return EvalResult(labels=merged[0], top1=merged[1], top5_hit=merged[2], loss=merged[3])
