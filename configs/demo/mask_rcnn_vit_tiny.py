# Tiny ViTDet-style Mask R-CNN (plain ViT + SimpleFeaturePyramid) for the embedded shapes dataset,
# sized so that the three arms train and evaluate in under 10 minutes on two CPU cores (`make demo`).
#
# Default arm: "default" (condinit.arm). Train another with `condinit.arm=conditioned` /
# `condinit.arm=mimetic`, or all three with `--arm all`.
#
# The detector heads defined here are reused by the other demo configs: they import `model` from
# this file and replace `model.backbone` (Swin + FPN) or `model.backbone.net` (any single-scale
# backbone with a stride-8 output named by `out_feature`, e.g. XCiT).
from functools import partial

import torch.nn as nn
from fvcore.common.param_scheduler import CosineParamScheduler

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling import SimpleFeaturePyramid, ViT
from detectron2.solver import WarmupParamScheduler

from condinit_det.modeling import armed

from ..common.condinit import condinit, condinit_analysis
from ..common.data_embedded import IMAGE_SIZE, NUM_CLASSES, dataloader
from ..common.trackers import trackers

# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
model = armed(model_zoo.get_config("common/models/mask_rcnn_vitdet.py").model)

embed_dim, depth, num_heads, patch_size = 96, 4, 3, 8
fpn_dim = 64  # channels of every pyramid level and of the RPN head

model.backbone = L(SimpleFeaturePyramid)(
    net=L(ViT)(
        img_size=IMAGE_SIZE,
        # Patch 8 keeps a 16x16 token grid at 128 px: small shapes need the finer stride.
        patch_size=patch_size,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        drop_path_rate=0.0,
        window_size=8,
        mlp_ratio=4,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        # Windowed blocks alternate with global ones, as in ViTDet.
        window_block_indexes=[0, 2],
        residual_block_indexes=[],
        use_rel_pos=True,
        pretrain_img_size=IMAGE_SIZE,
        out_feature="last_feat",
    ),
    in_feature="${.net.out_feature}",
    out_channels=fpn_dim,
    # Strides 4, 8, 16 (p2, p3, p4) from the stride-8 ViT output; objects are at most ~60 px, so
    # no coarser level is needed.
    scale_factors=(2.0, 1.0, 0.5),
    top_block=None,
    norm="LN",
    square_pad=IMAGE_SIZE,
)

# RPN: one shared conv, anchors matched to 16-56 px objects.
model.proposal_generator.in_features = ["p2", "p3", "p4"]
model.proposal_generator.head.in_channels = fpn_dim
model.proposal_generator.head.conv_dims = [-1]
model.proposal_generator.anchor_generator.sizes = [[16], [32], [64]]
model.proposal_generator.anchor_generator.strides = [4, 8, 16]
model.proposal_generator.batch_size_per_image = 128
model.proposal_generator.pre_nms_topk = (600, 300)
model.proposal_generator.post_nms_topk = (200, 100)

# ROI heads: narrow box and mask heads; no conv layers in the box head.
model.roi_heads.num_classes = NUM_CLASSES
model.roi_heads.batch_size_per_image = 64
model.roi_heads.box_in_features = ["p2", "p3", "p4"]
model.roi_heads.box_pooler.scales = (1.0 / 4, 1.0 / 8, 1.0 / 16)
# A fixed 2x2 sampling grid: the adaptive one makes ROIAlign's CPU backward pass a bottleneck.
model.roi_heads.box_pooler.sampling_ratio = 2
model.roi_heads.box_head.input_shape.channels = fpn_dim
model.roi_heads.box_head.conv_dims = []
model.roi_heads.box_head.fc_dims = [256, 256]
model.roi_heads.box_head.conv_norm = ""
model.roi_heads.box_predictor.input_shape.channels = 256
model.roi_heads.mask_in_features = ["p2", "p3", "p4"]
model.roi_heads.mask_pooler.scales = (1.0 / 4, 1.0 / 8, 1.0 / 16)
model.roi_heads.mask_pooler.sampling_ratio = 2
model.roi_heads.mask_head.input_shape.channels = fpn_dim
# Two 3x3 convs and the 2x upsampling deconv; the mask head dominates the cost at stock width.
model.roi_heads.mask_head.conv_dims = [32, 32, 32]
model.roi_heads.mask_head.conv_norm = ""

# ---------------------------------------------------------------------------------------------
# Optimization: AdamW, linear warmup, cosine decay.
# ---------------------------------------------------------------------------------------------
optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.lr = 2e-3
optimizer.weight_decay = 0.05
# Positional parameters are not decayed (ViTDet convention).
optimizer.params.overrides = {k: {"weight_decay": 0.0} for k in ("pos_embed", "rel_pos_h", "rel_pos_w")}

train = model_zoo.get_config("common/train.py").train
train.max_iter = 400
# Five evaluations per run, so the report's convergence metric has points to resolve.
train.eval_period = 80
train.log_period = 10
train.checkpointer = dict(period=400, max_to_keep=1)
train.device = "cpu"
train.output_dir = "./output/demo/mask_rcnn_vit_tiny"
train.trackers = trackers  # W&B / MLflow switches, off

# Scenes hold at most 5 objects: keeping the 30 best detections instead of 100 leaves AP as it is
# and spares the CPU most of the mask pasting at evaluation.
model.roi_heads.box_predictor.test_topk_per_image = 30

# Track the attention-Jacobian condition number of the first, middle and last attention block at
# initialization and every 100 iterations, 5 measured points (condinit_det.analysis; results.json and
# the report's kappa plot), at about 2% of the training time (docs/demos.md). max_tokens=8 keeps a 3x3
# token grid (stride 3 in an 8x8 window, 6 in the 16x16 global grid): a 864 x 27648 Jacobian (9 tokens
# x width 96 rows), whose exact SVD takes about a second.
condinit_analysis.period = 100
condinit_analysis.max_tokens = 8
condinit_analysis.method = "exact"

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(CosineParamScheduler)(start_value=1.0, end_value=0.02),
    # a fraction of max_iter: recompute it when overriding train.max_iter
    warmup_length=50 / train.max_iter,
    warmup_factor=0.001,
)
