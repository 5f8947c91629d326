"""Detection configs: loading, one run's settings, and everything checked before a process starts.

Lazy (``.py``) configs follow detectron2's ``tools/lazyconfig_train_net.py`` conventions and read: ``model``
(armed: :func:`condinit_det.modeling.armed`), ``optimizer``, ``lr_multiplier``, ``dataloader.{train,test,
evaluator}``, ``train.{output_dir, init_checkpoint, max_iter, eval_period, log_period, checkpointer, ddp,
amp.enabled, device, seed}``, ``condinit`` (the arm, ``configs/common/condinit.py``) and the optional
``condinit_analysis`` (the conditioning hook; ``period=0`` or absent: off). yacs (``.yaml``) configs take the
``DefaultTrainer`` path with the project's keys added by :func:`condinit_det.modeling.yacs_config.add_condinit_config`.

Seeds: a negative ``train.seed`` (detectron2's "random") is replaced by 0, so that separate runs of different arms
share data order and every non-attention weight; ``--seeds`` or ``train.seed=N`` choose others, and the arm's seed
follows the training seed.
"""
from __future__ import annotations

import gc
import inspect
import logging
import os
import tempfile
from typing import List, Optional

import torch
from detectron2.config import CfgNode, LazyConfig, instantiate
from omegaconf import OmegaConf, open_dict

from ..init import ARMS
from ..init.spec import ArmSpec, plain, resolve_arm_node
from ..model_zoo import is_yacs_file, resolve_config_file
from ..modeling.arm import armed, armed_nodes, check_arm_agrees, sites_only
from ..utils.checkpoint_io import check_loadable, final_weights_file, refuse_pickle
from ..utils.errors import UsageError
from .checkpoint import check_checkpoint_file, pretrain_checkpoint_file, read_pretrain_meta

__all__ = [
    "DEFAULT_SEED",
    "INFERENCE_DIRNAME",
    "arm_spec",
    "check_arm_sites",
    "check_run",
    "check_shared_checkpoints",
    "get_device",
    "get_init_checkpoint",
    "get_lr_scale",
    "get_max_iter",
    "get_output_dir",
    "get_seed",
    "is_yacs",
    "load_config",
    "prepare_config",
    "run_identity",
]

logger = logging.getLogger("detectron2")

DEFAULT_SEED = 0
INFERENCE_DIRNAME = "inference"


def load_config(config_file: str, opts: Optional[List[str]] = None):
    """Load a lazy (.py, or a saved lazy .yaml) or yacs (.yaml) config and apply overrides.

    ``config_file`` is a path or a model-zoo name ``zoo:<name>`` (:mod:`condinit_det.model_zoo`).
    """
    if not config_file:
        raise UsageError("--config-file is required (a lazy .py config or a yacs .yaml config, a path or zoo:<name>)")
    try:
        path = resolve_config_file(config_file)
    except FileNotFoundError as e:
        raise UsageError(f"--config-file: {e}") from None
    opts = list(opts or [])
    if is_yacs_file(path):
        from detectron2.config import get_cfg

        from ..modeling.yacs_config import add_condinit_config

        cfg = get_cfg()
        add_condinit_config(cfg)
        cfg.merge_from_file(path)
        cfg.merge_from_list(opts)
        return cfg
    if not path.endswith((".py", ".yaml", ".yml")):
        raise UsageError(f"--config-file {config_file}: expected a .py (lazy) or .yaml (yacs or lazy) config")
    cfg = LazyConfig.load(path)
    try:
        return LazyConfig.apply_overrides(cfg, opts)
    except Exception as e:  # hydra's parser and OmegaConf raise several types
        raise UsageError(f"cannot apply overrides {' '.join(opts)!r}: {str(e).splitlines()[0]}") from None


def is_yacs(cfg) -> bool:
    """Whether ``cfg`` is a yacs config (else a lazy one)."""
    return isinstance(cfg, CfgNode)


def get_output_dir(cfg) -> str:
    return cfg.OUTPUT_DIR if is_yacs(cfg) else cfg.train.output_dir


