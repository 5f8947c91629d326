"""Pretraining configs: lazy ``.py`` files whose nodes :func:`node` reads with :data:`DEFAULTS` filled in, refusing
unknown keys (``augment.mixpu=0`` is an error, not a silent no-op). Detail: docs/pretraining.md#a-pretraining-config.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional

from .. import model_zoo
from ..analysis.options import ANALYSIS_DEFAULTS
from ..init.spec import ARM_NODE_KEYS, ArmSpec, plain, resolve_arm_node
from ..utils.errors import UsageError

# Defaults follow timm's train.py and the DeiT recipe; each recipe states its own values.
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "model": {
        "name": None,  # a timm model name
        "kwargs": {},  # extra keyword arguments of timm.create_model (drop_path_rate, img_size, ...)
    },
    "data": {
        "root": None,  # ImageFolder root holding <train_split>/ and <val_split>/, or "embedded:<name>"
        "train_split": "train",
        "val_split": "val",
        "num_classes": None,  # must equal the number of class folders
        "num_train_images": None,  # the training split's size, for cost estimates (None: counted on disk)
        "img_size": 224,
        "crop_pct": None,  # evaluation resize/crop ratio (None: the model's default)
        "interpolation": "bicubic",  # evaluation resize
        "mean": None,  # None: the model's (ImageNet's) mean and std
        "std": None,
    },
    "augment": {
        "scale": (0.08, 1.0),  # RandomResizedCrop area range
        "ratio": (3.0 / 4.0, 4.0 / 3.0),
        "hflip": 0.5,
        "vflip": 0.0,
        "color_jitter": 0.4,  # timm disables it when RandAugment is on (as DeiT's timm did)
        "auto_augment": "rand-m9-mstd0.5-inc1",  # None: off
        "interpolation": "bicubic",
        "re_prob": 0.25,  # random erasing
        "re_mode": "pixel",
        "re_count": 1,
        "mixup": 0.8,  # alpha; 0: off
        "cutmix": 1.0,  # alpha; 0: off
        "cutmix_minmax": None,
        "mixup_prob": 1.0,
        "mixup_switch_prob": 0.5,
        "mixup_mode": "batch",
        "label_smoothing": 0.1,
        "repeated_aug": 0,  # repeats per image (DeiT: 3, timm's RepeatAugSampler); 0: off
    },
    "optimizer": {
        "opt": "adamw",  # any timm optimizer name
        "lr": None,  # absolute learning rate; None: lr_base scaled to train.batch_size
        "lr_base": 5e-4,
        "lr_base_size": 512,
        "lr_base_scale": "linear",  # "linear" | "sqrt"
        "weight_decay": 0.05,  # not applied to norms, biases and the model's no_weight_decay() (pos/cls tokens)
        "layer_decay": None,
        "betas": None,
        "eps": None,
        "momentum": 0.9,
        "clip_grad": None,  # max gradient norm (clip_mode "norm") or value; None: off
        "clip_mode": "norm",
    },
    "scheduler": {
        "sched": "cosine",  # any timm scheduler name; updated after every optimizer step
        "warmup_epochs": 5,
        "warmup_lr": 1e-6,
        "min_lr": 1e-5,
        "cooldown_epochs": 0,
        "warmup_prefix": False,
    },
    "train": {
        "output_dir": "./output/pretrain",
        "epochs": 300,
        "batch_size": 1024,  # total over all processes
        "seed": 0,
        "lr_scale": 1.0,  # multiplier of the learning rate (set per run by --lr-scale)
        "device": "cuda",
        "amp": True,  # torch.autocast + GradScaler; CUDA only
        "amp_dtype": "float16",  # or "bfloat16"
        "ema": {"enabled": False, "decay": 0.99996},
        "log_period": 50,  # optimizer steps
        "eval_period": 1,  # epochs; the last epoch is always evaluated
        "workers": 8,  # data-loading processes per training process
        "eval_batch_size": None,  # per process; None: 1.5 x the training batch per process
        # --eval-only: checkpoint to evaluate (default: the run's model_final.safetensors or .pth)
        "init_checkpoint": None,
        # W&B / MLflow switches (configs/common/trackers.py), read and checked by condinit_det.tracking
        "trackers": None,
    },
}
_NESTED = {("train", "ema")}
# Every key the stage reads, set or not, with its default (model.kwargs: timm.create_model's, judged by it).
OPTIONAL_KEYS = {
    **{
        f"{name}.{key}": value
        for name, keys in DEFAULTS.items()
        for key, value in keys.items()
        if (name, key) not in _NESTED
    },
    **{f"{name}.{key}.{sub}": value for name, key in _NESTED for sub, value in DEFAULTS[name][key].items()},
    **dict.fromkeys(f"condinit.{key}" for key in ARM_NODE_KEYS),
    **{f"condinit_analysis.{key}": value for key, value in ANALYSIS_DEFAULTS.items()},
}


def load_config(config_file: str, opts: Optional[List[str]] = None):
    """A lazy ``.py`` config (a path or ``zoo:<name>``) with its ``key=value`` overrides; bad input is one line."""
    cfg = model_zoo.load_config(config_file, list(opts or []), optional=OPTIONAL_KEYS)
    if not hasattr(cfg, "items_ex"):  # a yacs CfgNode
        raise UsageError(
            f"--config-file {config_file}: expected a lazy .py config, e.g. "
            "zoo:demo/pretrain_vit_tiny.py (yacs configs are for detection)"
        )
    return cfg


def node(cfg, name: str) -> Dict[str, Any]:
    """``cfg.<name>`` as a plain dict with :data:`DEFAULTS` filled in; unknown keys raise UsageError."""
    return _filled(name, DEFAULTS[name], plain(cfg.get(name)) or {})


def _filled(where: str, defaults: Dict[str, Any], given: Dict[str, Any]) -> Dict[str, Any]:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UsageError(f"{where} has unknown key(s) {', '.join(unknown)}; accepted: {', '.join(defaults)}")
    filled = copy.deepcopy(defaults)
    for key, value in given.items():
        nested = (where, key) in _NESTED  # a node of its own (train.ema), filled the same way
        filled[key] = _filled(f"{where}.{key}", defaults[key], value or {}) if nested else value
    return filled


def resolve_lr(optimizer: Dict[str, Any], batch_size: int, lr_scale: float = 1.0) -> float:
    """``optimizer.lr``, or ``lr_base`` scaled from ``lr_base_size`` to ``batch_size``; times ``lr_scale``."""
    if optimizer.get("lr") is not None:
        lr = float(optimizer["lr"])
    else:
        ratio = batch_size / float(optimizer["lr_base_size"])
        rule = optimizer["lr_base_scale"]
        if rule not in ("linear", "sqrt"):
            raise UsageError(f"optimizer.lr_base_scale={rule!r}; accepted: linear, sqrt")
        lr = float(optimizer["lr_base"]) * (ratio if rule == "linear" else math.sqrt(ratio))
    return lr * float(lr_scale)


def arm_spec(cfg, train_seed: int) -> ArmSpec:
    """The validated arm node; ``condinit.seed: None`` follows the training seed."""
    raw = dict(plain(cfg.get("condinit")) or {"arm": "default"})
    if raw.get("seed") is None:
        raw["seed"] = int(train_seed)
    return resolve_arm_node(raw)


def run_identity(cfg) -> dict:
    """What a resumed run must share with the run it continues (:data:`condinit_det.records.identity.IDENTITY_KEYS`)."""
    train = node(cfg, "train")
    return {**arm_spec(cfg, train["seed"]).identity(), "seed": int(train["seed"]), "lr_scale": float(train["lr_scale"])}
