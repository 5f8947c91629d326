"""Top-1 / top-5 evaluation: each process evaluates a contiguous shard of the images, gathered back in dataset order,
so a distributed evaluation equals a single process's (up to float rounding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from detectron2.data.samplers import InferenceSampler
from detectron2.utils import comm
from torch import nn
from torch.utils.data import DataLoader

from ..utils.distributed import sync_buffers


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
    sync_buffers(model)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=InferenceSampler(len(dataset)),  # each process a contiguous shard, no padding or duplicate
        num_workers=workers,
        pin_memory=device.type == "cuda",
    )
    was_training = model.training
    model.eval()
    labels, preds, hits, losses = [], [], [], []
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        logits = logits.float()
        topk = logits.topk(min(5, logits.shape[1]), dim=1).indices
        labels.append(targets.cpu())
        preds.append(topk[:, 0].cpu())
        hits.append((topk == targets[:, None]).any(dim=1).cpu())
        losses.append(F.cross_entropy(logits, targets, reduction="none").double().cpu())
    model.train(was_training)
    # A process with an empty shard saw no batch; it still contributes typed, empty arrays.
    local = [
        torch.cat(parts).numpy() if parts else np.zeros(0, dtype=dtype)
        for parts, dtype in zip((labels, preds, hits, losses), (np.int64, np.int64, np.bool_, np.float64))
    ]
    labels, preds, hits, losses = (np.concatenate(shards) for shards in zip(*comm.all_gather(local)))  # rank order
    return EvalResult(labels=labels, top1=preds, top5_hit=hits.astype(np.uint8), loss=losses)