def get_max_iter(cfg) -> int:
    return int(cfg.SOLVER.MAX_ITER if is_yacs(cfg) else cfg.train.max_iter)


def get_seed(cfg) -> int:
    return int(cfg.SEED if is_yacs(cfg) else cfg.train.get("seed", -1))


def get_lr_scale(cfg) -> float:
    return float(cfg.SOLVER.LR_SCALE if is_yacs(cfg) else cfg.train.get("lr_scale", 1.0))


def get_device(cfg) -> str:
    return str(cfg.MODEL.DEVICE if is_yacs(cfg) else cfg.train.device)


def get_init_checkpoint(cfg) -> str:
    return cfg.MODEL.WEIGHTS if is_yacs(cfg) else cfg.train.get("init_checkpoint", "")


def arm_spec(cfg) -> ArmSpec:
    """The validated arm of a prepared config."""
    if is_yacs(cfg):
        from ..modeling.yacs_config import condinit_options

        node = cfg.MODEL.CONDINIT
        return resolve_arm_node({"arm": node.ARM, "seed": node.SEED, "include": list(node.INCLUDE) or None,
                                 "exclude": list(node.EXCLUDE) or None,
                                 "options": {node.ARM: condinit_options(node)} if condinit_options(node) else {}})
    return resolve_arm_node(cfg.condinit)


def run_identity(cfg) -> dict:
    """What a resumed run must share with the run it continues (:data:`condinit_det.records.layout.IDENTITY_KEYS`)."""
    return {**arm_spec(cfg).identity(), "seed": get_seed(cfg), "lr_scale": get_lr_scale(cfg)}


def _format_checkpoint(path: str, arm: str, seed: int) -> str:
    """``{arm}`` / ``{seed}`` filled in; a finished pretraining run directory -> its final weights file (a run
    directory without them stays as it is: the run that needs it says so when it starts)."""
    if not path:
        return path
    path = str(path).replace("{arm}", arm).replace("{seed}", str(seed))
    return final_weights_file(path) or path if os.path.isdir(path) else path


def _check_model_arm(cfg) -> None:
    """The model node applies ``cfg.condinit``: arm it when it is not armed; refuse two disagreeing arms."""
    nodes = armed_nodes(cfg.model)
    if not nodes:
        armed(cfg.model)
        logger.info("cfg.model is not armed: armed it here so this run builds condinit.arm (wrap the model node "
                    "with condinit_det.modeling.armed() so every trainer gets the arm)")
        return
    if len(nodes) > 1:
        raise ValueError(f"the arm is applied in two places ({', '.join(p for p, _ in nodes)}); arm the model once")
    path, node = nodes[0]
    check_arm_agrees(node.condinit, cfg.condinit, where=f"{path}.condinit")


def check_arm_sites(cfg) -> None:
    """Build the model once with the arm's sites checked and no weight changed (the default arm's
    work): a model without attention, an include/exclude pattern that matches nothing or a head
    count that does not divide the width fails here, before anything is written or launched. The
    global RNG is left as it was."""
    with sites_only(), torch.random.fork_rng(devices=[]), torch.no_grad():
        instantiate(cfg.model)
    gc.collect()


def _set_evaluator_output(cfg, output_dir: str) -> None:
    """Let the evaluator save its predictions (``<run>/inference/``), which the report resamples."""
    node = cfg.dataloader.get("evaluator") if "dataloader" in cfg else None
    if node is None or not OmegaConf.is_dict(node) or node.get("output_dir"):
        return
    target = node.get("_target_")
    try:
        accepts = "output_dir" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts:
        node.output_dir = os.path.join(output_dir, INFERENCE_DIRNAME)


