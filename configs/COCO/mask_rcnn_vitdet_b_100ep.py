# ViTDet-B Mask R-CNN on COCO, 100-epoch LSJ recipe of ViTDet (plain ViT-B/16 + simple feature
# pyramid, AdamW with layer-wise LR decay 0.7, 64 images per iteration).
#
# Trained from random initialization: the attention-init arm only matters for weights that no
# checkpoint overwrites, so from scratch every attention block starts from the arm.
# mask_rcnn_vitdet_b_100ep_pretrained.py is the same recipe from the MAE ImageNet checkpoint.
#
# Arm: "default" (ViTDet's own init, truncated normal std 0.02). Select another with
# `condinit.arm=conditioned` / `condinit.arm=mimetic`, or all three with `--arm all`.
from functools import partial

from fvcore.common.param_scheduler import MultiStepParamScheduler

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling.backbone.vit import get_vit_lr_decay_rate
from detectron2.solver import WarmupParamScheduler

from condinit_det.modeling import armed

from ..common.coco_loader_lsj import dataloader
from ..common.condinit import condinit, condinit_analysis
from ..common.trackers import trackers

model = armed(model_zoo.get_config("common/models/mask_rcnn_vitdet.py").model)

# Attention sites: backbone.net.blocks.{0..11}.attn (detectron2 ViT, fused qkv).
condinit.arm = "default"
condinit.include = ["backbone.net.*"]

train = model_zoo.get_config("common/train.py").train
train.amp.enabled = True
train.ddp.fp16_compression = True
train.init_checkpoint = ""
train.output_dir = "./output/COCO/mask_rcnn_vitdet_b_100ep"
train.trackers = trackers  # W&B / MLflow switches, off

# ViTDet's 184375 iterations x 64 images: about 100 epochs of the 117,266 images detectron2 trains on.
train.max_iter = 184375
lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(MultiStepParamScheduler)(
        values=[1.0, 0.1, 0.01],
        milestones=[163889, 177546],
        num_updates=train.max_iter,
    ),
    warmup_length=250 / train.max_iter,
    warmup_factor=0.001,
)

optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.params.lr_factor_func = partial(get_vit_lr_decay_rate, num_layers=12, lr_decay_rate=0.7)
optimizer.params.overrides = {"pos_embed": {"weight_decay": 0.0}}
