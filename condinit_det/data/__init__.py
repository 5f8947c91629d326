"""The embedded datasets, generated on first use so that demos and tests need no download: the synthetic ``shapes``
and ``shapes-cls``, the real digits ``digits-det`` and ``digits-cls``, their cache (:mod:`.cache`) and their one
registry (:mod:`.embedded`).
"""

from .digits import CLASSES as DIGIT_CLASSES
from .digits import generate_digits_cls_dataset, generate_digits_det_dataset
from .embedded import (
    DATASET_NAMES,
    DIGITS_DATASET_NAMES,
    EMBEDDED_DATASETS,
    embedded_dataset_info,
    get_embedded_dataset_dicts,
    register_embedded_datasets,
    resolve_classification_root,
)
from .shapes import SHAPE_CLASSES, ShapesSpec, generate_shapes_dataset, render_image

__all__ = [
    "DATASET_NAMES",
    "DIGITS_DATASET_NAMES",
    "DIGIT_CLASSES",
    "EMBEDDED_DATASETS",
    "SHAPE_CLASSES",
    "ShapesSpec",
    "embedded_dataset_info",
    "generate_digits_cls_dataset",
    "generate_digits_det_dataset",
    "generate_shapes_dataset",
    "get_embedded_dataset_dicts",
    "register_embedded_datasets",
    "render_image",
    "resolve_classification_root",
]
