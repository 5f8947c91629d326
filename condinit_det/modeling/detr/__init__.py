"""DETR-style detector with instance masks; importing this package registers
``DETRInstanceSeg`` in detectron2's META_ARCH_REGISTRY."""
from .criterion import SetCriterion, dice_loss
from .matcher import HungarianMatcher
from .meta_arch import DETRInstanceSeg
from .mlp import MLP
from .position_encoding import PositionEmbeddingSine
from .segmentation import MaskAttentionMap, MaskHead
from .transformer import Transformer

__all__ = ["DETRInstanceSeg", "HungarianMatcher", "MaskAttentionMap", "MaskHead", "MLP",
           "PositionEmbeddingSine", "SetCriterion", "Transformer", "dice_loss"]
