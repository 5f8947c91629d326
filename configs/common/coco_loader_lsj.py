# COCO dataloaders with large-scale jitter (LSJ), the ViTDet recipe: flip, rescale a 1024x1024
# target by a random factor in [0.1, 2.0], crop (or leave smaller) to 1024x1024; 64 images per
# iteration. Test images are resized so the longer side is 1024. Images are RGB.
import detectron2.data.transforms as T
from detectron2 import model_zoo
from detectron2.config import LazyCall as L

from condinit_det.evaluation import FastCOCOEvaluator

image_size = 1024

dataloader = model_zoo.get_config("common/data/coco.py").dataloader
dataloader.train.mapper.augmentations = [
    L(T.RandomFlip)(horizontal=True),
    L(T.ResizeScale)(min_scale=0.1, max_scale=2.0, target_height=image_size, target_width=image_size),
    L(T.FixedSizeCrop)(crop_size=(image_size, image_size), pad=False),
]
dataloader.train.mapper.image_format = "RGB"
# Cropping cuts instances: recompute their boxes from the cropped masks.
dataloader.train.mapper.recompute_boxes = True
dataloader.train.total_batch_size = 64

dataloader.test.mapper.augmentations = [
    L(T.ResizeShortestEdge)(short_edge_length=image_size, max_size=image_size),
]

# Same numbers as detectron2's COCOEvaluator, computed with faster-coco-eval.
dataloader.evaluator = L(FastCOCOEvaluator)(dataset_name="${..test.dataset.names}")
