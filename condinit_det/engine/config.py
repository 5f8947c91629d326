"""Detection configs: loading, one run's settings, and everything checked before a process starts. A config is lazy
as detectron2's ``lazyconfig_train_net.py`` reads it, plus ``condinit`` (the arm) and the optional
``condinit_analysis``; a yacs config is made lazy at loading (:mod:`.yacs`). Detail: docs/training.md, docs/configs.md.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import warnings
from typing import List, Optional, Sequence

import torch
from detectron2.config import CfgNode, instantiate
from omegaconf import OmegaConf, open_dict

from .. import model_zoo
from ..analysis.options import ANALYSIS_DEFAULTS
from ..init.spec import ArmSpec, plain, resolve_arm_node
from ..modeling.arm import armed, armed_nodes, check_arm_agrees, sites_only
from ..utils.checkpoint_io import check_loadable, final_weights_file, refuse_pickle
from ..utils.errors import UsageError
from ..utils.overrides import target_arguments
from .checkpoint import check_checkpoint_file, pretrain_checkpoint_file, read_pretrain_meta
from .yacs import build_yacs_model, lazy_from_yacs

__all__ = [
    "CONDINIT_DEFAULTS",
    "DEFAULT_SEED",
    "OPTIONAL_KEYS",
    "arm_spec",
    "check_arm_sites",
    "check_run",
    "check_shared_checkpoints",
    "dataset_names",
    "load_config",
    "prepare_config",
    "run_identity",
]

logger = logging.getLogger("detectron2")

DEFAULT_SEED = 0
INFERENCE_DIRNAME = "inference"
CONDINIT_DEFAULTS = {"arm": "default", "seed": None, "include": None, "exclude": None, "options": {}}
# Keys the stage reads though a config may lack them, with their defaults (set below and in prepare_config); the arm
# node's options are judged per arm by its own check.
OPTIONAL_KEYS = {
    **{f"condinit.{key}": value for key, value in CONDINIT_DEFAULTS.items()},
    **{f"condinit_analysis.{key}": value for key, value in ANALYSIS_DEFAULTS.items()},
    "train.seed": DEFAULT_SEED,
    "train.lr_scale": 1.0,
    "train.init_checkpoint": "",
    "train.trackers": None,
    "train.cudnn_benchmark": False,
}
REQUIRED_KEYS = (
    "model",
    "optimizer",
    "lr_multiplier",
    "dataloader.train",
    "train.output_dir",
    "train.max_iter",
    "train.eval_period",
    "train.log_period",
    "train.checkpointer",
    "train.amp.enabled",
    "train.ddp",
    "train.device",
)


def load_config(config_file: str, opts: Sequence[str] = ()):
    """The lazy config of ``config_file`` (a path or ``zoo:<name>``; a yacs ``.yaml`` one converted) with its
    overrides. A config without a ``condinit`` node gets :data:`CONDINIT_DEFAULTS`; a missing required key is a
    one-line UsageError."""
    cfg = model_zoo.load_config(config_file, opts, optional=OPTIONAL_KEYS)
    if isinstance(cfg, CfgNode):
        cfg = lazy_from_yacs(cfg)
    missing = [key for key in REQUIRED_KEYS if OmegaConf.select(cfg, key, default=None) is None]
    if missing:
        raise UsageError(
            f"{config_file}: the config has no {', '.join(missing)}; a detection config defines them as "
            "detectron2's lazy configs do (common/train.py holds the train.* keys)"
        )
    if cfg.get("condinit") is None:
        with open_dict(cfg):
            cfg.condinit = dict(CONDINIT_DEFAULTS)
    with warnings.catch_warnings():  # detectron2's ViT, Swin and MViT blocks import timm's old module name
        warnings.filterwarnings("ignore", message="Importing from timm.models.layers", category=FutureWarning)
        import timm.models.layers  # noqa: F401
    return cfg


def arm_spec(cfg) -> ArmSpec:
    """The validated arm of a config."""
    return resolve_arm_node(cfg.condinit)


def run_identity(cfg) -> dict:
    """What a resumed run must share with the run it continues (:data:`condinit_det.records.identity.IDENTITY_KEYS`)."""
    return {**arm_spec(cfg).identity(), "seed": int(cfg.train.seed), "lr_scale": float(cfg.train.get("lr_scale", 1.0))}


def _format_checkpoint(path: str, arm: str, seed: int) -> str:
    """``{arm}`` / ``{seed}`` filled in; a finished pretraining run directory -> its final weights file (a run
    directory without them stays as it is: the run that needs it says so when it starts)."""
    if not path:
        return path
    path = str(path).replace("{arm}", arm).replace("{seed}", str(seed))
    return final_weights_file(path) or path if os.path.isdir(path) else path


def _check_model_arm(cfg) -> None:
    """The model node applies ``cfg.condinit``: arm it when it is not armed; refuse two disagreeing arms."""
    if cfg.model.get("_target_") is build_yacs_model:  # the backbone builders apply the arm
        return
    nodes = armed_nodes(cfg.model)
    if not nodes:
        armed(cfg.model)
        logger.info(
            "cfg.model is not armed: armed it here so this run builds condinit.arm (wrap the model node "
            "with condinit_det.modeling.armed() so every trainer gets the arm)"
        )
        return
    if len(nodes) > 1:
        raise ValueError(f"the arm is applied in two places ({', '.join(p for p, _ in nodes)}); arm the model once")
    path, node = nodes[0]
    check_arm_agrees(node.condinit, cfg.condinit, where=f"{path}.condinit")


def check_arm_sites(cfg) -> None:
    """Build the model once with the arm's sites checked and no weight changed: a model without attention, a pattern
    that matches nothing or a head count that does not divide the width fails here. The global RNG is kept."""
    with sites_only(), torch.random.fork_rng(devices=[]), torch.no_grad():
        instantiate(cfg.model)
    gc.collect()


def _set_evaluator_output(cfg, output_dir: str) -> None:
    """Let the evaluator save its predictions (``<run>/inference/``), which the report resamples."""
    node = cfg.dataloader.get("evaluator")
    takes_output_dir = OmegaConf.is_dict(node) and "output_dir" in target_arguments(node.get("_target_"))[0]
    if takes_output_dir and not node.get("output_dir"):
        node.output_dir = os.path.join(output_dir, INFERENCE_DIRNAME)


def prepare_config(
    cfg,
    *,
    arm: Optional[str] = None,
    output_dir: Optional[str] = None,
    seed: Optional[int] = None,
    lr_scale: float = 1.0,
):
    """Set the run's arm, output directory, seed and learning-rate scale; resolve ``{arm}`` / ``{seed}``
    in the init checkpoint. Returns cfg (modified in place); raises ValueError on a bad arm node."""
    with open_dict(cfg):
        if arm is not None:
            cfg.condinit.arm = arm
        if output_dir is not None:
            cfg.train.output_dir = output_dir
        if seed is not None:
            cfg.train.seed = int(seed)
        if cfg.train.get("seed") is None or cfg.train.seed < 0:
            logger.info(
                f"train.seed={cfg.train.get('seed')} (random) replaced by {DEFAULT_SEED} so that arms share "
                "data order and non-attention weights; use --seeds or train.seed=N for others."
            )
            cfg.train.seed = DEFAULT_SEED
        if cfg.condinit.get("seed") is None or seed is not None:
            cfg.condinit.seed = cfg.train.seed
        cfg.train.lr_scale = float(lr_scale)
        if lr_scale != 1.0:
            cfg.optimizer.lr = float(cfg.optimizer.lr) * float(lr_scale)
        spec = resolve_arm_node(cfg.condinit)
        cfg.train.init_checkpoint = _format_checkpoint(cfg.train.get("init_checkpoint", ""), spec.arm, cfg.train.seed)
        _check_model_arm(cfg)
        _set_evaluator_output(cfg, cfg.train.output_dir)
    return cfg


def dataset_names(cfg) -> List[str]:
    """The datasets the config trains on, then those it tests on, the evaluator's last."""
    names = []
    for key in ("dataloader.train.dataset.names", "dataloader.test.dataset.names", "dataloader.evaluator.dataset_name"):
        value = plain(OmegaConf.select(cfg, key, default=None))
        names += [value] if isinstance(value, str) else list(value or [])
    return list(dict.fromkeys(names))


