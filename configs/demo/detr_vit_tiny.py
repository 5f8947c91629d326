# Tiny DETR-style detector with masks (plain ViT backbone + small transformer) for the embedded
# shapes dataset, sized so that one arm trains and evaluates in about 14 minutes on two CPU cores.
#
# Arm placement: by default the arm applies to every attention site — the ViT backbone
# ("backbone.*") and the transformer ("transformer.*": encoder self-attention, decoder
# self-attention, decoder cross-attention) — because in DETR attention is the whole detector.
# Narrow it with include/exclude patterns, e.g.
#   condinit.include='["backbone.*"]'        backbone only
#   condinit.include='["transformer.*"]'     transformer only
#   condinit.include='["transformer.decoder.layers.*.cross_attn"]'   decoder cross-attention only
#
# DETR converges slowly: with plain DETR queries this model is still near chance after 2250 CPU
# iterations (box AP 1.0). The config keeps DETR's set formulation, matcher, losses and
# inference and adds three training aids from the DETR family that change how fast queries
# specialize:
#   - reference points (Anchor DETR / DAB-DETR): each query owns a learned point, its positional
#     query is the point's sine encoding and boxes are predicted relative to it;
#   - sine temperature 20 instead of 10000 (DAB-DETR), so a width-96 encoding resolves an 8x8 map;
#   - 5 query groups during training (Group DETR): every object supervises 5 queries per step;
#     inference runs one group of 10 queries.
# docs/detr.md gives the overrides that switch each aid off, to measure what each adds. The model is
# small too: the ViT trunk at patch 16 (8x8 tokens, global attention),
# hidden width 96, 3 + 3 pre-norm layers, no dropout, lr 1e-3.

from fvcore.common.param_scheduler import CosineParamScheduler

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler
from detectron2.solver.build import get_default_optimizer_params

from condinit_det.modeling.detr import PositionEmbeddingSine
from condinit_det.modeling.detr.optim import AdamWFullModelClip

from ..common.condinit import condinit, condinit_analysis
from ..common.data_embedded import NUM_CLASSES, dataloader
from ..common.models.detr import model
from ..common.trackers import trackers
from .mask_rcnn_vit_tiny import model as _mask_rcnn_vit

# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
# The ViT trunk of the Mask R-CNN demo at patch 16 (an 8x8 token grid, global attention in every
# block), without a class-token slot in its position embedding.
model.backbone = _mask_rcnn_vit.backbone.net
model.backbone.patch_size = 16
model.backbone.window_size = 0
model.backbone.window_block_indexes = []
model.backbone.pretrain_use_cls_token = False
model.in_feature = "last_feat"
model.position_embedding = L(PositionEmbeddingSine)(num_pos_feats=48, temperature=20.0, normalize=True)
model.transformer.d_model = 96
model.transformer.nhead = 4
model.transformer.num_encoder_layers = 3
model.transformer.num_decoder_layers = 3
model.transformer.dim_feedforward = 384
model.transformer.dropout = 0.0
model.transformer.normalize_before = True
model.num_classes = NUM_CLASSES
model.num_queries = 10  # scenes hold 1-5 objects
model.reference_points = True
model.query_groups = 5
# Stride 16 -> 4: 32x32 mask logits per query at 128 px.
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
train.max_iter = 4000
train.eval_period = 500
train.log_period = 50
train.checkpointer = dict(period=4000, max_to_keep=1)
train.device = "cpu"
train.output_dir = "./output/demo/detr_vit_tiny"
train.trackers = trackers  # W&B / MLflow switches, off

# kappa of the attention Jacobian at the first, middle and last site, at initialization and every 400
# iterations (11 measured points), on a 3x3 token grid, exact (condinit_det.analysis; docs/demos.md has its cost).
condinit_analysis.period = 400
condinit_analysis.max_tokens = 8
condinit_analysis.method = "exact"

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(CosineParamScheduler)(start_value=1.0, end_value=0.02),
    # a fraction of max_iter: recompute it when overriding train.max_iter
    warmup_length=80 / train.max_iter,
    warmup_factor=0.001,
)
