"""Embedded synthetic instance-segmentation data ("shapes") for CPU demos and tests."""
from .embedded import (
    DATASET_NAMES,
    DATASET_VERSION,
    default_root,
    embedded_dataset_info,
    generate_shapes_dataset,
    get_embedded_dataset_dicts,
    register_embedded_datasets,
)
from .shapes import SHAPE_CLASSES, ShapesSpec, render_image

__all__ = [
    "DATASET_NAMES",
    "DATASET_VERSION",
    "SHAPE_CLASSES",
    "ShapesSpec",
    "default_root",
    "embedded_dataset_info",
    "generate_shapes_dataset",
    "get_embedded_dataset_dicts",
    "register_embedded_datasets",
    "render_image",
]