def prepare_config(cfg, *, arm: Optional[str] = None, output_dir: Optional[str] = None,
                   seed: Optional[int] = None, lr_scale: float = 1.0):
    """Set the run's arm, output directory, seed and learning-rate scale; resolve ``{arm}`` / ``{seed}``
    in the init checkpoint. Returns cfg (modified in place); raises ValueError on a bad arm node."""
    if arm is not None and arm not in ARMS:
        raise ValueError(f"Unknown arm {arm!r}; accepted: {', '.join(ARMS)}")
    if is_yacs(cfg):
        cfg.defrost()
        if arm is not None:
            cfg.MODEL.CONDINIT.ARM = arm
        if output_dir is not None:
            cfg.OUTPUT_DIR = output_dir
        if seed is not None:
            cfg.SEED = int(seed)
        if cfg.SEED < 0:
            logger.info(f"SEED={cfg.SEED} (random) replaced by {DEFAULT_SEED} so arms stay comparable.")
            cfg.SEED = DEFAULT_SEED
        cfg.MODEL.CONDINIT.SEED = cfg.SEED
        cfg.SOLVER.LR_SCALE = float(lr_scale)
        cfg.SOLVER.BASE_LR = float(cfg.SOLVER.BASE_LR) * float(lr_scale)
        cfg.MODEL.WEIGHTS = _format_checkpoint(cfg.MODEL.WEIGHTS, cfg.MODEL.CONDINIT.ARM, cfg.SEED)
        cfg.freeze()
        arm_spec(cfg)
        return cfg

    with open_dict(cfg):
        if "condinit" not in cfg or cfg.condinit is None:
            cfg.condinit = OmegaConf.create({"arm": "default", "seed": None, "include": None, "exclude": None,
                                             "options": {}})
        if arm is not None:
            cfg.condinit.arm = arm
        if output_dir is not None:
            cfg.train.output_dir = output_dir
        if seed is not None:
            cfg.train.seed = int(seed)
        if cfg.train.get("seed") is None or cfg.train.seed < 0:
            logger.info(f"train.seed={cfg.train.get('seed')} (random) replaced by {DEFAULT_SEED} so that arms share "
                        "data order and non-attention weights; use --seeds or train.seed=N for others.")
            cfg.train.seed = DEFAULT_SEED
        if cfg.condinit.get("seed") is None or seed is not None:
            cfg.condinit.seed = cfg.train.seed
        cfg.train.lr_scale = float(lr_scale)
        if lr_scale != 1.0:
            cfg.optimizer.lr = float(cfg.optimizer.lr) * float(lr_scale)
        spec = resolve_arm_node(cfg.condinit)
        cfg.train.init_checkpoint = _format_checkpoint(cfg.train.get("init_checkpoint", ""), spec.arm,
                                                       cfg.train.seed)
        _check_model_arm(cfg)
        _set_evaluator_output(cfg, cfg.train.output_dir)
    return cfg


# ---------------------------------------------------------------------------------------------
# Checks before anything is written or launched
# ---------------------------------------------------------------------------------------------
def _dataset_names(cfg) -> List[str]:
    names = []
    for split in ("train", "test"):
        node = cfg.dataloader.get(split) if "dataloader" in cfg else None
        dataset = node.get("dataset") if node is not None and OmegaConf.is_dict(node) else None
        value = dataset.get("names") if dataset is not None and OmegaConf.is_dict(dataset) else None
        value = plain(value)
        names += [value] if isinstance(value, str) else list(value or [])
    return list(dict.fromkeys(names))


def _check_datasets(names: List[str]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog

    registered = DatasetCatalog.list()
    for name in names:
        if name not in registered:
            shown = ", ".join(sorted(registered)[:12])
            raise ValueError(f"dataset {name!r} is not registered; register it (DatasetCatalog.register or "
                             f"register_coco_instances) or use a registered one, e.g. {shown}, ...")
        meta = MetadataCatalog.get(name)
        for key in ("image_root", "json_file"):
            path = meta.get(key, None)
            if path and not os.path.exists(path):
                raise ValueError(
                    f"dataset {name!r}: its {key} {path} does not exist; for the COCO configs set "
                    "DETECTRON2_DATASETS to the folder that holds coco/ (docs/configs.md)")


def _check_writable(output_dir: str) -> None:
    """The output directory exists and takes files, or can be created (nothing is created here)."""
    if not output_dir:
        raise ValueError("the config has no output directory (train.output_dir / OUTPUT_DIR)")
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing} is not a directory"
    else:
        try:  # a real write (permission bits alone say nothing for root or read-only mounts)
            os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=existing))
        except OSError as e:
            problem = e.strerror
    if problem:
        raise ValueError(f"cannot write to the output directory {output_dir} ({problem}); choose another with "
                         "train.output_dir=DIR (OUTPUT_DIR DIR for yacs configs)")


