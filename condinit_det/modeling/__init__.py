"""detectron2-facing modeling code. Importing it registers the project's backbones and meta-archs."""
from .arm import ARM_REPORT_FILE, apply_arm_config, init_arm

__all__ = ["ARM_REPORT_FILE", "apply_arm_config", "init_arm"]
