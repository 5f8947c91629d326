# XCiT-S12/16 Mask R-CNN on COCO from scratch, XCiT's 3x recipe (Swin's optimizer settings):
# multi-scale training with random crops, AdamW (lr 1e-4, weight decay 0.05, none on norms), 36
# epochs at 16 images per iteration, LR x0.1 at epochs 27 and 33, stochastic depth 0.05.
#
# Which XCiT config is which:
#   - this file: the from-scratch variant. No ImageNet stage, so the attention-init arm decides how
#     every XCA block starts in the detection run itself. Neck: detectron2's SimpleFeaturePyramid on
#     XCiT's last (stride-16) block, the ViTDet neck, so XCiT and ViT detectors differ only in the trunk.
#   - mask_rcnn_xcit_s12_p16_3x_in1k.py: the paper's reproduction. Fine-tuned from each arm's
#     ImageNet-1k XCiT, with XCiT's own detection neck (deconvolutions on blocks 3/5/7/11 + FPN).
# Heads: the standard Mask R-CNN FPN heads of the recipe (2fc box head, 4conv mask head).
#
# To start this variant from an ImageNet XCiT checkpoint anyway, convert it with
# condinit_det.modeling.convert.convert_timm_checkpoint(state_dict, model), save it as {"model": converted} and
# set train.init_checkpoint to that file; it then overwrites the arm for the weights it holds.
#
# Arm: "default" (timm's XCiT init, truncated normal std 0.02). Select another with
# `condinit.arm=conditioned` / `condinit.arm=mimetic`, or all three with `--arm all`.
from functools import partial

import torch.nn as nn

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from condinit_det.modeling import armed
from condinit_det.modeling.backbones import PaddedSimpleFeaturePyramid
from condinit_det.modeling.xcit import XCiT

from ..common.coco_loader_multiscale_crop import dataloader
from ..common.condinit import condinit, condinit_analysis
from .mask_rcnn_swin_t_3x import lr_multiplier, optimizer, train

model = armed(model_zoo.get_config("common/models/mask_rcnn_fpn.py").model)
# detectron2's SimpleFeaturePyramid, padding the inputs to its coarsest stride (multi-scale inputs of
# any aspect ratio; detectron2's own class pads only to a square canvas, which this recipe does not use).
model.backbone = L(PaddedSimpleFeaturePyramid)(
    net=L(XCiT)(
        patch_size=16,
        embed_dim=384,
        depth=12,
        num_heads=8,
        mlp_ratio=4.0,
        qkv_bias=True,
        eta=1.0,
        drop_path_rate=0.05,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        # ~2 images per GPU: synchronize the BatchNorms of the patch embedding and LPI.
        sync_bn=True,
        out_feature="last_feat",
    ),
    in_feature="${.net.out_feature}",
    out_channels=256,
    # strides 4, 8, 16, 32 from the stride-16 output, plus max-pooled stride 64: p2..p6
    scale_factors=(4.0, 2.0, 1.0, 0.5),
    top_block=L(LastLevelMaxPool)(),
    norm="LN",
    # Multi-scale inputs up to 1333 px: no square canvas (ViTDet pads to 1024 for LSJ).
    square_pad=0,
)
# XCiT is trained on ImageNet-normalized RGB.
model.pixel_mean = [123.675, 116.280, 103.530]
model.pixel_std = [58.395, 57.120, 57.375]
model.input_format = "RGB"

# Attention sites: backbone.net.blocks.{0..11}.attn (timm XCA, fused qkv).
condinit.arm = "default"
condinit.include = ["backbone.net.*"]

# Attention-Jacobian conditioning tracked during training (condinit_det.analysis.hooks): exact kappa of
# the first, middle and last XCA block at 16 tokens of a fixed test image, at the start, every
# `period` iterations and at the end. Measured cost: under 1% of the training time at this period
# (BENCHMARKS.md, "Conditioning tracking on the paper's configs"). condinit_analysis.period=0 turns it off.
condinit_analysis.period = 5000
condinit_analysis.sites = ["backbone.net.blocks.0.attn", "backbone.net.blocks.6.attn", "backbone.net.blocks.11.attn"]

# XCiT's recipe is Swin's schedule and optimizer: take them from the Swin-T config.
train.output_dir = "./output/COCO/mask_rcnn_xcit_s12_3x"
optimizer.params.overrides = {}  # XCiT has no relative position bias tables or absolute position embedding
