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
#       data.root=/path/to/imagenet
# With another total batch, set train.batch_size; lr follows lr_base x batch/512 (warmup and min lr
# here are the batch-1024 values).
from .deit_b_300ep import augment, condinit, data, optimizer, scheduler, train

model = dict(name="swin_base_patch4_window7_224", kwargs=dict(drop_path_rate=0.5, drop_rate=0.0))

# What differs from DeiT's recipe (configs/ImageNet/deit_b_300ep.py):
augment.repeated_aug = 0
optimizer.betas = (0.9, 0.999)
optimizer.clip_grad = 5.0
optimizer.clip_mode = "norm"
scheduler.warmup_epochs = 20
train.ema = dict(enabled=False)
train.workers = 8
train.output_dir = "./output/imagenet/swin_b_300ep"
