"""yacs backbone builders (``MODEL.BACKBONE.NAME``, registered on import) that apply ``MODEL.CONDINIT``'s arm under
the full model's site names (``backbone.net.blocks.0.attn``) before any checkpoint is loaded; the report is kept on
``backbone.condinit_report``. Requires :func:`condinit_det.modeling.yacs_config.add_condinit_config`; see
docs/configs.md.
"""

import logging
import math
from functools import partial

import torch.nn as nn
from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, FPN, Backbone, SimpleFeaturePyramid, SwinTransformer, ViT
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from ..init import apply_init
from ..init.spec import prefixed
from .xcit import XCiT
from .yacs_config import condinit_options

__all__ = [
    "PaddedSimpleFeaturePyramid",
    "build_condinit_swin_fpn_backbone",
    "build_condinit_vit_backbone",
    "build_condinit_xcit_backbone",
]

logger = logging.getLogger(__name__)


def _arguments(cfg, name: str, *, exclude=()) -> dict:
    """``cfg.MODEL.<name>`` (``VIT``, ``SWIN`` or ``XCIT``) as keyword arguments; its keys are the constructor's."""
    if "CONDINIT" not in cfg.MODEL:
        raise KeyError(
            "cfg.MODEL.CONDINIT is missing: call condinit_det.modeling.yacs_config.add_condinit_config(cfg) "
            "before merging the yaml and building the model"
        )
    return {key.lower(): value for key, value in cfg.MODEL[name].items() if key not in exclude}


def _apply_condinit_cfg(cfg, backbone: Backbone) -> Backbone:
    """Apply ``cfg.MODEL.CONDINIT``'s arm to ``backbone`` (as ``model.backbone``); return it."""
    node = cfg.MODEL.CONDINIT
    if not node.ENABLED:
        return backbone
    report = apply_init(
        prefixed(backbone, "backbone."),
        node.ARM,
        seed=node.SEED,
        include=list(node.INCLUDE) or None,
        exclude=list(node.EXCLUDE) or None,
        **condinit_options(node),
    )
    logger.info("Attention init of the backbone: %s", report.summary())
    backbone.condinit_report = report
    return backbone


class PaddedSimpleFeaturePyramid(SimpleFeaturePyramid):
    """detectron2's ``SimpleFeaturePyramid`` that asks for its inputs to be padded to its coarsest stride: detectron2's
    reports ``size_divisibility`` 0 and misspells a key of its ``padding_constraints``, so multi-scale images whose
    sides are not multiples of the patch size reached the trunk unpadded (XCiT refuses them, ViT drops the border)."""

    @property
    def size_divisibility(self) -> int:
        return self._size_divisibility

    @property
    def padding_constraints(self):
        return {"size_divisibility": self._size_divisibility, "square_size": self._square_pad}


def _simple_feature_pyramid(cfg, net: Backbone) -> SimpleFeaturePyramid:
    sfp = cfg.MODEL.SIMPLE_FPN
    in_feature = net._out_features[0]
    top_block = None
    if sfp.TOP_BLOCK:
        top_block = LastLevelMaxPool()
        # Pool the coarsest pyramid level, whatever the scale factors make it (p5 for ViTDet's).
        coarsest = net.output_shape()[in_feature].stride / min(sfp.SCALE_FACTORS)
        top_block.in_feature = f"p{int(math.log2(coarsest))}"
    return PaddedSimpleFeaturePyramid(
        net=net,
        in_feature=in_feature,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        scale_factors=tuple(sfp.SCALE_FACTORS),
        top_block=top_block,
        norm=sfp.NORM,
        square_pad=sfp.SQUARE_PAD,
    )


@BACKBONE_REGISTRY.register()
def build_condinit_vit_backbone(cfg, input_shape: ShapeSpec) -> Backbone:
    """ViTDet backbone (plain ViT + simple feature pyramid) from ``MODEL.VIT`` / ``MODEL.SIMPLE_FPN``."""
    net = ViT(
        in_chans=input_shape.channels,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        out_feature="last_feat",
        **_arguments(cfg, "VIT"),
    )
    return _apply_condinit_cfg(cfg, _simple_feature_pyramid(cfg, net))


@BACKBONE_REGISTRY.register()
def build_condinit_swin_fpn_backbone(cfg, input_shape: ShapeSpec) -> Backbone:
    """Swin + FPN from ``MODEL.SWIN`` / ``MODEL.FPN`` (FPN.IN_FEATURES names Swin stages p0..p3)."""
    arguments = _arguments(cfg, "SWIN", exclude=("OUT_FEATURES",))
    s = cfg.MODEL.SWIN
    stages = [f"p{i}" for i in range(len(s.DEPTHS))]  # detectron2's names of the Swin stages' outputs
    for name in s.OUT_FEATURES:
        if name not in stages:
            raise ValueError(f"MODEL.SWIN.OUT_FEATURES entry {name!r} is not a Swin stage; accepted: {stages}")
    bottom_up = SwinTransformer(
        patch_size=4,
        in_chans=input_shape.channels,
        out_indices=tuple(stages.index(name) for name in s.OUT_FEATURES),
        **arguments,
    )
    backbone = FPN(
        bottom_up=bottom_up,
        in_features=cfg.MODEL.FPN.IN_FEATURES,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=LastLevelMaxPool(),
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )
    return _apply_condinit_cfg(cfg, backbone)


@BACKBONE_REGISTRY.register()
def build_condinit_xcit_backbone(cfg, input_shape: ShapeSpec) -> Backbone:
    """XCiT + simple feature pyramid from ``MODEL.XCIT`` / ``MODEL.SIMPLE_FPN``."""
    net = XCiT(in_chans=input_shape.channels, out_feature="last_feat", **_arguments(cfg, "XCIT"))
    return _apply_condinit_cfg(cfg, _simple_feature_pyramid(cfg, net))
