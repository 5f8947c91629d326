# DETR-style detector with instance masks on COCO, Swin-B backbone, DETR's recipe (see
# detr_vitdet_b.py for the schedule, optimizer and augmentation, which are shared).
# The transformer reads Swin's stride-32 stage (p3, 1024 channels); the mask head adds the
# stride-16/8/4 stages (p2, p1, p0) while upsampling.
#
# Arm placement (condinit): by default every attention site — Swin's window attention
# ("backbone.*") and the transformer ("transformer.*"). Backbone only:
# condinit.include='["backbone.*"]'; transformer only: condinit.include='["transformer.*"]'.
from detectron2.config import LazyCall as L
from detectron2.modeling import SwinTransformer

from .detr_vitdet_b import condinit, dataloader, lr_multiplier, model, optimizer, train

model.backbone = L(SwinTransformer)(
    embed_dim=128,
    depths=(2, 2, 18, 2),
    num_heads=(4, 8, 16, 32),
    window_size=7,
    mlp_ratio=4.0,
    drop_path_rate=0.3,
    out_indices=(0, 1, 2, 3),
)
model.in_feature = "p3"
model.mask_in_features = ["p2", "p1", "p0"]
model.mask_head.fpn_channels = [512, 256, 128]

optimizer.params.overrides = {
    "relative_position_bias_table": {"weight_decay": 0.0},
}
train.output_dir = "./output/COCO/detr_swin_b"
# detectron2's SwinTransformer.size_divisibility property fails (it reads a misspelled attribute),
# so the stride of its last stage is given here.
model.size_divisibility = 32
