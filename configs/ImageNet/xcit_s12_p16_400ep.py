# XCiT-S12/16: the backbone of the paper's COCO experiment (Table 3), pretrained with XCiT's
# 400-epoch recipe (see xcit_m24_p16_400ep.py for every value and its source). Differences from M24:
#   stochastic depth 0.05 ............................ facebookresearch/xcit README (S12/16 command)
#   LayerScale eta 1.0 (timm's xcit_small_12_p16_224) ............................ timm model, paper
#   batch 1024 = 8 GPUs x 128 ...................................................... README command
#
#   tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/xcit_s12_p16_400ep.py --arm all \
#       data.root=/path/to/imagenet
from .xcit_m24_p16_400ep import augment, condinit, data, model, optimizer, scheduler, train

model.name = "xcit_small_12_p16_224"
model.kwargs.drop_path_rate = 0.05
train.output_dir = "./output/imagenet/xcit_s12_p16_400ep"
