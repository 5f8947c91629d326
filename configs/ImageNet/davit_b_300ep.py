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
#       data.root=/path/to/imagenet
from .deit_b_300ep import augment, condinit, data, optimizer, scheduler, train

model = dict(name="davit_base", kwargs=dict(drop_path_rate=0.4, drop_rate=0.0))

# What differs from DeiT's recipe (configs/ImageNet/deit_b_300ep.py): Swin's schedule, no repeated
# augmentation, no EMA.
augment.repeated_aug = 0
scheduler.warmup_epochs = 20
train.ema = dict(enabled=False)
train.workers = 8
train.output_dir = "./output/imagenet/davit_b_300ep"
