"""yacs config keys of condinit-det (detectron2's ``get_cfg()`` / yaml workflow): the arm, the backbones of
:mod:`condinit_det.modeling.backbones`, the optimizer and the trackers. Usage: ``cfg = get_cfg();
add_condinit_config(cfg); cfg.merge_from_file(...); build_model(cfg)``; see docs/configs.md.
"""

import torch
from detectron2.config import CfgNode as CN
from detectron2.solver.build import get_default_optimizer_params, maybe_add_gradient_clipping

from ..init.options import ARM_OPTIONS, arm_keywords
from ..tracking.settings import DEFAULTS as TRACKER_DEFAULTS

__all__ = ["add_condinit_config", "build_optimizer", "condinit_options"]

OPTIMIZERS = ("SGD", "ADAMW")

# The arms' options under MODEL.CONDINIT: apply_init's keywords in upper case (mimetic's solver has no key).
_OPTION_KEYS = tuple(dict.fromkeys(key.upper() for arm in ARM_OPTIONS.values() for key in arm if key != "solver"))


def add_condinit_config(cfg: CN) -> CN:
    """Add condinit-det's keys to a detectron2 yacs config in place, once (existing values are kept); returns it."""
    if "CONDINIT" in cfg.MODEL:
        return cfg

    cfg.MODEL.CONDINIT = CN()
    # False: the builders do not call apply_init at all (the stock constructor init).
    cfg.MODEL.CONDINIT.ENABLED = True
    # "default" | "mimetic" | "conditioned" | "scale_matched" | "structured" (condinit_det.init.ARMS)
    cfg.MODEL.CONDINIT.ARM = "default"
    # Seed of the arm's own generator; the global RNG is never advanced.
    cfg.MODEL.CONDINIT.SEED = 0
    # fnmatch patterns on site names as they appear in the full model (e.g. "backbone.net.*");
    # empty list: every attention site of the backbone.
    cfg.MODEL.CONDINIT.INCLUDE = []
    cfg.MODEL.CONDINIT.EXCLUDE = []
    # The arms' options (docs/arms.md#options; scale_matched and structured take GAIN_QK, GAIN_V and VALUE_MODE
    # from the conditioned arm, which they control for). None: the arm's default.
    for key in _OPTION_KEYS:
        setattr(cfg.MODEL.CONDINIT, key, None)

    # The backbone nodes' keys are their constructors' keyword arguments, in upper case.
    # Plain ViT (detectron2.modeling.ViT) for build_condinit_vit_backbone.
    cfg.MODEL.VIT = CN()
    cfg.MODEL.VIT.IMG_SIZE = 1024  # input size; sizes the relative-position tables of global blocks
    cfg.MODEL.VIT.PRETRAIN_IMG_SIZE = 224  # grid of the absolute position embedding (interpolated)
    cfg.MODEL.VIT.PATCH_SIZE = 16
    cfg.MODEL.VIT.EMBED_DIM = 768
    cfg.MODEL.VIT.DEPTH = 12
    cfg.MODEL.VIT.NUM_HEADS = 12
    cfg.MODEL.VIT.MLP_RATIO = 4.0
    cfg.MODEL.VIT.QKV_BIAS = True
    cfg.MODEL.VIT.DROP_PATH_RATE = 0.1
    cfg.MODEL.VIT.WINDOW_SIZE = 14
    cfg.MODEL.VIT.WINDOW_BLOCK_INDEXES = [0, 1, 3, 4, 6, 7, 9, 10]
    cfg.MODEL.VIT.USE_REL_POS = True
    cfg.MODEL.VIT.USE_ACT_CHECKPOINT = False

    # Swin (detectron2.modeling.SwinTransformer) + FPN for build_condinit_swin_fpn_backbone.
    cfg.MODEL.SWIN = CN()
    cfg.MODEL.SWIN.EMBED_DIM = 96
    cfg.MODEL.SWIN.DEPTHS = [2, 2, 6, 2]
    cfg.MODEL.SWIN.NUM_HEADS = [3, 6, 12, 24]
    cfg.MODEL.SWIN.WINDOW_SIZE = 7
    cfg.MODEL.SWIN.MLP_RATIO = 4.0
    cfg.MODEL.SWIN.QKV_BIAS = True
    cfg.MODEL.SWIN.DROP_PATH_RATE = 0.2
    cfg.MODEL.SWIN.APE = False
    cfg.MODEL.SWIN.PATCH_NORM = True
    cfg.MODEL.SWIN.OUT_FEATURES = ["p0", "p1", "p2", "p3"]  # stages p0..p3 = strides 4..32
    cfg.MODEL.SWIN.USE_CHECKPOINT = False

    # XCiT (condinit_det.modeling.xcit.XCiT) for build_condinit_xcit_backbone; XCiT-S12/16 here.
    cfg.MODEL.XCIT = CN()
    cfg.MODEL.XCIT.PATCH_SIZE = 16
    cfg.MODEL.XCIT.EMBED_DIM = 384
    cfg.MODEL.XCIT.DEPTH = 12
    cfg.MODEL.XCIT.NUM_HEADS = 8
    cfg.MODEL.XCIT.MLP_RATIO = 4.0
    cfg.MODEL.XCIT.QKV_BIAS = True
    cfg.MODEL.XCIT.ETA = 1.0
    cfg.MODEL.XCIT.DROP_PATH_RATE = 0.05
    cfg.MODEL.XCIT.SYNC_BN = False
    cfg.MODEL.XCIT.USE_ACT_CHECKPOINT = False

    # Simple feature pyramid on single-scale (ViT / XCiT) outputs; channels: MODEL.FPN.OUT_CHANNELS.
    cfg.MODEL.SIMPLE_FPN = CN()
    cfg.MODEL.SIMPLE_FPN.SCALE_FACTORS = [4.0, 2.0, 1.0, 0.5]
    cfg.MODEL.SIMPLE_FPN.NORM = "LN"
    cfg.MODEL.SIMPLE_FPN.SQUARE_PAD = 0  # > 0: pad inputs to this square size (ViTDet LSJ: 1024)
    cfg.MODEL.SIMPLE_FPN.TOP_BLOCK = True  # add a max-pooled level after the coarsest one

    # Multiplier already applied to BASE_LR by tools/train_net.py --lr-scale (recorded with the results).
    cfg.SOLVER.LR_SCALE = 1.0
    cfg.SOLVER.OPTIMIZER = "SGD"
    cfg.SOLVER.BETAS = (0.9, 0.999)  # ADAMW only
    # Parameter names (last component, e.g. "relative_position_bias_table") without weight decay.
    cfg.SOLVER.NO_WEIGHT_DECAY_KEYS = []

    # W&B and MLflow (condinit_det.tracking; the lazy configs' train.trackers), off by default.
    cfg.TRACKERS = CN()
    for name, defaults in TRACKER_DEFAULTS.items():
        node = CN()
        for key, value in defaults.items():
            setattr(node, key.upper(), value)
        setattr(cfg.TRACKERS, name.upper(), node)
    return cfg


