# COCO dataloaders of the Swin / XCiT Mask R-CNN 3x recipe: horizontal flip, then with
# probability 0.5 a random crop (shorter side first resized to 400/500/600, crop of 384-600 px),
# then the shorter side resized to one of 480, 512, ..., 800 (longer side <= 1333);
# 16 images per iteration. Test: shorter side 800, longer side <= 1333. Images are RGB.
import detectron2.data.transforms as T
from detectron2 import model_zoo
from detectron2.config import LazyCall as L

from condinit_det.evaluation import FastCOCOEvaluator

dataloader = model_zoo.get_config("common/data/coco.py").dataloader
dataloader.train.mapper.augmentations = [
    L(T.RandomFlip)(horizontal=True),
    L(T.RandomApply)(
        tfm_or_aug=L(T.AugmentationList)(
            augs=[
                L(T.ResizeShortestEdge)(short_edge_length=(400, 500, 600), sample_style="choice"),
                L(T.RandomCrop)(crop_type="absolute_range", crop_size=(384, 600)),
            ]
        ),
        prob=0.5,
    ),
    L(T.ResizeShortestEdge)(short_edge_length=tuple(range(480, 801, 32)), max_size=1333, sample_style="choice"),
]
dataloader.train.mapper.image_format = "RGB"
# Cropping cuts instances: recompute their boxes from the cropped masks.
dataloader.train.mapper.recompute_boxes = True
dataloader.train.total_batch_size = 16

# Test resize (800, max 1333) is detectron2's default; only the image format changes.

# Same numbers as detectron2's COCOEvaluator, computed with faster-coco-eval.
dataloader.evaluator = L(FastCOCOEvaluator)(dataset_name="${..test.dataset.names}")
