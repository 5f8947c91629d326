# DaViT-B (Table 1 row "DaViT-B"): ImageNet-1k from scratch, 300 epochs.
#
# Sources and how sure each value is:
#   300 epochs, ImageNet-1k only, 84.6% top-1 for DaViT-B ...... Ding et al., "DaViT", ECCV 2022; dingmyu/davit README
#   stochastic depth 0.4 for DaViT-B ........ mmpretrain configs/_base_/models/davit/davit-base.py (and the paper)
#   label smoothing 0.1, Mixup 0.8, CutMix 1.0 ................................ the same mmpretrain config
#   AdamW, lr 5e-4 x batch/512 (1e-3 at 1024), weight decay 0.05, cosine to 1e-5, 20 warmup epochs:
#     mmpretrain trains its DaViT configs with Swin's schedule (imagenet_bs1024_adamw_swin.py);
#     DaViT's own classification code is not in the public repository (dingmyu/davit holds detection
#     and segmentation only), and the paper's batch size and learning rate were not checked here
#   RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25, colour jitter 0.4, bicubic: the defaults of
#     the timm-based train.py in dingmyu/davit
#   evaluation: resize 256, centre crop 224 (crop_pct 0.875, as Swin's code), bicubic; timm's
#     davit_base weights, converted from the released checkpoint, are evaluated at crop_pct 0.95
#
# DaViT's two attention kinds, spatial window attention and channel attention, are both fused-qkv
# layers; condinit_det.init recognizes them (site kinds timm_davit_window and timm_davit_channel,
# 24 sites in DaViT-B), and every one of them gets the arm.
#
#   tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/davit_b_300ep.py --arm all \
#       data.root=/path/to/imagenet train.output_dir=output/imagenet/davit_b
import os

from ..common.condinit import condinit

model = dict(name="davit_base", kwargs=dict(drop_path_rate=0.4, drop_rate=0.0))

data = dict(
    root=os.environ.get("IMAGENET_ROOT", "./datasets/imagenet"),
    train_split="train",
    val_split="val",
    num_classes=1000,
    img_size=224,
    crop_pct=0.875,
    interpolation="bicubic",
    mean=(0.485, 0.456, 0.406),  # ImageNet's mean and std (timm's vit_base_patch16_224 default would be 0.5)
    std=(0.229, 0.224, 0.225),
)

augment = dict(
    scale=(0.08, 1.0),
    hflip=0.5,
    color_jitter=0.4,
    auto_augment="rand-m9-mstd0.5-inc1",
    interpolation="bicubic",
    re_prob=0.25,
    re_mode="pixel",
    re_count=1,
    mixup=0.8,
    cutmix=1.0,
    mixup_prob=1.0,
    mixup_switch_prob=0.5,
    mixup_mode="batch",
    label_smoothing=0.1,
    repeated_aug=0,
)

optimizer = dict(opt="adamw", lr_base=5e-4, lr_base_size=512, lr_base_scale="linear", weight_decay=0.05,
                 eps=1e-8, clip_grad=None)

scheduler = dict(sched="cosine", warmup_epochs=20, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=0)

train = dict(
    output_dir="./output/imagenet/davit_b_300ep",
    epochs=300,
    batch_size=1024,
    seed=0,
    device="cuda",
    amp=True,
    amp_dtype="float16",
    ema=dict(enabled=False),
    log_period=100,
    eval_period=1,
    workers=8,
)

condinit.arm = "default"
condinit.include = None
