"""detectron2-facing modeling code. Importing it registers the project's backbones and meta-archs."""
from . import backbones  # noqa: F401  (yacs BACKBONE_REGISTRY builders)
from .detr import DETRInstanceSeg  # registers the DETR-style meta-architecture
from .arm import ARM_REPORT_FILE, apply_arm_config, init_arm
from .xcit import XCiT, convert_timm_xcit_checkpoint

__all__ = ["ARM_REPORT_FILE", "DETRInstanceSeg", "XCiT", "apply_arm_config", "convert_timm_xcit_checkpoint", "init_arm"]
