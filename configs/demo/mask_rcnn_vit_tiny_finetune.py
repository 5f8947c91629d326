# The paper's protocol at CPU size, second stage: the Mask R-CNN demo (mask_rcnn_vit_tiny.py)
# fine-tuned from each arm's own pretrained backbone, i.e. the ViT of
# `tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all` (same trunk:
# patch 8, width 96, depth 4, 3 heads). `make demo-paper` runs both stages and one report.
#
# train.init_checkpoint names a pretraining run directory per arm and seed: tools/train_net.py
# replaces {arm} and {seed} with the run's own, takes that run's model_final.pth and converts the
# timm ViT to the detectron2 ViT (position embedding of the 64 px pretraining, class-token slot
# kept; relative positions, which timm's ViT lacks, keep their zero init). The arm is applied when
# the model is built and the checkpoint then overwrites every attention weight with the weights
# that arm's pretraining produced: the arm acts through the pretraining, as in the paper.
from .mask_rcnn_vit_tiny import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

# The pretraining's input: 64 px images normalized as timm's ViT expects ((x / 255 - 0.5) / 0.5).
model.backbone.net.pretrain_img_size = 64
model.pixel_mean = [127.5, 127.5, 127.5]
model.pixel_std = [127.5, 127.5, 127.5]

train.init_checkpoint = "output/demo_paper/pretrain/{arm}/seed{seed}"
train.output_dir = "./output/demo_paper/finetune"

# A pretrained trunk needs a shorter schedule: 300 iterations, an evaluation every 60.
train.max_iter = 300
train.eval_period = 60
train.checkpointer = dict(period=300, max_to_keep=1)
condinit_analysis.period = 100  # 4 measured points of kappa
lr_multiplier.warmup_length = 40 / train.max_iter
