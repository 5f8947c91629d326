# Tiny DETR-style detector with masks (plain ViT backbone + small transformer) for the embedded
# shapes dataset, sized so that one arm trains and evaluates in a few minutes on two CPU cores.
#
# Arm placement: by default the arm applies to every attention site — the ViT backbone
# ("backbone.*") and the transformer ("transformer.*": encoder self-attention, decoder
# self-attention, decoder cross-attention) — because in DETR attention is the whole detector.
# Narrow it with include/exclude patterns, e.g.
#   condinit.include='["backbone.*"]'        backbone only
#   condinit.include='["transformer.*"]'     transformer only
#   condinit.include='["transformer.decoder.layers.*.cross_attn"]'   decoder cross-attention only
#
# DETR converges slowly; to learn the shapes within a few CPU minutes this config keeps DETR's
# formulation and losses but shrinks it: 16 queries (scenes hold 1-5 objects), hidden width 96,
# 3 encoder + 3 decoder layers, no dropout, a 10x higher learning rate than DETR's 1e-4 with
# warmup and cosine decay, and the same LR for the backbone (it is trained from scratch).
# Even so, a few hundred iterations only start to localize objects (box AP near zero): this config
# checks the pipeline and the arm placement; ranking arms on DETR needs train.max_iter in the
# thousands (and lr_multiplier.warmup_length rescaled to it).

from fvcore.common.param_scheduler import CosineParamScheduler

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler
from detectron2.solver.build import get_default_optimizer_params

from condinit_det.modeling.detr.optim import AdamWFullModelClip

from ..common.condinit import condinit
from ..common.data_embedded import NUM_CLASSES, dataloader
from ..common.models.detr import model
from .mask_rcnn_vit_tiny import model as _mask_rcnn_vit

# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
# The ViT trunk of the Mask R-CNN demo, without a class-token slot in its position embedding.
model.backbone = _mask_rcnn_vit.backbone.net
model.backbone.pretrain_use_cls_token = False
model.in_feature = "last_feat"
model.transformer.d_model = 96
model.transformer.nhead = 4
model.transformer.num_encoder_layers = 3
model.transformer.num_decoder_layers = 3
model.transformer.dim_feedforward = 384
model.transformer.dropout = 0.0
model.num_classes = NUM_CLASSES
model.num_queries = 16
# Stride 8 -> 2: 64x64 mask logits per query at 128 px.
model.mask_head.num_upsample = 2
model.mask_head.conv_dims = [64, 32, 16, 16]

# ---------------------------------------------------------------------------------------------
# Optimization: DETR's AdamW with full-model gradient clipping, short warmup, cosine decay.
# ---------------------------------------------------------------------------------------------
optimizer = L(AdamWFullModelClip)(
    params=L(get_default_optimizer_params)(base_lr="${..lr}", weight_decay_norm=0.0),
    lr=1e-3,
    betas=(0.9, 0.999),
    weight_decay=1e-4,
    clip_max_norm=0.1,
)

train = model_zoo.get_config("common/train.py").train
train.max_iter = 600
train.eval_period = 600
train.log_period = 20
train.checkpointer = dict(period=600, max_to_keep=2)
train.device = "cpu"
train.output_dir = "./output/demo/detr_vit_tiny"

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(CosineParamScheduler)(start_value=1.0, end_value=0.02),
    # a fraction of max_iter: recompute it when overriding train.max_iter
    warmup_length=50 / train.max_iter,
    warmup_factor=0.001,
)
