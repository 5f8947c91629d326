# Tiny ViT classifier pretrained on the embedded shapes-cls dataset (64x64, 8 classes), sized so that
# the three arms train in a few minutes on two CPU cores: `make demo-pretrain`.
#
# The trunk is the one of configs/demo/mask_rcnn_vit_tiny.py (patch 8, width 96, depth 4, 3 heads,
# MLP ratio 4, qkv bias, LayerNorm eps 1e-6, no LayerScale), so model_final.pth converts into that
# detector's ViT. timm's vit_tiny_patch16_224 with these kwargs builds it; attention sites
# blocks.{0..3}.attn (timm Attention).
#
# Default arm: "default" (condinit.arm). Train another with `--arm conditioned` / `--arm mimetic`,
# or all three with `--arm all`.
from ..common.condinit import condinit, condinit_analysis
from ..common.trackers import trackers

model = dict(
    name="vit_tiny_patch16_224",
    # global_pool="avg": the head reads the mean of the patch tokens (trains faster on small data than the
    # class token); the class token and its position slot are kept, so the weights convert unchanged.
    kwargs=dict(
        patch_size=8,
        embed_dim=96,
        depth=4,
        num_heads=3,
        mlp_ratio=4.0,
        qkv_bias=True,
        img_size=64,
        global_pool="avg",
        drop_path_rate=0.0,
    ),
)

data = dict(
    root="embedded:shapes-cls",  # generated on first use into $CONDINIT_DATA/shapes-cls-v1
    num_classes=8,
    img_size=64,
    crop_pct=1.0,  # the shapes fill the frame: evaluate on the whole image
    interpolation="bilinear",
    mean=(0.5, 0.5, 0.5),  # (x / 255 - 0.5) / 0.5, as timm's ViT weights expect; recorded in model_final.pth
    std=(0.5, 0.5, 0.5),
)

# A light version of the DeiT augmentation family: crops that keep most of the shape, flips, random
# erasing; no RandAugment or mixup, which slow down a schedule this short.
augment = dict(
    scale=(0.5, 1.0),
    hflip=0.5,
    auto_augment=None,
    color_jitter=0.3,
    interpolation="bilinear",
    re_prob=0.0,
    mixup=0.0,
    cutmix=0.0,
    label_smoothing=0.1,
)

optimizer = dict(opt="adamw", lr_base=2e-3, lr_base_size=64, weight_decay=0.05, clip_grad=None)
scheduler = dict(sched="cosine", warmup_epochs=1, warmup_lr=1e-5, min_lr=1e-5)

train = dict(
    output_dir="./output/demo_pretrain",
    epochs=6,
    batch_size=64,
    seed=0,
    device="cpu",
    amp=False,
    ema=dict(enabled=False),
    log_period=20,
    eval_period=1,
    workers=1,
    eval_batch_size=250,
    trackers=trackers,  # W&B / MLflow switches, off
)

condinit.arm = "default"

# kappa of the attention Jacobian of blocks 0, 2 and 3 on the first evaluation image, at initialization, every
# `period` EPOCHS and after the last epoch (docs/pretraining.md): 4 measured points, about 3% of the training time.
condinit_analysis.period = 2
