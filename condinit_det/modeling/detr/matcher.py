"""Bipartite matching between predictions and ground-truth objects (DETR, Sec. 3.1). scipy is imported where used:
every process that imports the package registers this model, and few train it (scipy.optimize takes 0.6 s)."""

from typing import Dict, List, Tuple

import torch
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou

__all__ = ["HungarianMatcher"]


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to targets minimising

        cost = cost_class * (-p(target class)) + cost_bbox * L1(boxes) + cost_giou * (-GIoU),

    boxes being normalized (cx, cy, w, h). Queries left unmatched are "no object".
    Each image is solved exactly with ``scipy.optimize.linear_sum_assignment``.
    """

    def __init__(self, *, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0):
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("at least one of cost_class, cost_bbox, cost_giou must be non-zero")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    def cost_matrix(
        self, logits: torch.Tensor, boxes: torch.Tensor, tgt_labels: torch.Tensor, tgt_boxes: torch.Tensor
    ) -> torch.Tensor:
        """logits [Q, C+1], boxes [Q, 4], tgt_labels [T], tgt_boxes [T, 4] -> cost [Q, T]."""
        prob = logits.softmax(-1)
        cost = -self.cost_class * prob[:, tgt_labels]
        cost = cost + self.cost_bbox * torch.cdist(boxes, tgt_boxes, p=1)
        giou = generalized_box_iou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(tgt_boxes, "cxcywh", "xyxy"))
        return cost - self.cost_giou * giou

    @torch.no_grad()
    def forward(
        self, pred_logits: torch.Tensor, pred_boxes: torch.Tensor, targets: List[Dict[str, torch.Tensor]]
    ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """
        Args:
            pred_logits: [B, Q, C+1]; pred_boxes: [B, Q, 4] normalized cxcywh.
            targets: per image {"labels": int64 [T], "boxes": [T, 4] normalized cxcywh}.
        Returns:
            per image (query_idx, target_idx), int64 tensors of length min(Q, T), sorted by
            query index; empty for an image without objects.
        """
        from scipy.optimize import linear_sum_assignment

        sizes = [len(t["labels"]) for t in targets]
        b, q = pred_logits.shape[:2]
        # One cost matrix for the whole batch (every query against every target), cut per image.
        cost = self.cost_matrix(
            pred_logits.flatten(0, 1).float(),
            pred_boxes.flatten(0, 1).float(),
            torch.cat([t["labels"] for t in targets]),
            torch.cat([t["boxes"] for t in targets]).float(),
        )
        out = []
        for i, image_cost in enumerate(cost.view(b, q, sum(sizes)).cpu().split(sizes, dim=-1)):
            rows, cols = linear_sum_assignment(image_cost[i].numpy())
            out.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
        return out
