"""yacs (``.yaml``) configs as the lazy config the detection stage trains (:func:`lazy_from_yacs`): it keeps the
yacs values in its ``yacs`` node and builds with detectron2's yacs builders; the backbone builders apply the arm,
which ``MODEL.CONDINIT`` takes from the lazy ``condinit`` node. Detail: docs/configs.md."""

from typing import Mapping

import torch
import yaml
from detectron2.config import CfgNode, LazyCall, get_cfg
from detectron2.data import build_detection_test_loader, build_detection_train_loader, get_detection_dataset_dicts
from detectron2.modeling import build_model
from detectron2.solver import build_lr_scheduler
from omegaconf import DictConfig, OmegaConf

from ..evaluation import FastCOCOEvaluator
from ..init import ARM_OPTIONS, ARMS, InitReport
from ..modeling.yacs_config import add_condinit_config, build_optimizer, condinit_options

__all__ = ["build_yacs_model", "build_yacs_optimizer", "lazy_from_yacs", "yacs_config", "yacs_lr_multiplier"]


def yacs_config(yacs: Mapping) -> CfgNode:
    """A fresh ``CfgNode`` (detectron2's defaults, the project's keys) holding the plain values of a ``yacs`` node."""
    cfg = add_condinit_config(get_cfg())
    cfg.merge_from_other_cfg(CfgNode(OmegaConf.to_container(yacs) if isinstance(yacs, DictConfig) else dict(yacs)))
    return cfg


def build_yacs_model(cfg: CfgNode, condinit: Mapping) -> torch.nn.Module:
    """``build_model(cfg)`` with ``MODEL.CONDINIT``'s arm, seed and patterns from the ``condinit`` node; the
    backbone's arm report is kept on ``model.condinit_report``."""
    node = cfg.MODEL.CONDINIT
    node.ARM, node.SEED = condinit["arm"], int(condinit["seed"])
    node.INCLUDE, node.EXCLUDE = list(condinit["include"] or []), list(condinit["exclude"] or [])
    model = build_model(cfg)
    report = getattr(model.backbone, "condinit_report", None)
    if report is None and node.ENABLED and node.ARM != "default":
        raise ValueError(
            f"MODEL.CONDINIT.ARM={node.ARM} but MODEL.BACKBONE.NAME={cfg.MODEL.BACKBONE.NAME} applies "
            "no arm; use build_condinit_vit_backbone, build_condinit_swin_fpn_backbone or "
            "build_condinit_xcit_backbone"
        )
    model.condinit_report = report or InitReport(arm=node.ARM, seed=node.SEED, options={}, sites=[])
    return model


def build_yacs_optimizer(cfg: CfgNode, params: Mapping, lr: float) -> torch.optim.Optimizer:
    """The project's yacs optimizer (``SOLVER.OPTIMIZER``) of ``params["model"]`` at learning rate ``lr``."""
    cfg.SOLVER.BASE_LR = float(lr)
    return build_optimizer(cfg, params["model"])


def yacs_lr_multiplier(cfg: CfgNode, lr: float):
    """detectron2's ``build_lr_scheduler(cfg)`` schedule (``SOLVER.BASE_LR = lr``) as the multiplier it applies."""
    cfg.SOLVER.BASE_LR = float(lr)
    placeholder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=float(lr))
    return build_lr_scheduler(cfg, placeholder)._multiplier  # the LRScheduler hook takes the multiplier


def _condinit(node: CfgNode) -> dict:
    """``MODEL.CONDINIT`` as a lazy config's ``condinit`` node (each arm's own options from the keys it accepts; the
    controls' shared ones under the conditioned arm)."""
    options = {}
    for arm in ARMS:
        per_arm = node.clone()
        per_arm.ARM = arm
        own = {key: value for key, value in condinit_options(per_arm).items() if key in ARM_OPTIONS[arm]}
        if own:
            options[arm] = own
    return {
        "arm": node.ARM,
        "seed": node.SEED,
        "include": list(node.INCLUDE) or None,
        "exclude": list(node.EXCLUDE) or None,
        "options": options,
    }


def lazy_from_yacs(cfg: CfgNode) -> DictConfig:
    """The lazy config of a yacs config (docs/configs.md says which keys go where); registers the embedded datasets
    it names."""
    from ..data import EMBEDDED_DATASETS, register_embedded_datasets

    for key, embedded in EMBEDDED_DATASETS.items():
        if set(embedded.detectron2_names or ()) & set(cfg.DATASETS.TRAIN + cfg.DATASETS.TEST):
            register_embedded_datasets(dataset=key)
    solver, test_set, workers = cfg.SOLVER, cfg.DATASETS.TEST[0], cfg.DATALOADER.NUM_WORKERS
    built = LazyCall(yacs_config)(yacs="${yacs}")
    lazy = OmegaConf.create(
        {"yacs": yaml.safe_load(cfg.dump()), "condinit": _condinit(cfg.MODEL.CONDINIT)}, flags={"allow_objects": True}
    )
    lazy.model = LazyCall(build_yacs_model)(cfg=built, condinit="${condinit}")
    lazy.optimizer = LazyCall(build_yacs_optimizer)(cfg=built, params={"model": None}, lr=solver.BASE_LR)
    lazy.lr_multiplier = LazyCall(yacs_lr_multiplier)(cfg=built, lr="${optimizer.lr}")
    keypoints = cfg.MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE if cfg.MODEL.KEYPOINT_ON else 0
    dataset = LazyCall(get_detection_dataset_dicts)(  # as build_detection_train_loader(cfg) reads it
        names=list(cfg.DATASETS.TRAIN),
        filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        min_keypoints=keypoints,
        proposal_files=list(cfg.DATASETS.PROPOSAL_FILES_TRAIN) if cfg.MODEL.LOAD_PROPOSALS else None,
    )
    tasks = ["bbox", "segm"] if cfg.MODEL.MASK_ON else ["bbox"]
    lazy.dataloader = {
        "train": LazyCall(build_detection_train_loader)(cfg=built, dataset=dataset, num_workers=workers),
        "test": LazyCall(build_detection_test_loader)(cfg=built, dataset_name=test_set, num_workers=workers),
        "evaluator": LazyCall(FastCOCOEvaluator)(dataset_name=test_set, output_dir=None, tasks=tasks),
    }
    lazy.train = {
        "output_dir": cfg.OUTPUT_DIR,
        "init_checkpoint": cfg.MODEL.WEIGHTS,
        "max_iter": solver.MAX_ITER,
        "amp": {"enabled": solver.AMP.ENABLED},
        "ddp": {"broadcast_buffers": False},
        "checkpointer": {"period": solver.CHECKPOINT_PERIOD, "max_to_keep": None},
        "eval_period": cfg.TEST.EVAL_PERIOD,
        "log_period": 20,
        "device": cfg.MODEL.DEVICE,
        "seed": cfg.SEED,
        "cudnn_benchmark": cfg.CUDNN_BENCHMARK,
        "trackers": {name.lower(): {k.lower(): v for k, v in node.items()} for name, node in cfg.TRACKERS.items()},
    }
    return lazy