def build_optimizer(cfg: CN, model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD or AdamW per ``SOLVER.OPTIMIZER``, with detectron2's parameter groups and gradient clipping.

    Norm layers use ``SOLVER.WEIGHT_DECAY_NORM``, biases ``SOLVER.BIAS_LR_FACTOR`` /
    ``WEIGHT_DECAY_BIAS``, and parameters named in ``SOLVER.NO_WEIGHT_DECAY_KEYS`` no weight decay.
    """
    name = str(cfg.SOLVER.OPTIMIZER).upper()
    if name not in OPTIMIZERS:
        raise ValueError(f"SOLVER.OPTIMIZER={cfg.SOLVER.OPTIMIZER!r} is not supported; accepted: {OPTIMIZERS}")
    params = get_default_optimizer_params(
        model,
        base_lr=cfg.SOLVER.BASE_LR,
        weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_NORM,
        bias_lr_factor=cfg.SOLVER.BIAS_LR_FACTOR,
        weight_decay_bias=cfg.SOLVER.WEIGHT_DECAY_BIAS,
        overrides={key: {"weight_decay": 0.0} for key in cfg.SOLVER.NO_WEIGHT_DECAY_KEYS},
    )
    if name == "SGD":
        return maybe_add_gradient_clipping(cfg, torch.optim.SGD)(
            params,
            lr=cfg.SOLVER.BASE_LR,
            momentum=cfg.SOLVER.MOMENTUM,
            nesterov=cfg.SOLVER.NESTEROV,
            weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        )
    return maybe_add_gradient_clipping(cfg, torch.optim.AdamW)(
        params, lr=cfg.SOLVER.BASE_LR, betas=tuple(cfg.SOLVER.BETAS), weight_decay=cfg.SOLVER.WEIGHT_DECAY
    )


def condinit_options(node: CN) -> dict:
    """``apply_init`` keyword options of ``node.ARM`` from a ``MODEL.CONDINIT`` node: the keys that are set and that
    arm accepts, so that ``--arm all`` runs leave the other arms' options alone (conditioned and its controls share
    GAIN_QK, GAIN_V and VALUE_MODE)."""
    accepted = arm_keywords(node.ARM)
    return {key.lower(): node[key] for key in _OPTION_KEYS if node.get(key) is not None and key.lower() in accepted}
