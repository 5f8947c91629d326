# DETR-style detector with instance masks (condinit_det.modeling.detr.DETRInstanceSeg): DETR's
# published settings — 100 queries, 6 encoder + 6 decoder layers, hidden width 256, 8 heads,
# FFN 2048, dropout 0.1, Hungarian costs class 1 / L1 5 / GIoU 2, loss weights the same,
# no-object weight 0.1, auxiliary losses after every decoder layer, focal + Dice mask losses.
#
# `model.backbone` and `model.in_feature` are placeholders: a concrete config sets a detectron2
# Backbone and names the output fed to the transformer (and `model.mask_in_features` /
# `model.mask_head.fpn_channels` for the higher-resolution features of the mask head, if any).
#
# Attention sites an arm can reach (condinit.include / exclude patterns):
#   backbone.*                                  backbone attention (ViT, Swin, ...)
#   transformer.encoder.layers.*.self_attn      encoder self-attention
#   transformer.decoder.layers.*.self_attn      decoder self-attention (queries)
#   transformer.decoder.layers.*.cross_attn     decoder cross-attention (queries -> memory)
# The mask head's attention maps (mask_head.attention) have no values or output projection and
# are not an nn.MultiheadAttention: no arm touches them.
from detectron2 import model_zoo
from detectron2.config import LazyCall as L

from condinit_det.modeling import armed
from condinit_det.modeling.detr import DETRInstanceSeg, HungarianMatcher, MaskHead, SetCriterion, Transformer

constants = model_zoo.get_config("common/data/constants.py").constants

model = armed(
    L(DETRInstanceSeg)(
        backbone="???",
        in_feature="???",
        transformer=L(Transformer)(
            d_model=256,
            nhead=8,
            num_encoder_layers=6,
            num_decoder_layers=6,
            dim_feedforward=2048,
            dropout=0.1,
            activation="relu",
            normalize_before=False,
        ),
        num_classes=80,
        num_queries=100,
        criterion=L(SetCriterion)(
            num_classes="${..num_classes}",
            matcher=L(HungarianMatcher)(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0),
            eos_coef=0.1,
            class_weight=1.0,
            bbox_weight=5.0,
            giou_weight=2.0,
            mask_focal_weight=1.0,
            mask_dice_weight=1.0,
        ),
        pixel_mean=constants.imagenet_rgb256_mean,
        pixel_std=constants.imagenet_rgb256_std,
        mask_head=L(MaskHead)(
            hidden_dim="${..transformer.d_model}",
            num_heads="${..transformer.nhead}",
            fpn_channels=[],
            num_upsample=2,
        ),
        mask_in_features=[],
        # "joint": detection and masks trained together; "masks_only": detector frozen (DETR's
        # two-stage recipe: train boxes first, then load that checkpoint and train the mask head).
        mask_train="joint",
        aux_loss=True,
        mask_threshold=0.5,
        size_divisibility=None,
        # DETR: learned query embeddings and sine encodings at temperature 10000 (None), one query
        # group. configs/demo/detr_vit_tiny.py shows the faster-converging variants.
        position_embedding=None,
        reference_points=False,
        query_groups=1,
    )
)
