# DETR-style detector with instance masks on COCO, Swin-B backbone, DETR's recipe (see
# detr_vitdet_b.py for the schedule, optimizer and augmentation, which are shared).
# The transformer reads Swin's stride-32 stage (p3, 1024 channels); the mask head adds the
# stride-16/8/4 stages (p2, p1, p0) while upsampling.
#
# Arm placement (condinit): by default every attention site — Swin's window attention
# ("backbone.*") and the transformer ("transformer.*"). Backbone only:
# condinit.include='["backbone.*"]'; transformer only: condinit.include='["transformer.*"]'.
from .detr_vitdet_b import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train
from .mask_rcnn_swin_b_3x import model as _swin_b_mask_rcnn

# The Swin-B trunk of the Mask R-CNN recipe.
model.backbone = _swin_b_mask_rcnn.backbone.bottom_up
model.in_feature = "p3"
model.mask_in_features = ["p2", "p1", "p0"]
model.mask_head.fpn_channels = [512, 256, 128]

optimizer.params.overrides = {
    "relative_position_bias_table": {"weight_decay": 0.0},
}
train.output_dir = "./output/COCO/detr_swin_b"

# Conditioning tracking (condinit_analysis): the first, middle and last Swin block (one 7x7 window
# each) and the transformer sites of detr_vitdet_b.py. Measured cost: under 1% of the training time
# at this period (BENCHMARKS.md, "Conditioning tracking on the paper's configs").
condinit_analysis.period = 10000
condinit_analysis.sites = [
    "backbone.layers.0.blocks.0.attn",
    "backbone.layers.2.blocks.8.attn",
    "backbone.layers.3.blocks.1.attn",
    "transformer.encoder.layers.0.self_attn",
    "transformer.encoder.layers.5.self_attn",
    "transformer.decoder.layers.5.self_attn",
    "transformer.decoder.layers.5.cross_attn",
]
# detectron2's SwinTransformer.size_divisibility property fails (it reads a misspelled attribute),
# so the stride of its last stage is given here.
model.size_divisibility = 32
