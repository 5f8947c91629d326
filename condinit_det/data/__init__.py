"""The embedded datasets, generated on first use so that demos and tests need no download.

Owns: the synthetic "shapes" instance-segmentation data (:mod:`.shapes` renders, :mod:`.embedded` writes COCO
and registers ``condinit_shapes_{train,val}`` with detectron2), its classification twin ``shapes-cls``
(:mod:`.classification`, which also resolves every ``data.root="embedded:<name>"`` of the pretraining stage),
the real handwritten digits that scikit-learn ships, as ``digits-cls`` and ``digits-det``
(:mod:`.digits`, detectron2 names ``condinit_digits_{train,val}``), and the versioned, atomic cache under
``$CONDINIT_DATA`` they all share (:mod:`.cache`).
"""
from . import digits
from .digits import generate_digits_cls_dataset, generate_digits_det_dataset
from .embedded import (
    DATASET_NAMES,
    DATASET_VERSION,
    default_root,
    embedded_dataset_info,
    embedded_detection_names,
    generate_shapes_dataset,
    get_embedded_dataset_dicts,
    register_embedded_datasets,
)
from .shapes import SHAPE_CLASSES, ShapesSpec, render_image

# The digits' detectron2 names (train, val) and classes ("0".."9"), under names that say whose they are.
DIGITS_DATASET_NAMES = digits.DET_DATASET_NAMES
DIGIT_CLASSES = digits.CLASSES

__all__ = [
    "DATASET_NAMES",
    "DATASET_VERSION",
    "DIGITS_DATASET_NAMES",
    "DIGIT_CLASSES",
    "SHAPE_CLASSES",
    "ShapesSpec",
    "default_root",
    "digits",
    "embedded_dataset_info",
    "embedded_detection_names",
    "generate_digits_cls_dataset",
    "generate_digits_det_dataset",
    "generate_shapes_dataset",
    "get_embedded_dataset_dicts",
    "register_embedded_datasets",
    "render_image",
]
