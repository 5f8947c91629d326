# XCiT-M24/16 (Table 1 row "XCiT-M"): ImageNet-1k from scratch, XCiT's 400-epoch recipe.
#
# Recipe and sources (El-Nouby et al., "XCiT: Cross-Covariance Image Transformers", NeurIPS 2021,
# Sec. 4.1 and Table B.1; facebookresearch/xcit main.py defaults and README; the code is DeiT's):
#   AdamW, lr 5e-4 x batch/512, weight decay 0.05, eps 1e-8 ............................... main.py
#   400 epochs, cosine to 1e-5, 5 warmup epochs from 1e-6 ...................... paper Sec. 4.1, main.py
#   batch 1024 (the README's S12 command: 8 GPUs x 128; the M24 batch is not stated there) ... README
#   DeiT's augmentation: RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25, Mixup 0.8,
#   CutMix 1.0, label smoothing 0.1, bicubic; repeated augmentation x3 ........................ main.py
#   EMA of the weights, decay 0.99996 ....................................................... main.py
#   LayerScale 1e-5 for M24 (timm's xcit_medium_24_p16_224 sets eta=1e-5) ......... paper, timm model
#   stochastic depth 0.15 for M24: XCiT's M24 detection config (detection/configs/xcit/
#   mask_rcnn_xcit_medium_24_p16_3x_coco.py) uses 0.15, and its S12 value there (0.05) equals the
#   README's ImageNet S12 value; Table B.1 itself was not checked here ..... detection config, README
#   evaluation at crop ratio 1.0 ("--full_crop", the README's default), bicubic ............... README
#   mixed precision, no gradient clipping ................................................... main.py
# As for DeiT, main.py's scheduler adds 10 cooldown epochs (410 in all); here cooldown_epochs=0.
#
#   tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/xcit_m24_p16_400ep.py --arm all \
#       data.root=/path/to/imagenet train.output_dir=output/imagenet/xcit_m24
import os

from ..common.condinit import condinit

model = dict(name="xcit_medium_24_p16_224", kwargs=dict(drop_path_rate=0.15, drop_rate=0.0))

data = dict(
    root=os.environ.get("IMAGENET_ROOT", "./datasets/imagenet"),
    train_split="train",
    val_split="val",
    num_classes=1000,
    img_size=224,
    crop_pct=1.0,
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
    repeated_aug=3,
)

optimizer = dict(opt="adamw", lr_base=5e-4, lr_base_size=512, lr_base_scale="linear", weight_decay=0.05,
                 eps=1e-8, clip_grad=None)

scheduler = dict(sched="cosine", warmup_epochs=5, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=0)

train = dict(
    output_dir="./output/imagenet/xcit_m24_p16_400ep",
    epochs=400,
    batch_size=1024,
    seed=0,
    device="cuda",
    amp=True,
    amp_dtype="float16",
    ema=dict(enabled=True, decay=0.99996),
    log_period=100,
    eval_period=1,
    workers=10,
)

# Every attention layer gets the arm: the 24 XCA blocks (blocks.N.attn, timm XCA) and the two
# class-attention layers (cls_attn_blocks.N.attn). Detection keeps only the XCA blocks; to arm only
# those here as well: condinit.include='["blocks.*"]'.
condinit.arm = "default"
condinit.include = None
