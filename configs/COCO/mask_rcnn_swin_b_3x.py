# Swin-B Mask R-CNN with FPN on COCO, the Swin 3x recipe (see mask_rcnn_swin_t_3x.py); Swin-B
# widths and depths, stochastic depth 0.3. From random initialization; an ImageNet checkpoint
# (e.g. detectron2://ImageNetPretrained/swin/swin_base_patch4_window7_224_22k.pth) can be set in
# train.init_checkpoint and then overwrites the arm for the weights it holds.
#
# Arm: "default". Select another with `condinit.arm=conditioned` / `condinit.arm=mimetic`.
from detectron2.config import LazyCall as L
from detectron2.modeling import SwinTransformer

from .mask_rcnn_swin_t_3x import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up = L(SwinTransformer)(
    embed_dim=128,
    depths=(2, 2, 18, 2),
    num_heads=(4, 8, 16, 32),
    window_size=7,
    mlp_ratio=4.0,
    drop_path_rate=0.3,
    out_indices=(0, 1, 2, 3),
)
train.output_dir = "./output/COCO/mask_rcnn_swin_b_3x"

# Attention-Jacobian conditioning tracked during training (condinit_det.analysis.hooks): exact kappa of
# the first, middle and last window-attention block (one 7x7 window each, 49 tokens) of a fixed test
# image, at the start, every `period` iterations and at the end. Measured cost: under 1% of the
# training time at this period (BENCHMARKS.md, "Conditioning tracking on the paper's configs").
# condinit_analysis.period=0 turns it off.
condinit_analysis.period = 5000
condinit_analysis.sites = [
    "backbone.bottom_up.layers.0.blocks.0.attn",
    "backbone.bottom_up.layers.2.blocks.8.attn",
    "backbone.bottom_up.layers.3.blocks.1.attn",
]