def _checkpoint_to_resume(output_dir: str) -> Optional[str]:
    tag = os.path.join(output_dir, "last_checkpoint")
    if not os.path.isfile(tag):
        return None
    with open(tag) as f:
        name = f.read().strip()
    if not name:
        raise ValueError(f"{tag} is empty; it should name the checkpoint to resume from: write that file name "
                         "into it or delete it to start afresh")
    return os.path.join(output_dir, name)


def check_run(cfg, *, resume: bool, eval_only: bool, allow_shared_checkpoint: bool = False,
              trust_pickle: bool = False, upstream: Optional[str] = None) -> None:
    """Refuse, with one clear error, what would fail later or lose data; changes nothing on disk.

    ``upstream``: an earlier stage's experiment directory; an init checkpoint under it may not exist yet (the run
    waits for it) and is checked when the run starts."""
    output_dir = get_output_dir(cfg)
    spec = arm_spec(cfg)
    if not is_yacs(cfg):
        _check_datasets(_dataset_names(cfg))
    _check_writable(output_dir)
    if resume:
        last = _checkpoint_to_resume(output_dir)
        if last:
            check_checkpoint_file(last)
            check_loadable(last, trust_pickle=trust_pickle)
    init = get_init_checkpoint(cfg)
    if eval_only and not init and not (resume and _checkpoint_to_resume(output_dir)):
        raise UsageError("--eval-only needs train.init_checkpoint=PATH (MODEL.WEIGHTS for yacs) or --resume in a "
                         "run directory with a checkpoint")
    if init and upstream and not os.path.isfile(init) and _within(init, upstream):
        return  # the upstream run has not finished yet: checked when this run starts
    if init:
        refuse_pickle(init, trust_pickle)  # also detectron2:// and http(s):// .pkl files
    if init and "://" not in init:
        pretrain_checkpoint_file(init)  # a run directory without final weights: say so
        check_checkpoint_file(init.split("?")[0])
        meta = read_pretrain_meta(init, trust_pickle=trust_pickle)
        if meta and meta.get("arm") not in (None, spec.arm) and not (eval_only or allow_shared_checkpoint):
            raise UsageError(
                f"train.init_checkpoint {init} was pretrained with arm {meta.get('arm')!r} but this run's arm is "
                f"{spec.arm!r}; use that arm's checkpoint (e.g. a path with {{arm}}) or pass --allow-shared-checkpoint")


def _within(path: str, folder: str) -> bool:
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_shared_checkpoints(runs, *, allow_shared_checkpoint: bool) -> None:
    """Refuse an experiment whose arms would all start from one checkpoint (for the same seed and lr scale): it
    overwrites the arm at every site it holds. ``runs``: (RunSpec, prepared cfg) pairs."""
    if allow_shared_checkpoint or len({spec.arm for spec, _ in runs}) < 2:
        return
    by_seed = {}
    for spec, cfg in runs:
        init = get_init_checkpoint(cfg)
        if init:
            by_seed.setdefault((spec.seed, spec.lr_scale), {})[spec.arm] = init
    for (seed, _), paths in by_seed.items():
        if len(paths) > 1 and len(set(paths.values())) == 1:
            raise UsageError(
                f"every arm would start from the same checkpoint {next(iter(paths.values()))} (seed {seed}), which "
                "overwrites the arm at every site it holds: give each arm its own checkpoint with {arm} in "
                "train.init_checkpoint (e.g. \"train.init_checkpoint='output/pretrain/{arm}/seed{seed}'\") or pass "
                "--allow-shared-checkpoint")
