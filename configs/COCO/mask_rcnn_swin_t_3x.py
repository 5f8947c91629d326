# Swin-T Mask R-CNN with FPN on COCO, the Swin 3x recipe: multi-scale training with random crops,
# AdamW (lr 1e-4, weight decay 0.05, none on norms, relative position bias tables and the absolute
# position embedding), 36 epochs at 16 images per iteration, LR x0.1 at epochs 27 and 33.
#
# Trained from random initialization so the attention-init arm decides how every attention block
# starts. To start from an ImageNet Swin checkpoint instead, set train.init_checkpoint to the
# official swin_tiny_patch4_window7_224.pth with `?matching_heuristics=True` (its keys lack the
# `backbone.bottom_up.` prefix); the checkpoint then overwrites the arm for the weights it holds.
#
# Arm: "default" (Swin's init, truncated normal std 0.02). Select another with
# `condinit.arm=conditioned` / `condinit.arm=mimetic`, or all three with `--arm all`.
from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling import SwinTransformer

from condinit_det.modeling import armed

from ..common.coco_loader_multiscale_crop import dataloader
from ..common.coco_schedule_epochs import multistep_epochs
from ..common.condinit import condinit, condinit_analysis
from ..common.trackers import trackers

model = armed(model_zoo.get_config("common/models/mask_rcnn_fpn.py").model)
model.backbone.bottom_up = L(SwinTransformer)(
    embed_dim=96,
    depths=(2, 2, 6, 2),
    num_heads=(3, 6, 12, 24),
    window_size=7,
    mlp_ratio=4.0,
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
)
# Swin stages p0..p3 have strides 4..32; FPN names its outputs p2..p6 from the strides.
model.backbone.in_features = ("p0", "p1", "p2", "p3")
# Swin is trained on ImageNet-normalized RGB.
model.pixel_mean = [123.675, 116.280, 103.530]
model.pixel_std = [58.395, 57.120, 57.375]
model.input_format = "RGB"

# Attention sites: backbone.bottom_up.layers.{stage}.blocks.{i}.attn (windowed, fused qkv).
condinit.arm = "default"
condinit.include = ["backbone.bottom_up.*"]

train = model_zoo.get_config("common/train.py").train
train.amp.enabled = True
train.init_checkpoint = ""
train.output_dir = "./output/COCO/mask_rcnn_swin_t_3x"
train.trackers = trackers  # W&B / MLflow switches, off
train.max_iter, lr_multiplier = multistep_epochs(
    epochs=36, milestone_epochs=(27, 33), images_per_batch=dataloader.train.total_batch_size, warmup_iters=500
)
train.checkpointer.period = 10000
train.eval_period = 10000

optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.lr = 1e-4
optimizer.weight_decay = 0.05
optimizer.params.overrides = {
    "relative_position_bias_table": {"weight_decay": 0.0},
    "absolute_pos_embed": {"weight_decay": 0.0},
}
