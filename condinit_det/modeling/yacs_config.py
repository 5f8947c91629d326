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
    _C = cfg
    if "CONDINIT" in _C.MODEL:
        return cfg

    _C.MODEL.CONDINIT = CN()
    # False: the builders do not call apply_init at all (the stock constructor init).
    _C.MODEL.CONDINIT.ENABLED = True
    # "default" | "mimetic" | "conditioned" | "scale_matched" | "structured" (condinit_det.init.ARMS)
    _C.MODEL.CONDINIT.ARM = "default"
    # Seed of the arm's own generator; the global RNG is never advanced.
    _C.MODEL.CONDINIT.SEED = 0
    # fnmatch patterns on site names as they appear in the full model (e.g. "backbone.net.*");
    # empty list: every attention site of the backbone.
    _C.MODEL.CONDINIT.INCLUDE = []
    _C.MODEL.CONDINIT.EXCLUDE = []
    # conditioned: GAIN_QK, GAIN_V (floats), VALUE_MODE ("identity" | "shared_block"),
    # CONDITION_OUTPUT (bool). mimetic: ALPHA1, BETA1, ALPHA2, BETA2 (floats), NOISE
    # ("normal" | "uniform"). scale_matched and structured: GAIN_QK, GAIN_V, VALUE_MODE (the
    # conditioned arm's, which they control for) and NORM ("frobenius" | "spectral"). None: the arm's default.
    for key in _OPTION_KEYS:
        setattr(_C.MODEL.CONDINIT, key, None)

    # The backbone nodes' keys are their constructors' keyword arguments, in upper case.
    # Plain ViT (detectron2.modeling.ViT) for build_condinit_vit_backbone.
    _C.MODEL.VIT = CN()
    _C.MODEL.VIT.IMG_SIZE = 1024  # input size; sizes the relative-position tables of global blocks
    _C.MODEL.VIT.PRETRAIN_IMG_SIZE = 224  # grid of the absolute position embedding (interpolated)
    _C.MODEL.VIT.PATCH_SIZE = 16
    _C.MODEL.VIT.EMBED_DIM = 768
    _C.MODEL.VIT.DEPTH = 12
    _C.MODEL.VIT.NUM_HEADS = 12
    _C.MODEL.VIT.MLP_RATIO = 4.0
    _C.MODEL.VIT.QKV_BIAS = True
    _C.MODEL.VIT.DROP_PATH_RATE = 0.1
    _C.MODEL.VIT.WINDOW_SIZE = 14
    _C.MODEL.VIT.WINDOW_BLOCK_INDEXES = [0, 1, 3, 4, 6, 7, 9, 10]
    _C.MODEL.VIT.USE_REL_POS = True
    _C.MODEL.VIT.USE_ACT_CHECKPOINT = False

    # Swin (detectron2.modeling.SwinTransformer) + FPN for build_condinit_swin_fpn_backbone.
    _C.MODEL.SWIN = CN()
    _C.MODEL.SWIN.EMBED_DIM = 96
    _C.MODEL.SWIN.DEPTHS = [2, 2, 6, 2]
    _C.MODEL.SWIN.NUM_HEADS = [3, 6, 12, 24]
    _C.MODEL.SWIN.WINDOW_SIZE = 7
    _C.MODEL.SWIN.MLP_RATIO = 4.0
    _C.MODEL.SWIN.QKV_BIAS = True
    _C.MODEL.SWIN.DROP_PATH_RATE = 0.2
    _C.MODEL.SWIN.APE = False
    _C.MODEL.SWIN.PATCH_NORM = True
    _C.MODEL.SWIN.OUT_FEATURES = ["p0", "p1", "p2", "p3"]  # stages p0..p3 = strides 4..32
    _C.MODEL.SWIN.USE_CHECKPOINT = False

    # XCiT (condinit_det.modeling.xcit.XCiT) for build_condinit_xcit_backbone; XCiT-S12/16 here.
    _C.MODEL.XCIT = CN()
    _C.MODEL.XCIT.PATCH_SIZE = 16
    _C.MODEL.XCIT.EMBED_DIM = 384
    _C.MODEL.XCIT.DEPTH = 12
    _C.MODEL.XCIT.NUM_HEADS = 8
    _C.MODEL.XCIT.MLP_RATIO = 4.0
    _C.MODEL.XCIT.QKV_BIAS = True
    _C.MODEL.XCIT.ETA = 1.0
    _C.MODEL.XCIT.DROP_PATH_RATE = 0.05
    _C.MODEL.XCIT.SYNC_BN = False
    _C.MODEL.XCIT.USE_ACT_CHECKPOINT = False

    # Simple feature pyramid on single-scale (ViT / XCiT) outputs; channels: MODEL.FPN.OUT_CHANNELS.
    _C.MODEL.SIMPLE_FPN = CN()
    _C.MODEL.SIMPLE_FPN.SCALE_FACTORS = [4.0, 2.0, 1.0, 0.5]
    _C.MODEL.SIMPLE_FPN.NORM = "LN"
    _C.MODEL.SIMPLE_FPN.SQUARE_PAD = 0  # > 0: pad inputs to this square size (ViTDet LSJ: 1024)
    _C.MODEL.SIMPLE_FPN.TOP_BLOCK = True  # add a max-pooled level after the coarsest one

    # Multiplier already applied to BASE_LR by tools/train_net.py --lr-scale (recorded with the results).
    _C.SOLVER.LR_SCALE = 1.0
    _C.SOLVER.OPTIMIZER = "SGD"
    _C.SOLVER.BETAS = (0.9, 0.999)  # ADAMW only
    # Parameter names (last component, e.g. "relative_position_bias_table") without weight decay.
    _C.SOLVER.NO_WEIGHT_DECAY_KEYS = []

    # W&B and MLflow (condinit_det.tracking; the lazy configs' train.trackers), off by default.
    _C.TRACKERS = CN()
    for name, defaults in TRACKER_DEFAULTS.items():
        node = CN()
        for key, value in defaults.items():
            setattr(node, key.upper(), value)
        setattr(_C.TRACKERS, name.upper(), node)
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
