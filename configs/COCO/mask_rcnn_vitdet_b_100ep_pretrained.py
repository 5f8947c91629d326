# ViTDet-B Mask R-CNN on COCO, 100-epoch LSJ recipe, backbone initialized from the MAE ImageNet
# checkpoint (ViTDet's published setting).
#
# The arm is applied when the model is built, before the checkpoint is loaded, so every weight
# the checkpoint holds (all backbone attention projections included) is overwritten by it: the
# arm survives only in weights the checkpoint lacks. This config is the pretrained reference
# point, not an arm comparison; compare arms with mask_rcnn_vitdet_b_100ep.py.
#
# Arm: "default".
from .mask_rcnn_vitdet_b_100ep import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

train.init_checkpoint = "detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_base.pth?matching_heuristics=True"
train.output_dir = "./output/COCO/mask_rcnn_vitdet_b_100ep_pretrained"