def _check_datasets(names: List[str]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog

    registered = DatasetCatalog.list()
    for name in names:
        if name not in registered:
            shown = ", ".join(sorted(registered)[:12])
            raise ValueError(
                f"dataset {name!r} is not registered; register it (DatasetCatalog.register or "
                f"register_coco_instances) or use a registered one, e.g. {shown}, ..."
            )
        meta = MetadataCatalog.get(name)
        for key in ("image_root", "json_file"):
            path = meta.get(key, None)
            if path and not os.path.exists(path):
                raise ValueError(
                    f"dataset {name!r}: its {key} {path} does not exist; for the COCO configs set "
                    "DETECTRON2_DATASETS to the folder that holds coco/ (docs/configs.md)"
                )


def _check_writable(output_dir: str) -> None:
    """The output directory exists and takes files, or can be created (nothing is created here)."""
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:  # a real write (permission bits alone say nothing for root or read-only mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=existing))
    except OSError as e:
        raise ValueError(
            f"cannot write to the output directory {output_dir} ({e.strerror}: {existing}); choose "
            "another with train.output_dir=DIR (OUTPUT_DIR DIR for yacs configs)"
        ) from None


def _checkpoint_to_resume(output_dir: str) -> Optional[str]:
    tag = os.path.join(output_dir, "last_checkpoint")
    if not os.path.isfile(tag):
        return None
    with open(tag) as f:
        name = f.read().strip()
    if not name:
        raise ValueError(
            f"{tag} is empty; it should name the checkpoint to resume from: write that file name "
            "into it or delete it to start afresh"
        )
    return os.path.join(output_dir, name)


def check_run(
    cfg,
    *,
    resume: bool,
    eval_only: bool,
    allow_shared_checkpoint: bool = False,
    trust_pickle: bool = False,
    upstream: Optional[str] = None,
    data: bool = True,
) -> None:
    """Refuse, with one clear error, what would fail later or lose data; changes nothing on disk. An init checkpoint
    under ``upstream`` (an earlier stage's experiment) may not exist yet. ``data``: check that the datasets exist."""
    output_dir = cfg.train.output_dir
    spec = arm_spec(cfg)
    if data:
        _check_datasets(dataset_names(cfg))
    _check_writable(output_dir)
    last = _checkpoint_to_resume(output_dir) if resume else None
    if last:
        check_checkpoint_file(last)
        check_loadable(last, trust_pickle=trust_pickle)
    init = cfg.train.get("init_checkpoint") or ""
    if eval_only and not init and not last:
        raise UsageError(
            "--eval-only needs train.init_checkpoint=PATH (MODEL.WEIGHTS for yacs) or --resume in a "
            "run directory with a checkpoint"
        )
    under_upstream = upstream and os.path.abspath(init).startswith(os.path.join(os.path.abspath(upstream), ""))
    if not init or (under_upstream and not os.path.isfile(init)):
        return  # no checkpoint, or the upstream run has not finished yet: checked when this run starts
    refuse_pickle(init, trust_pickle)  # also detectron2:// and http(s):// .pkl files
    if "://" in init:
        return
    pretrain_checkpoint_file(init)  # a run directory without final weights: say so
    check_checkpoint_file(init.split("?")[0])
    meta = read_pretrain_meta(init, trust_pickle=trust_pickle)
    if meta and meta.get("arm") not in (None, spec.arm) and not (eval_only or allow_shared_checkpoint):
        raise UsageError(
            f"train.init_checkpoint {init} was pretrained with arm {meta.get('arm')!r} but this run's arm is "
            f"{spec.arm!r}; use that arm's checkpoint (e.g. a path with {{arm}}) or pass --allow-shared-checkpoint"
        )


def check_shared_checkpoints(runs, *, allow_shared_checkpoint: bool) -> None:
    """Refuse an experiment whose arms would all start from one checkpoint (for the same seed and lr scale): it
    overwrites the arm at every site it holds. ``runs``: (RunSpec, prepared cfg) pairs."""
    if allow_shared_checkpoint or len({spec.arm for spec, _ in runs}) < 2:
        return
    by_seed = {}
    for spec, cfg in runs:
        init = cfg.train.get("init_checkpoint")
        if init:
            by_seed.setdefault((spec.seed, spec.lr_scale), {})[spec.arm] = init
    for (seed, _), paths in by_seed.items():
        if len(paths) > 1 and len(set(paths.values())) == 1:
            raise UsageError(
                f"every arm would start from the same checkpoint {next(iter(paths.values()))} (seed {seed}), which "
                "overwrites the arm at every site it holds: give each arm its own checkpoint with {arm} in "
                "train.init_checkpoint (e.g. \"train.init_checkpoint='output/pretrain/{arm}/seed{seed}'\") or pass "
                "--allow-shared-checkpoint"
            )
