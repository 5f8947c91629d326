"""detectron2-facing modeling code. Importing it registers the project's backbones and meta-archs."""

from . import backbones  # noqa: F401  (yacs BACKBONE_REGISTRY builders)
from .arm import armed, build_armed, rank0_computes_arm
from .convert import ConvertedCheckpoint, convert_timm_checkpoint
from .detr import DETRInstanceSeg  # registers the DETR-style meta-architecture
from .xcit import XCiT, XCiTDeconvPyramid

__all__ = [
    "ConvertedCheckpoint",
    "DETRInstanceSeg",
    "XCiT",
    "XCiTDeconvPyramid",
    "armed",
    "build_armed",
    "convert_timm_checkpoint",
    "rank0_computes_arm",
]
