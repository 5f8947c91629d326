# DETR-style detector with instance masks on COCO, ViT-B backbone (ViTDet: plain ViT with
# windowed + global attention and a simple feature pyramid), DETR's recipe:
#   - 100 queries, 6 encoder + 6 decoder layers, hidden 256, 8 heads (configs/common/models/detr.py);
#   - AdamW, lr 1e-4, backbone lr x0.1, weight decay 1e-4, full-model gradient clipping at 0.1;
#   - batch 64, 500 epochs with the LR divided by 10 after epoch 400 (DETR's long schedule; DETR's
#     300-epoch variant drops at 200), no warmup;
#   - augmentation: horizontal flip, then either a multi-scale resize (shorter side 480-800,
#     longer <= 1333) or resize to 400/500/600 + random 384-600 crop + the multi-scale resize.
# The transformer reads the stride-32 pyramid level (p5, as DETR reads C5); the mask head adds
# p4, p3, p2 while upsampling, predicting masks at stride 4. Masks train jointly with boxes here;
# DETR's two-stage recipe is `model.mask_train="masks_only"` with `train.init_checkpoint` set to
# a box-trained checkpoint.
#
# Arm placement (condinit): by default every attention site — ViT backbone ("backbone.*") and
# transformer ("transformer.*") — since in DETR attention is the whole detector. Backbone only:
# condinit.include='["backbone.*"]'; transformer only: condinit.include='["transformer.*"]'.
# From random initialization; an ImageNet checkpoint in train.init_checkpoint overwrites the arm
# for the weights it holds.
from functools import partial

import torch.nn as nn

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling import SimpleFeaturePyramid, ViT
from detectron2.solver.build import get_default_optimizer_params

from condinit_det.modeling.detr.optim import AdamWFullModelClip, backbone_lr_factor

from ..common.coco_loader_multiscale_crop import dataloader
from ..common.coco_schedule_epochs import multistep_epochs
from ..common.condinit import condinit, condinit_analysis
from ..common.trackers import trackers
from ..common.models.detr import model

embed_dim, depth, num_heads, dp = 768, 12, 12, 0.1
model.backbone = L(SimpleFeaturePyramid)(
    net=L(ViT)(
        img_size=1024,
        patch_size=16,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        drop_path_rate=dp,
        window_size=14,
        mlp_ratio=4,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        # blocks 2, 5, 8, 11 use global attention
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10],
        residual_block_indexes=[],
        use_rel_pos=True,
        out_feature="last_feat",
    ),
    in_feature="${.net.out_feature}",
    out_channels=256,
    scale_factors=(4.0, 2.0, 1.0, 0.5),
    top_block=None,
    norm="LN",
    # DETR's augmentation yields non-square images up to 1333 px: pad per batch, not to a square.
    square_pad=0,
)
model.in_feature = "p5"
model.mask_in_features = ["p4", "p3", "p2"]
model.mask_head.fpn_channels = [256, 256, 256]

dataloader.train.total_batch_size = 64

optimizer = L(AdamWFullModelClip)(
    params=L(get_default_optimizer_params)(
        base_lr="${..lr}",
        weight_decay_norm=0.0,
        lr_factor_func=partial(backbone_lr_factor, factor=0.1),
    ),
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=1e-4,
    clip_max_norm=0.1,
)

train = model_zoo.get_config("common/train.py").train
train.output_dir = "./output/COCO/detr_vitdet_b"
train.trackers = trackers  # W&B / MLflow switches, off
train.max_iter, lr_multiplier = multistep_epochs(
    epochs=500,
    milestone_epochs=(400,),
    images_per_batch=dataloader.train.total_batch_size,
    warmup_iters=0,
    warmup_factor=1.0,
)
train.checkpointer.period = 18480  # ~10 epochs at batch 64
train.eval_period = 18480

# Attention-Jacobian conditioning tracked during training (condinit_det.analysis.hooks): exact kappa at
# 16 tokens of a fixed test image (a global block: 20) of the first and last backbone blocks, the
# first and last encoder self-attention and the last decoder layer's self- and cross-attention, at
# the start, every `period` iterations and at the end. Measured cost: under 1% of the training time
# at this period (BENCHMARKS.md, "Conditioning tracking on the paper's configs").
# condinit_analysis.period=0 turns it off.
condinit_analysis.period = 10000
condinit_analysis.sites = [
    "backbone.net.blocks.0.attn",
    "backbone.net.blocks.11.attn",
    "transformer.encoder.layers.0.self_attn",
    "transformer.encoder.layers.5.self_attn",
    "transformer.decoder.layers.5.self_attn",
    "transformer.decoder.layers.5.cross_attn",
]
