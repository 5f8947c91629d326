"""detectron2-facing modeling code. Importing it registers the project's backbones and meta-archs."""
from . import backbones  # noqa: F401  (yacs BACKBONE_REGISTRY builders)
from .arm import armed, build_armed, rank0_computes_arm
from .convert import (
    ConvertedCheckpoint,
    checkpoint_architecture,
    convert_timm_checkpoint,
    convert_timm_swin,
    convert_timm_vit,
    convert_timm_xcit_checkpoint,
    find_trunk,
)
from .detr import DETRInstanceSeg  # registers the DETR-style meta-architecture
from .xcit import XCiT, XCiTDeconvPyramid

__all__ = [
    "ConvertedCheckpoint",
    "DETRInstanceSeg",
    "XCiT",
    "XCiTDeconvPyramid",
    "armed",
    "build_armed",
    "checkpoint_architecture",
    "convert_timm_checkpoint",
    "convert_timm_swin",
    "convert_timm_vit",
    "convert_timm_xcit_checkpoint",
    "find_trunk",
    "rank0_computes_arm",
]
