"""The embedded datasets, generated on first use so that demos and tests need no download.

Owns the synthetic ``shapes`` (detection, :mod:`.shapes`) and ``shapes-cls`` (classification,
:mod:`.classification`), the real handwritten digits that scikit-learn ships as ``digits-det`` and ``digits-cls``
(:mod:`.digits`), the versioned, atomic cache under ``$CONDINIT_DATA`` they share (:mod:`.cache`), and the one
registry of them all with detectron2's catalog and ``data.root="embedded:<name>"`` (:mod:`.embedded`).
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
