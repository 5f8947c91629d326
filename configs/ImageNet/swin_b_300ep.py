# Swin-B (Table 1 row "Swin-B"): ImageNet-1k from scratch, Swin's 300-epoch recipe.
#
# Recipe and sources (Liu et al., "Swin Transformer", ICCV 2021, Sec. 4.1 and Appendix A2.1;
# microsoft/Swin-Transformer config.py defaults and configs/swin/swin_base_patch4_window7_224.yaml):
#   AdamW, lr 5e-4 x batch/512 (1e-3 at batch 1024), weight decay 0.05, eps 1e-8, betas .9/.999 ... config.py
#   batch 1024, 300 epochs, cosine, 20 linear warmup epochs ............................... paper, config.py
#   warmup lr 5e-7 and min lr 5e-6, both also x batch/512 (1e-6 and 1e-5 at batch 1024) ...... config.py
#   gradient clipping at norm 5.0 ........................................................... config.py
#   stochastic depth 0.5 for Swin-B ..................................................... swin_base_...yaml
#   DeiT's augmentation and regularization (colour jitter 0.4, RandAugment rand-m9-mstd0.5-inc1,
#   random erasing 0.25 pixel, Mixup 0.8, CutMix 1.0, switch 0.5, label smoothing 0.1, bicubic),
#   without repeated augmentation and EMA, which the paper reports do not help ......... paper, config.py
#   evaluation: resize 256, centre crop 224 (TEST.CROP), bicubic; mixed precision ........... config.py
#
#   tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/swin_b_300ep.py --arm all \
#       data.root=/path/to/imagenet train.output_dir=output/imagenet/swin_b
# With another total batch, set train.batch_size; lr follows lr_base x batch/512 (warmup and min lr
# here are the batch-1024 values).
import os

from ..common.condinit import condinit

model = dict(name="swin_base_patch4_window7_224", kwargs=dict(drop_path_rate=0.5, drop_rate=0.0))

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
                 eps=1e-8, betas=(0.9, 0.999), clip_grad=5.0, clip_mode="norm")

scheduler = dict(sched="cosine", warmup_epochs=20, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=0)

train = dict(
    output_dir="./output/imagenet/swin_b_300ep",
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

# Every window-attention block (layers.S.blocks.N.attn, timm Swin WindowAttention) gets the arm.
condinit.arm = "default"
condinit.include = None
