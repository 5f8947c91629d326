# A minimal lazy config for the training-entry-point tests: a two-block ViT + SimpleFeaturePyramid
# (patch 16, feature pyramid p2-p6) Mask R-CNN on six generated 64x64 images (rectangles of two classes).
# One training step and one evaluation take a few seconds on a CPU core. The images are written on first load into
# $CONDINIT_TINY_DATA (default: <tempdir>/condinit_tiny_data_v1) and registered as
# condinit_tiny_train / condinit_tiny_val.
import json
import os
import tempfile
from functools import partial

import detectron2.data.transforms as T
import numpy as np
import torch.nn as nn
from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.data import (
    DatasetCatalog,
    DatasetMapper,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.data.datasets import register_coco_instances
from detectron2.evaluation import COCOEvaluator
from detectron2.modeling import SimpleFeaturePyramid, ViT
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from fvcore.common.param_scheduler import CosineParamScheduler
from omegaconf import OmegaConf

from condinit_det.modeling import armed

SIZE = 64
ROOT = os.environ.get("CONDINIT_TINY_DATA") or os.path.join(tempfile.gettempdir(), "condinit_tiny_data_v1")


def _make_split(split, num_images, seed):
    import cv2

    ann_path = os.path.join(ROOT, f"{split}.json")
    if os.path.isfile(ann_path):
        return ann_path
    img_dir = os.path.join(ROOT, split)
    os.makedirs(img_dir, exist_ok=True)
    rng = np.random.RandomState(seed)
    images, annotations = [], []
    for i in range(num_images):
        img = np.full((SIZE, SIZE, 3), 30, np.uint8)
        for j in range(2):
            w, h = (int(v) for v in rng.randint(14, 28, size=2))
            x0 = int(rng.randint(0, SIZE - w))
            y0 = 2 if j == 0 else SIZE - h - 2
            cat = j % 2 + 1
            img[y0 : y0 + h, x0 : x0 + w] = (220, 60, 60) if cat == 1 else (60, 220, 60)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": cat,
                    "bbox": [x0, y0, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x0, y0, x0 + w, y0, x0 + w, y0 + h, x0, y0 + h]],
                }
            )
        name = f"{i:03d}.png"
        cv2.imwrite(os.path.join(img_dir, name), img[:, :, ::-1])
        images.append({"id": i + 1, "file_name": name, "width": SIZE, "height": SIZE})
    coco = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "green"}],
    }
    tmp = ann_path + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(coco, f)
    os.replace(tmp, ann_path)
    return ann_path


for _split, _n, _seed in (("train", 4, 0), ("val", 2, 1)):
    _json = _make_split(_split, _n, _seed)
    if f"condinit_tiny_{_split}" not in DatasetCatalog.list():
        register_coco_instances(f"condinit_tiny_{_split}", {}, _json, os.path.join(ROOT, _split))

model = armed(model_zoo.get_config("common/models/mask_rcnn_vitdet.py").model)
model.backbone = L(SimpleFeaturePyramid)(
    net=L(ViT)(
        img_size=SIZE,
        patch_size=16,
        embed_dim=32,
        depth=2,
        num_heads=2,
        drop_path_rate=0.0,
        window_size=2,
        mlp_ratio=2,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        window_block_indexes=[0],
        residual_block_indexes=[],
        use_rel_pos=False,
        pretrain_img_size=SIZE,
        out_feature="last_feat",
    ),
    in_feature="${.net.out_feature}",
    out_channels=16,
    scale_factors=(4.0, 2.0, 1.0, 0.5),
    top_block=L(LastLevelMaxPool)(),
    norm="LN",
    square_pad=SIZE,
)
model.proposal_generator.head.in_channels = 16
model.proposal_generator.head.conv_dims = [-1]
model.proposal_generator.anchor_generator.sizes = [[8], [16], [32], [64], [128]]
model.proposal_generator.batch_size_per_image = 32
model.proposal_generator.pre_nms_topk = (100, 50)
model.proposal_generator.post_nms_topk = (30, 20)
model.roi_heads.num_classes = 2
model.roi_heads.batch_size_per_image = 32
model.roi_heads.box_pooler.output_size = 4
model.roi_heads.box_head.input_shape.channels = 16
model.roi_heads.box_head.input_shape.height = 4
model.roi_heads.box_head.input_shape.width = 4
model.roi_heads.box_head.conv_dims = []
model.roi_heads.box_head.fc_dims = [32]
model.roi_heads.box_head.conv_norm = ""
model.roi_heads.box_predictor.input_shape.channels = 32
model.roi_heads.mask_head.input_shape.channels = 16
model.roi_heads.mask_head.conv_dims = [16]
model.roi_heads.mask_head.conv_norm = ""
model.pixel_mean = [127.0, 127.0, 127.0]
model.pixel_std = [60.0, 60.0, 60.0]
model.input_format = "RGB"

dataloader = OmegaConf.create()
dataloader.train = L(build_detection_train_loader)(
    dataset=L(get_detection_dataset_dicts)(names="condinit_tiny_train"),
    mapper=L(DatasetMapper)(
        is_train=True,
        augmentations=[L(T.RandomFlip)(horizontal=True)],
        image_format="RGB",
        use_instance_mask=True,
    ),
    total_batch_size=2,
    num_workers=0,
)
dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_detection_dataset_dicts)(names="condinit_tiny_val", filter_empty=False),
    mapper=L(DatasetMapper)(is_train=False, augmentations=[], image_format="RGB"),
    batch_size=2,
    num_workers=0,
)
dataloader.evaluator = L(COCOEvaluator)(
    dataset_name="condinit_tiny_val",
    tasks=("bbox", "segm"),
    use_fast_impl=False,
)

optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.lr = 1e-4
optimizer.params.overrides = {"pos_embed": {"weight_decay": 0.0}}

train = model_zoo.get_config("common/train.py").train
train.max_iter = 2
train.eval_period = 2
train.log_period = 1
train.checkpointer = dict(period=1000, max_to_keep=2)
train.device = "cpu"
train.output_dir = "./output/tiny"

# (fvcore's ConstantParamScheduler rejects the final step's where=1.0)
lr_multiplier = L(CosineParamScheduler)(start_value=1.0, end_value=1.0)

condinit = dict(arm="default", seed="${oc.select:train.seed,0}", include=None, exclude=None, options={})
