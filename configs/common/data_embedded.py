# Dataloaders for the embedded "shapes" dataset (condinit_det.data): 128x128 synthetic images with
# five shape categories, partial occlusion and clutter. The dataset is generated on first use into
# $CONDINIT_DATA/shapes-v1 (default ~/.cache/condinit_det/shapes-v1) and registered as
# condinit_shapes_train / condinit_shapes_val.
from omegaconf import OmegaConf

import detectron2.data.transforms as T
from detectron2.config import LazyCall as L
from detectron2.data import DatasetMapper, build_detection_test_loader, build_detection_train_loader

from condinit_det.data import DATASET_NAMES, SHAPE_CLASSES, get_embedded_dataset_dicts, register_embedded_datasets
from condinit_det.evaluation import FastCOCOEvaluator

# Registered at load time so the evaluator (which looks the dataset up by name) finds it too.
register_embedded_datasets()

NUM_CLASSES = len(SHAPE_CLASSES)
IMAGE_SIZE = 128

dataloader = OmegaConf.create()

dataloader.train = L(build_detection_train_loader)(
    dataset=L(get_embedded_dataset_dicts)(names=DATASET_NAMES[0]),
    mapper=L(DatasetMapper)(
        is_train=True,
        # Images are already IMAGE_SIZE square; the shapes look alike under both flips.
        augmentations=[L(T.RandomFlip)(horizontal=True), L(T.RandomFlip)(horizontal=False, vertical=True)],
        image_format="RGB",
        use_instance_mask=True,
        # Occluded shapes can have holes, so masks are stored as RLE and kept as bitmasks.
        instance_mask_format="bitmask",
    ),
    total_batch_size=4,
    # Decoding a 128x128 PNG is far cheaper than a training step; worker processes only add overhead.
    num_workers=0,
)

dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_embedded_dataset_dicts)(names=DATASET_NAMES[1], filter_empty=False),
    mapper=L(DatasetMapper)(
        is_train=False,
        augmentations=[],
        image_format="${...train.mapper.image_format}",
    ),
    batch_size=8,
    num_workers=0,
)

dataloader.evaluator = L(FastCOCOEvaluator)(
    dataset_name="${..test.dataset.names}",
    tasks=("bbox", "segm"),
    max_dets_per_image=100,
)
