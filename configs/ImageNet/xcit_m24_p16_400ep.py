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
#       data.root=/path/to/imagenet
from .deit_b_300ep import augment, condinit, data, optimizer, scheduler, train

model = dict(name="xcit_medium_24_p16_224", kwargs=dict(drop_path_rate=0.15, drop_rate=0.0))

# What differs from DeiT's recipe (configs/ImageNet/deit_b_300ep.py), whose code XCiT's is:
data.crop_pct = 1.0
train.epochs = 400
train.output_dir = "./output/imagenet/xcit_m24_p16_400ep"
