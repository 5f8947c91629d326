"""DETR-style detector with instance masks as a detectron2 meta-architecture."""

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from detectron2.modeling import META_ARCH_REGISTRY, Backbone, detector_postprocess
from detectron2.structures import BitMasks, Boxes, ImageList, Instances, PolygonMasks
from torch import nn
from torchvision.ops import box_convert

from .criterion import SetCriterion, flat_indices, num_boxes_for_normalization
from .position_encoding import PositionEmbeddingSine
from .segmentation import MaskHead
from .transformer import Transformer

__all__ = ["DETRInstanceSeg"]

MASK_TRAIN_MODES = ("joint", "masks_only")


def _groups_to_batch(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[L, B, K*Q, ...] -> [L, K*B, Q, ...], query group g of image i at batch entry g*B + i."""
    layers, b, kq = x.shape[:3]
    x = x.reshape(layers, b, groups, kq // groups, *x.shape[3:]).transpose(1, 2)
    return x.reshape(layers, groups * b, kq // groups, *x.shape[4:])


class MLP(nn.Module):
    """``num_layers`` linear layers with ReLU in between (none after the last): DETR's box head."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int):
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


@META_ARCH_REGISTRY.register()
class DETRInstanceSeg(nn.Module):
    """End-to-end set prediction: backbone -> 1x1 projection -> transformer -> per-query class, box and (optionally)
    mask (docs/detr.md; its attention sites: docs/detr.md#attention-sites).

    Args:
        backbone: any detectron2 Backbone.
        in_feature: name of the backbone output fed to the transformer (e.g. "last_feat", "p5").
        transformer: :class:`Transformer`; its ``d_model`` is the hidden width D.
        num_classes: object classes C (the classifier has C + 1 outputs, the last is "no object").
        num_queries: learned object queries.
        criterion: :class:`SetCriterion` (matcher and loss weights).
        pixel_mean, pixel_std: per-channel normalization of the input image.
        mask_head: :class:`MaskHead`, or None for boxes only.
        mask_in_features: backbone outputs feeding the mask head's upsampling stages, coarsest first, one per
            ``mask_head.fpn_channels`` entry.
        mask_train: "joint" trains everything together; "masks_only" only the mask head (DETR's two-stage recipe).
        aux_loss: class/box losses after every decoder layer.
        mask_threshold: probability threshold that turns mask probabilities into binary masks.
        size_divisibility: pad batched images to a multiple of this; None uses the backbone's.
        position_embedding: :class:`PositionEmbeddingSine` with ``2 * num_pos_feats == D``; None is DETR's.
        reference_points, query_groups: training aids (docs/detr.md#three-training-aids); False and 1 are DETR.
    """

    def __init__(
        self,
        *,
        backbone: Backbone,
        in_feature: str,
        transformer: Transformer,
        num_classes: int,
        num_queries: int = 100,
        criterion: SetCriterion,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        mask_head: Optional[MaskHead] = None,
        mask_in_features: Sequence[str] = (),
        mask_train: str = "joint",
        aux_loss: bool = True,
        mask_threshold: float = 0.5,
        size_divisibility: Optional[int] = None,
        position_embedding: Optional[PositionEmbeddingSine] = None,
        reference_points: bool = False,
        query_groups: int = 1,
    ):
        super().__init__()
        shapes = backbone.output_shape()
        if in_feature not in shapes:
            raise ValueError(f"in_feature {in_feature!r} is not a backbone output; available: {sorted(shapes)}")
        if mask_train not in MASK_TRAIN_MODES:
            raise ValueError(f"mask_train must be one of {MASK_TRAIN_MODES}, got {mask_train!r}")
        if mask_train == "masks_only" and mask_head is None:
            raise ValueError("mask_train='masks_only' needs a mask_head")
        if criterion.num_classes != num_classes:
            raise ValueError(f"criterion.num_classes ({criterion.num_classes}) != num_classes ({num_classes})")
        mask_in_features = list(mask_in_features)
        fpn_channels = mask_head.fpn_channels if mask_head is not None else []
        if [shapes[name].channels if name in shapes else None for name in mask_in_features] != fpn_channels:
            raise ValueError(
                f"mask_in_features {mask_in_features} must name one backbone output per mask_head.fpn_channels entry "
                f"{fpn_channels} (none without a mask_head), of that many channels; the backbone's outputs: "
                f"{ {name: shape.channels for name, shape in shapes.items()} }"
            )
        if query_groups < 1:
            raise ValueError(f"query_groups must be >= 1, got {query_groups}")
        if not 0 < mask_threshold < 1:
            raise ValueError(f"mask_threshold must be in (0, 1), got {mask_threshold}")

        hidden = transformer.d_model
        self.backbone = backbone
        self.in_feature = in_feature
        self.input_proj = nn.Conv2d(shapes[in_feature].channels, hidden, kernel_size=1)
        if position_embedding is None:
            position_embedding = PositionEmbeddingSine(num_pos_feats=hidden // 2, normalize=True)
        if 2 * position_embedding.num_pos_feats != hidden:
            raise ValueError(
                f"position_embedding gives {2 * position_embedding.num_pos_feats} channels, "
                f"the transformer width is {hidden}"
            )
        self.position_embedding = position_embedding
        self.transformer = transformer
        if reference_points:
            self.query_embed = None
            self.reference_points = nn.Embedding(num_queries * query_groups, 2)  # (x, y) logits
            with torch.no_grad():
                self.reference_points.weight.uniform_(0.0, 1.0).logit_(eps=1e-3)
        else:
            self.query_embed = nn.Embedding(num_queries * query_groups, hidden)
            self.reference_points = None
        self.query_groups = query_groups
        self.class_head = nn.Linear(hidden, num_classes + 1)
        self.box_head = MLP(hidden, hidden, 4, 3)
        self.mask_head = mask_head
        self.mask_in_features = mask_in_features
        self.criterion = criterion
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.aux_loss = aux_loss
        self.mask_train = mask_train
        self.mask_threshold = mask_threshold
        self.size_divisibility = size_divisibility
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        if self.pixel_mean.shape != self.pixel_std.shape:
            raise ValueError(f"pixel_mean and pixel_std differ in length: {pixel_mean} vs {pixel_std}")
        if mask_train == "masks_only":
            for name, p in self.named_parameters():
                if not name.startswith("mask_head."):
                    p.requires_grad_(False)

    @property
    def device(self):
        return self.pixel_mean.device

    def preprocess_image(self, batched_inputs: List[Dict]) -> Tuple[ImageList, torch.Tensor]:
        """Normalize and pad; returns the ImageList and the padding mask (bool [B, Hp, Wp], True on padding)."""
        images = [(x["image"].to(self.device) - self.pixel_mean) / self.pixel_std for x in batched_inputs]
        div = self.size_divisibility if self.size_divisibility is not None else self.backbone.size_divisibility
        images = ImageList.from_tensors(images, div, padding_constraints=self.backbone.padding_constraints)
        b, _, hp, wp = images.tensor.shape
        mask = torch.ones((b, hp, wp), dtype=torch.bool, device=self.device)
        for i, (h, w) in enumerate(images.image_sizes):
            mask[i, :h, :w] = False
        return images, mask

    def prepare_targets(self, batched_inputs: List[Dict], images: ImageList) -> List[Dict[str, torch.Tensor]]:
        """Ground truth per image: labels, boxes as (cx, cy, w, h) normalized by the unpadded image size and, when
        masks are trained, bool masks on the padded canvas [T, Hp, Wp]."""
        targets = []
        hp, wp = images.tensor.shape[-2:]
        for x, (h, w) in zip(batched_inputs, images.image_sizes):
            inst = x["instances"].to(self.device)
            scale = torch.tensor([w, h, w, h], dtype=torch.float32, device=self.device)
            boxes = box_convert(inst.gt_boxes.tensor.float() / scale, "xyxy", "cxcywh")
            t = {"labels": inst.gt_classes.long(), "boxes": boxes}
            if self.mask_head is not None:
                if not inst.has("gt_masks"):
                    raise ValueError("the mask head needs 'gt_masks' (set use_instance_mask=True in the mapper)")
                gm = inst.gt_masks
                if isinstance(gm, PolygonMasks):
                    gm = BitMasks.from_polygon_masks(gm, h, w)
                m = gm.tensor.to(self.device, torch.bool)
                t["masks"] = F.pad(m, (0, wp - m.shape[-1], 0, hp - m.shape[-2]))
            targets.append(t)
        return targets

    def _detect(self, images: ImageList, pad_mask: torch.Tensor, groups: int = 1):
        """Runs the first ``groups`` query groups; queries of group g are at [g*Q, (g+1)*Q)."""
        features = self.backbone(images.tensor)
        src = features[self.in_feature]
        mask = F.interpolate(pad_mask[None].float(), size=src.shape[-2:], mode="nearest")[0].bool()
        proj = self.input_proj(src)
        pos = self.position_embedding(mask).to(proj.dtype)
        n = groups * self.num_queries
        group_mask = None
        if groups > 1:
            group = torch.arange(n, device=proj.device) // self.num_queries
            group_mask = group[:, None] != group[None, :]
        if self.reference_points is None:
            hs, memory = self.transformer(proj, mask, self.query_embed.weight[:n], pos, group_mask)
            boxes = self.box_head(hs).sigmoid()
        else:
            ref_logits = self.reference_points.weight[:n]
            query_pos = self.position_embedding.encode_points(ref_logits.sigmoid()).to(proj.dtype)
            hs, memory = self.transformer(proj, mask, query_pos, pos, group_mask)
            # Centre offsets are added in logit space; width and height are predicted outright.
            boxes = (self.box_head(hs) + F.pad(ref_logits, (0, 2))).sigmoid()
        logits = self.class_head(hs)
        return dict(logits=logits, boxes=boxes, hs=hs, memory=memory, mask=mask, proj=proj, features=features)

    def _masks(self, out, batch_idx: torch.Tensor, query_idx: torch.Tensor) -> torch.Tensor:
        fpn = [out["features"][f] for f in self.mask_in_features]
        return self.mask_head(
            out["hs"][-1][batch_idx, query_idx], batch_idx, out["memory"], out["mask"], out["proj"], fpn
        )

    def forward(self, batched_inputs: List[Dict]):
        """detectron2's inputs -> training: dict of weighted losses; inference: list of {"instances": Instances}
        (pred_boxes XYXY at the output resolution, scores, pred_classes, pred_masks bool [N, H, W])."""
        images, pad_mask = self.preprocess_image(batched_inputs)
        if not self.training:
            return self.inference(batched_inputs, images, pad_mask)

        targets = self.prepare_targets(batched_inputs, images)
        masks_only = self.mask_train == "masks_only"
        groups = 1 if masks_only else self.query_groups
        with torch.set_grad_enabled(not masks_only):
            out = self._detect(images, pad_mask, groups)
        num_boxes = num_boxes_for_normalization(targets, self.device)
        if masks_only:
            indices = self.criterion.matcher(out["logits"][-1], out["boxes"][-1], targets)
            losses = {}
        else:
            # The groups are independent one-to-one problems: fold them into the batch (image i of
            # group g becomes entry g*B + i) and weight the box losses by 1/K through num_boxes,
            # which averages every loss over the groups.
            logits, boxes = (_groups_to_batch(out[k], groups) for k in ("logits", "boxes"))
            aux = list(zip(logits[:-1], boxes[:-1])) if self.aux_loss else ()
            losses, indices = self.criterion(logits[-1], boxes[-1], targets * groups, num_boxes * groups, aux)
            indices = indices[: len(targets)]  # group 0
        if self.mask_head is not None:
            batch_idx, query_idx = (t.to(self.device) for t in flat_indices(indices))
            logits = self._masks(out, batch_idx, query_idx)
            gt = torch.cat([t["masks"][j.to(self.device)] for t, (_, j) in zip(targets, indices)])
            gt = F.interpolate(
                gt[:, None].float(), size=logits.shape[-2:], mode="bilinear", align_corners=False, antialias=True
            )
            gt = gt[:, 0] > 0.5
            losses.update(self.criterion.mask_losses(logits, gt, num_boxes))
        return losses

    @torch.no_grad()
    def inference(self, batched_inputs, images: ImageList, pad_mask: torch.Tensor) -> List[Dict]:
        out = self._detect(images, pad_mask)
        prob = out["logits"][-1].softmax(-1)[..., :-1]
        scores, labels = prob.max(-1)
        hp, wp = images.tensor.shape[-2:]
        results = []
        for i, (x, (h, w)) in enumerate(zip(batched_inputs, images.image_sizes)):
            scale = torch.tensor([w, h, w, h], dtype=torch.float32, device=self.device)
            inst = Instances((h, w))
            inst.pred_boxes = Boxes(box_convert(out["boxes"][-1, i], "cxcywh", "xyxy") * scale)
            inst.scores = scores[i]
            inst.pred_classes = labels[i]
            inst.query_index = torch.arange(self.num_queries, device=self.device)
            out_h, out_w = x.get("height", h), x.get("width", w)
            r = detector_postprocess(inst, out_h, out_w)
            if self.mask_head is not None:
                q = r.query_index
                logits = self._masks(out, torch.full_like(q, i), q)
                r.pred_masks = self._paste_masks(logits, (hp, wp), (h, w), (out_h, out_w))
            r.remove("query_index")
            results.append({"instances": r})
        return results

    def _paste_masks(self, logits, padded_size, image_size, output_size, chunk: int = 32) -> torch.Tensor:
        """Mask logits on the padded canvas [N, h', w'] -> bool masks [N, out_h, out_w] of the valid image region,
        resized to the output resolution in one interpolation."""
        (hp, wp), (h, w), (oh, ow) = padded_size, image_size, output_size
        full = (max(round(hp * oh / h), oh), max(round(wp * ow / w), ow))
        out = torch.zeros((len(logits), oh, ow), dtype=torch.bool, device=logits.device)
        for s in range(0, len(logits), chunk):
            up = F.interpolate(logits[s : s + chunk, None], size=full, mode="bilinear", align_corners=False)
            out[s : s + chunk] = up[:, 0, :oh, :ow].sigmoid() > self.mask_threshold
        return out
