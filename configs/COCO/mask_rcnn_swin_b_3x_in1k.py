# Swin-B Mask R-CNN with FPN on COCO fine-tuned from an ImageNet-1k Swin-B of the same arm (timm
# swin_base_patch4_window7_224 pretrained with each attention-init arm), in the published Swin
# fine-tuning recipe (SwinTransformer/Swin-Transformer-Object-Detection, 3x multi-scale-crop
# AdamW recipe; Swin-B uses stochastic depth 0.3, Swin-T / Swin-S 0.2): AdamW lr 1e-4, weight
# decay 0.05 (none on norms and relative position bias tables), 36 epochs at 16 images per
# iteration, LR x0.1 at epochs 27 and 33, flip + multi-scale resize (480-800) or
# resize/crop/resize, window 7, patch norm, no absolute position embedding. All of it is already
# in mask_rcnn_swin_b_3x.py, which uses the fine-tuning recipe from random initialization; only
# the starting weights differ here.
#
# train.init_checkpoint names the pretraining run ({arm} and {seed} are filled in with this run's
# arm and seed); its timm checkpoint is converted with
# condinit_det.modeling.convert.convert_timm_checkpoint (trunk at backbone.bottom_up): PatchMerging
# moved from the start of stage i (timm) to the end of stage i-1 (detectron2), relative position
# bias tables copied, timm's final norm -> norm3, head dropped; norm0-norm2 (per-output norms,
# detection only) keep their init.
#
# Attention sites: backbone.bottom_up.layers.{stage}.blocks.{i}.attn. Arm: "default"; select
# another with `condinit.arm=conditioned` / `condinit.arm=mimetic`. Conditioning tracking
# (condinit_analysis): the sites and period of mask_rcnn_swin_b_3x.py.
from .mask_rcnn_swin_b_3x import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.drop_path_rate = 0.3  # Swin-B's published value (as in the base config)

train.init_checkpoint = "output/imagenet/swin_b_300ep/{arm}/seed{seed}"
train.output_dir = "./output/COCO/mask_rcnn_swin_b_3x_in1k"
