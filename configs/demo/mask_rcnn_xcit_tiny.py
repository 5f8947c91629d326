# Tiny XCiT Mask R-CNN for the embedded shapes dataset: the detector, data and schedule of
# mask_rcnn_vit_tiny.py with its ViT trunk replaced by an XCiT trunk of the same width and depth
# (patch 8, stride-8 output feeding the same SimpleFeaturePyramid), for CPU-sized arm comparisons
# in the setting of the paper's COCO experiment (XCiT + Mask R-CNN).
#
# Default arm: "default" (condinit.arm). Train another with `condinit.arm=conditioned` /
# `condinit.arm=mimetic`, or all three with `--arm all`.
from functools import partial

import torch.nn as nn

from detectron2.config import LazyCall as L

from condinit_det.modeling.xcit import XCiT

from .mask_rcnn_vit_tiny import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

model.backbone.net = L(XCiT)(
    patch_size=8,
    embed_dim=96,
    depth=4,
    num_heads=3,
    mlp_ratio=4.0,
    qkv_bias=True,
    eta=1.0,
    drop_path_rate=0.0,
    norm_layer=partial(nn.LayerNorm, eps=1e-6),
    out_feature="last_feat",
)

# Attention sites: backbone.net.blocks.{0..3}.attn (timm XCA).
condinit.arm = "default"
condinit.include = ["backbone.net.*"]

train.output_dir = "./output/demo/mask_rcnn_xcit_tiny"
