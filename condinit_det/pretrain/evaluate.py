"""Top-1 / top-5 evaluation; process ``r`` of ``W`` evaluates images ``r, r + W, ...`` and the per-image results
are gathered back in dataset order, so a distributed evaluation equals a single process's (up to float rounding)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from detectron2.utils import comm
from torch import nn
from torch.utils.data import DataLoader, Subset

from ..utils.distributed import sync_buffers

__all__ = ["EvalResult", "evaluate"]


@dataclass
class EvalResult:
    """Per-image arrays in dataset order ([N] each)."""

    labels: np.ndarray  # int64, true class
    top1: np.ndarray  # int64, predicted class
    top5_hit: np.ndarray  # uint8, 1 when the true class is among the top-5 (top-K for K < 5 classes)
    loss: np.ndarray  # float64, cross-entropy per image

    def summary(self) -> Dict[str, float]:
        """top-1 and top-5 accuracy in percent, mean loss."""
        return {
            "top1": float((self.top1 == self.labels).mean() * 100.0),
            "top5": float(self.top5_hit.mean() * 100.0),
            "eval_loss": float(self.loss.mean()),
        }

    def predictions(self, epoch: int) -> dict:
        """The ``eval_predictions.json`` payload."""
        return {
            "epoch": int(epoch),
            "labels": self.labels.tolist(),
            "top1": self.top1.tolist(),
            "top5_hit": self.top5_hit.astype(int).tolist(),
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset,
    *,
    device: torch.device,
    batch_size: int,
    workers: int,
    amp_dtype: Optional[torch.dtype] = None,
) -> EvalResult:
    """Evaluate ``model`` (not a DDP wrapper) on ``dataset``; every process returns the full result."""
    world, rank = comm.get_world_size(), comm.get_rank()
    sync_buffers(model)
    indices = list(range(rank, len(dataset), world))  # no padding, no duplicates
    loader = DataLoader(
        Subset(dataset, indices),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
    )
    was_training = model.training
    model.eval()
    labels, preds, hits, losses = [], [], [], []
    autocast = (
        torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
    )
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

    local = (
        np.asarray(indices, dtype=np.int64),
        cat(labels, np.int64),
        cat(preds, np.int64),
        cat(hits, np.bool_).astype(np.uint8),
        cat(losses, np.float64),
    )
    parts = comm.all_gather(local) if world > 1 else [local]
    order = np.concatenate([p[0] for p in parts])
    merged = [np.empty(len(dataset), dtype=parts[0][i].dtype) for i in range(1, 5)]
    for i, arr in enumerate(merged, start=1):
        arr[order] = np.concatenate([p[i] for p in parts])
    return EvalResult(labels=merged[0], top1=merged[1], top5_hit=merged[2], loss=merged[3])
