# Tiny ViT classifier pretrained on real handwritten digits: the embedded digits-cls dataset (the 1,797 UCI
# digits scikit-learn ships, 10 classes, 1,438 training / 359 evaluation images upscaled to 64x64 grey RGB).
# The model, optimizer and evaluation of pretrain_vit_tiny.py; only the data, the augmentation digits need
# and the schedule differ. `make demo-digits` pretrains every arm with it, then fine-tunes
# configs/demo/mask_rcnn_vit_tiny_digits_finetune.py from each arm's own run.
#
#   tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny_digits.py --arm all \
#       train.output_dir=output/demo_digits/pretrain
from .pretrain_vit_tiny import augment, condinit, condinit_analysis, data, model, optimizer, scheduler, train

data.root = "embedded:digits-cls"  # generated on first use into $CONDINIT_DATA/digits-cls-v1
data.num_classes = 10

# A mirrored digit is another glyph (or none): no flips. Grey images: no colour jitter.
augment.hflip = 0.0
augment.color_jitter = 0.0
augment.scale = (0.7, 1.0)  # crops that keep the whole digit in view

# 1,438 images per epoch instead of shapes-cls's 5,000: more epochs (10 against 6), still fewer images in all.
train.epochs = 10
train.output_dir = "./output/demo/pretrain_vit_tiny_digits"
# Epochs are a quarter as long as shapes-cls's: kappa every 5 epochs (3 measured points, at 0, 5 and 10) keeps its
# cost within 5% of the training time.
condinit_analysis.period = 5
