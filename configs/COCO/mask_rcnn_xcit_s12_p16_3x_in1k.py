# XCiT-S12/16 Mask R-CNN on COCO fine-tuned from an ImageNet-1k XCiT of the same arm: the paper's
# COCO experiment, in XCiT's own detection recipe (facebookresearch/xcit, detection/, mmdetection):
#   - backbone: XCiT-S12/16 (embed 384, depth 12, 8 heads, LayerScale eta 1.0, drop path 0.05);
#   - neck: XCiT's own (condinit_det.modeling.xcit.XCiTDeconvPyramid): blocks 3, 5, 7, 11 at stride
#     16 -> strides 4 (deconv-BN-GELU-deconv), 8 (deconv), 16 (identity), 32 (max-pool), then a
#     standard FPN (256 channels, p2-p6) and the standard Mask R-CNN FPN heads (RoIAlign 7 / 14,
#     sampling ratio 0, 2fc box head, 4conv mask head);
#   - Swin's 3x recipe: AdamW lr 1e-4, weight decay 0.05 (none on norms), 36 epochs at 16 images per
#     iteration, LR x0.1 at epochs 27 and 33, AMP; flip + multi-scale resize (480-800) or
#     resize/crop/resize augmentation; ImageNet mean/std in RGB.
#
# Numbers to expect (box AP / mask AP, COCO val2017):
#   - XCiT's repo, XCiT-S12/16 from its distilled 384-px ImageNet weights: 45.3 / 40.8;
#   - the paper (XCiT + Mask R-CNN, default -> conditioned arm): 44.9 / 40.1 -> 45.5 / 40.6.
# The arm acts in the ImageNet stage: each arm's detector starts from that arm's pretrained
# backbone. train.init_checkpoint names the pretraining run ({arm} and {seed} are filled in with
# this run's arm and seed); the timm checkpoint found there is converted with
# condinit_det.modeling.convert.convert_timm_checkpoint (trunk at backbone.bottom_up.net; class
# attention, final norm and head dropped; the neck, FPN and heads keep their init).
# The attention-init arm is still applied when the model is built, so XCA blocks the checkpoint
# does not hold (none, for a matching XCiT-S12/16) would keep it.
#
# configs/COCO/mask_rcnn_xcit_s12_3x.py is the from-scratch variant (ViTDet's simple feature
# pyramid on the last block, no ImageNet stage), where the arm acts in the detection run itself.
#
# Attention sites: backbone.bottom_up.net.blocks.{0..11}.attn (timm XCA, fused qkv).
# Arm: "default". Select another with `condinit.arm=conditioned` / `condinit.arm=mimetic`.
from detectron2 import model_zoo
from detectron2.config import LazyCall as L

from condinit_det.modeling import armed
from condinit_det.modeling.xcit import XCiTDeconvPyramid

from .mask_rcnn_xcit_s12_3x import condinit, condinit_analysis, dataloader, lr_multiplier, optimizer, train
from .mask_rcnn_xcit_s12_3x import model as _from_scratch

# The XCiT-S12/16 trunk of the from-scratch config, emitting blocks 3, 5, 7 and 11.
_trunk = _from_scratch.backbone.net
_trunk.out_indices = (3, 5, 7, 11)

model = armed(model_zoo.get_config("common/models/mask_rcnn_fpn.py").model)
model.backbone.bottom_up = L(XCiTDeconvPyramid)(
    net=_trunk,
    # XCiT's neck uses SyncBatchNorm after its first deconvolution.
    sync_bn=True,
    out_features=("s4", "s8", "s16", "s32"),
)
# FPN (256 channels, LastLevelMaxPool for p6) on the four neck outputs: p2..p6 at strides 4..64.
model.backbone.in_features = ("s4", "s8", "s16", "s32")
# XCiT is trained on ImageNet-normalized RGB.
model.pixel_mean = _from_scratch.pixel_mean
model.pixel_std = _from_scratch.pixel_std
model.input_format = "RGB"

condinit.arm = "default"
condinit.include = ["backbone.bottom_up.net.*"]
# Conditioning tracking as in the from-scratch config (same blocks and period; the trunk sits under
# backbone.bottom_up here).
condinit_analysis.sites = [
    "backbone.bottom_up.net.blocks.0.attn",
    "backbone.bottom_up.net.blocks.6.attn",
    "backbone.bottom_up.net.blocks.11.attn",
]

train.init_checkpoint = "output/imagenet/xcit_s12_p16_400ep/{arm}/seed{seed}"
train.output_dir = "./output/COCO/mask_rcnn_xcit_s12_p16_3x_in1k"
# XCiT has no relative position bias tables or absolute position embedding (as in the base config).
optimizer.params.overrides = {}
