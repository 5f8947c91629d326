# ViTDet-B Mask R-CNN on COCO fine-tuned from an ImageNet-1k ViT-B/16 of the same arm (timm
# vit_base_patch16_224 pretrained with each attention-init arm), in ViTDet's published COCO
# fine-tuning recipe: detectron2 projects/ViTDet, COCO/mask_rcnn_vitdet_b_100ep.py (Li et al.,
# "Exploring Plain Vision Transformer Backbones for Object Detection", 2022) -- 100 epochs of
# large-scale jitter at 1024 px, 64 images per iteration, AdamW lr 1e-4, weight decay 0.1,
# layer-wise LR decay 0.7, drop path 0.1, windowed attention with 4 global blocks and relative
# positions, simple feature pyramid. All of it is already in mask_rcnn_vitdet_b_100ep.py, which
# uses the fine-tuning recipe from random initialization; only the starting weights differ here.
# That recipe is published for MAE initialization; ViTDet publishes no separate recipe for
# supervised ImageNet initialization, so the same one is used for every arm.
#
# train.init_checkpoint names the pretraining run ({arm} and {seed} are filled in with this run's
# arm and seed); its timm checkpoint is converted with
# condinit_det.modeling.convert.convert_timm_checkpoint (trunk at backbone.net): class token,
# final norm and head dropped, position embeddings kept at the 14x14 pretraining grid
# (pretrain_img_size 224, class slot kept) and interpolated by ViTDet at run time; the relative
# position tables (rel_pos_h / rel_pos_w) are not in timm checkpoints and keep their zero init.
#
# Attention sites: backbone.net.blocks.{0..11}.attn. Arm: "default"; select another with
# `condinit.arm=conditioned` / `condinit.arm=mimetic`.
from .mask_rcnn_vitdet_b_100ep import condinit, condinit_analysis, dataloader, lr_multiplier, model, optimizer, train

# timm's vit_base_patch16_224: 224 px, class token (detectron2's defaults, stated for clarity).
model.backbone.net.pretrain_img_size = 224
model.backbone.net.pretrain_use_cls_token = True

train.init_checkpoint = "output/imagenet/vit_b16_deit_300ep/{arm}/seed{seed}"
train.output_dir = "./output/COCO/mask_rcnn_vitdet_b_100ep_in1k"
