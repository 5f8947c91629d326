"""detectron2-facing modeling code. Importing it registers the project's backbones and meta-archs."""
from . import backbones  # noqa: F401  (yacs BACKBONE_REGISTRY builders)
from .arm import armed, build_armed, rank0_computes_arm
from .detr import DETRInstanceSeg  # registers the DETR-style meta-architecture
from .xcit import XCiT, convert_timm_xcit_checkpoint

__all__ = ["DETRInstanceSeg", "XCiT", "armed", "build_armed", "convert_timm_xcit_checkpoint", "rank0_computes_arm"]
