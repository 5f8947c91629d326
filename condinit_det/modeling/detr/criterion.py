"""Set prediction loss of a DETR-style detector (DETR, Sec. 3.1 and A.2)."""

from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from detectron2.utils import comm
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou, sigmoid_focal_loss

from .matcher import HungarianMatcher

__all__ = ["SetCriterion", "dice_loss", "flat_indices", "num_boxes_for_normalization"]

Indices = List[Tuple[torch.Tensor, torch.Tensor]]


def dice_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over masks of 1 - soft Dice. logits, targets: [N, H, W] (targets in [0, 1])."""
    prob = logits.sigmoid().flatten(1)
    targets = targets.flatten(1)
    inter = (prob * targets).sum(1)
    return (1 - (2 * inter + 1) / (prob.sum(1) + targets.sum(1) + 1)).sum()


def num_boxes_for_normalization(targets: List[Dict[str, torch.Tensor]], device) -> float:
    """Average number of target boxes per worker, at least 1 (so empty batches give finite losses)."""
    n = torch.as_tensor([float(sum(len(t["labels"]) for t in targets))], device=device)
    if comm.get_world_size() > 1:
        torch.distributed.all_reduce(n)
    return max(n.item() / comm.get_world_size(), 1.0)


def flat_indices(indices: Indices) -> Tuple[torch.Tensor, torch.Tensor]:
    """(image index, query index) of every matched query, from the matcher's per-image (query_idx, target_idx)."""
    batch = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)])
    query = torch.cat([q for q, _ in indices])
    return batch, query


class SetCriterion(nn.Module):
    """Matches predictions to targets and computes the losses, already weighted: cross-entropy over C+1 classes (the
    "no object" class C weighted by ``eos_coef``; a weighted mean over all queries), L1 and GIoU of the boxes and
    sigmoid focal and Dice of the masks (matched pairs, divided by the number of target boxes). Auxiliary decoder
    layers get the class/box losses with suffix ``_{layer}``.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        matcher: HungarianMatcher,
        eos_coef: float = 0.1,
        class_weight: float = 1.0,
        bbox_weight: float = 5.0,
        giou_weight: float = 2.0,
        mask_focal_weight: float = 1.0,
        mask_dice_weight: float = 1.0,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if not 0 <= eos_coef <= 1:
            raise ValueError(f"eos_coef must be in [0, 1], got {eos_coef}")
        self.num_classes = num_classes
        self.matcher = matcher
        self.class_weight = class_weight
        self.bbox_weight = bbox_weight
        self.giou_weight = giou_weight
        self.mask_focal_weight = mask_focal_weight
        self.mask_dice_weight = mask_dice_weight
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight, persistent=False)

    def detection_losses(
        self,
        pred_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        targets: List[Dict[str, torch.Tensor]],
        indices: Indices,
        num_boxes: float,
        suffix: str = "",
    ) -> Dict[str, torch.Tensor]:
        """pred_logits [B, Q, C+1], pred_boxes [B, Q, 4] (normalized cxcywh)."""
        batch, query = flat_indices(indices)
        target_classes = pred_logits.new_full(pred_logits.shape[:2], self.num_classes, dtype=torch.int64)
        matched_labels = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
        target_classes[batch, query] = matched_labels.to(pred_logits.device)
        loss_ce = F.cross_entropy(pred_logits.transpose(1, 2), target_classes, self.empty_weight)

        src = pred_boxes[batch, query]
        tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)]).to(src)
        loss_bbox = F.l1_loss(src, tgt, reduction="sum") / num_boxes
        giou = torch.diag(generalized_box_iou(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")))
        loss_giou = (1 - giou).sum() / num_boxes
        return {
            f"loss_ce{suffix}": self.class_weight * loss_ce,
            f"loss_bbox{suffix}": self.bbox_weight * loss_bbox,
            f"loss_giou{suffix}": self.giou_weight * loss_giou,
        }

    def mask_losses(
        self, mask_logits: torch.Tensor, target_masks: torch.Tensor, num_boxes: float
    ) -> Dict[str, torch.Tensor]:
        """mask_logits [N, h, w] of the matched queries; target_masks [N, h, w] in {0, 1}."""
        target_masks = target_masks.to(mask_logits.dtype)
        focal = sigmoid_focal_loss(
            mask_logits.flatten(1), target_masks.flatten(1), alpha=self.focal_alpha, gamma=self.focal_gamma
        )
        focal = focal.mean(1).sum() / num_boxes
        dice = dice_loss(mask_logits, target_masks) / num_boxes
        return {"loss_mask": self.mask_focal_weight * focal, "loss_dice": self.mask_dice_weight * dice}

    def forward(
        self,
        pred_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        targets: List[Dict[str, torch.Tensor]],
        num_boxes: float,
        aux_outputs: Sequence[Tuple[torch.Tensor, torch.Tensor]] = (),
    ) -> Tuple[Dict[str, torch.Tensor], Indices]:
        """Class and box losses of the last decoder layer and of every auxiliary layer, normalized by ``num_boxes``
        (:func:`num_boxes_for_normalization`). Returns (losses, indices of the last layer)."""
        indices = self.matcher(pred_logits, pred_boxes, targets)
        losses = self.detection_losses(pred_logits, pred_boxes, targets, indices, num_boxes)
        for i, (logits_i, boxes_i) in enumerate(aux_outputs):
            idx_i = self.matcher(logits_i, boxes_i, targets)
            losses.update(self.detection_losses(logits_i, boxes_i, targets, idx_i, num_boxes, suffix=f"_{i}"))
        return losses, indices
