"""DETR-style detector with instance masks; importing this package registers
``DETRInstanceSeg`` in detectron2's META_ARCH_REGISTRY."""

from .criterion import SetCriterion
from .matcher import HungarianMatcher
from .meta_arch import DETRInstanceSeg
from .position_encoding import PositionEmbeddingSine
from .segmentation import MaskHead
from .transformer import Transformer

__all__ = ["DETRInstanceSeg", "HungarianMatcher", "MaskHead", "PositionEmbeddingSine", "SetCriterion", "Transformer"]
