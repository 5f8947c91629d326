"""The pretraining stage's implementation of :class:`condinit_det.stage.Stage`."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import List, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf, open_dict

from ..init.spec import apply_arm_spec, plain
from ..records.layout import RunSpec
from ..records.results import ResultsFile
from ..stage import PRETRAIN, ConfigDefaults, RunOptions, Stage
from ..utils.checkpoint_io import check_loadable, final_weights_file
from ..utils.errors import UsageError
from .checkpoint import FINAL_FILENAME, last_checkpoint
from .conditioning import conditioning_options
from .config import arm_spec, load_config, node, run_identity
from .data import build_mixup, check_dataset_folders, count_images
from .model import create_classifier
from .trainer import evaluate_checkpoint, train_run

logger = logging.getLogger("condinit_det.pretrain")
# ImageNet-1k's training split: what a dry run prices a 1000-class config with when the data is elsewhere.
IMAGENET_CLASSES, IMAGENET_TRAIN_IMAGES = 1000, 1_281_167


def eval_checkpoint(train: dict, run_dir: str) -> str:
    """What --eval-only evaluates: ``train.init_checkpoint``, else the run's final weights."""
    return train.get("init_checkpoint") or final_weights_file(run_dir) or os.path.join(run_dir, FINAL_FILENAME)


class PretrainStage(Stage):
    """Classification pretraining with timm from lazy ``.py`` configs; the length is in epochs; each evaluated epoch
    adds a ``"cls"`` record; a finished run leaves ``model_final.{safetensors,pth}``."""

    descriptor = PRETRAIN
    run_keys = ("condinit.arm", "condinit.seed", "train.seed", "train.output_dir", "train.trackers")

    def load_config(self, config_file: str, opts: Sequence[str]):
        return load_config(config_file, list(opts or []))

    def defaults(self, cfg) -> ConfigDefaults:
        train = node(cfg, "train")
        arm = str((plain(cfg.get("condinit")) or {}).get("arm", "default"))
        return ConfigDefaults(output_dir=str(train["output_dir"] or ""), arm=arm, seed=max(int(train["seed"]), 0))

    def configure_run(self, cfg, spec: RunSpec, run_dir: str, *, init_from: Optional[str] = None):
        if init_from is not None:
            raise UsageError("pretraining starts from random weights: it cannot start from another stage's runs")
        with open_dict(cfg):
            if cfg.get("condinit") is None:
                cfg.condinit = OmegaConf.create({"arm": spec.arm})
            cfg.condinit.arm = spec.arm
            cfg.train.seed = int(spec.seed)
            cfg.train.lr_scale = float(spec.lr_scale)
            cfg.train.output_dir = run_dir
        return cfg

    def length(self, cfg) -> int:
        """``train.epochs`` + cooldown (+ warmup when it is a prefix), as timm's scheduler counts."""
        train, sched = node(cfg, "train"), node(cfg, "scheduler")
        extra = int(sched["cooldown_epochs"]) + (int(sched["warmup_epochs"]) if sched["warmup_prefix"] else 0)
        return int(train["epochs"]) + extra

    def steps(self, cfg) -> int:
        """Epochs x full batches of ``data.num_train_images``, else of the images on disk, else (1000 classes not on
        this machine) of ImageNet-1k's, with a warning."""
        train, data = node(cfg, "train"), node(cfg, "data")
        images = data.get("num_train_images")
        if images is None:
            try:
                images = count_images(data)
            except ValueError as e:
                if data.get("num_classes") != IMAGENET_CLASSES:
                    raise UsageError(f"{e}: set data.num_train_images=N to price the runs without the data") from None
                images = IMAGENET_TRAIN_IMAGES
                logger.warning(
                    f"data.root={data['root']} is not on this machine: priced with ImageNet-1k's "
                    f"{images:,} training images (data.num_train_images=N sets another count)"
                )
        return self.length(cfg) * (int(images) // int(train["batch_size"]))

    def device(self, cfg) -> str:
        return str(node(cfg, "train")["device"])

    def identity(self, cfg) -> dict:
        return run_identity(cfg)

    def dataset(self, cfg) -> Optional[str]:
        return node(cfg, "data")["root"]

    def evaluation_data(self, cfg) -> Optional[str]:
        data = node(cfg, "data")
        return f"{data['root']}/{data['val_split']}"

    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]], *, upstream: Optional[str] = None) -> None:
        cfg = runs[0][1]
        nodes = {name: node(cfg, name) for name in ("model", "data", "augment", "train")}
        train, data = nodes["train"], nodes["data"]
        world, batch = options.processes, int(train["batch_size"])
        if world < 1 or batch % world:
            raise UsageError(
                f"train.batch_size={batch} does not split over {world} process(es); use a multiple of {world}"
            )
        if build_mixup(nodes["augment"], 2) is not None and (batch // world) % 2:
            raise UsageError(
                f"mixup/cutmix need an even batch per process; train.batch_size={batch} over {world} "
                f"process(es) gives {batch // world}"
            )
        if (
            str(train["device"]).startswith("cuda")
            and not (options.submitted or options.dry_run)
            and not torch.cuda.is_available()
        ):
            raise UsageError("train.device='cuda' but no CUDA device is available; pass train.device=cpu")
        if data.get("num_classes") is None:
            raise UsageError("data.num_classes is not set; it must equal the number of class folders")
        conditioning_options(cfg)  # a misspelt condinit_analysis key stops here, before anything is written
        if not options.dry_run:  # a dry run prices runs whose data is elsewhere
            check_dataset_folders(data)
        try:  # no weights needed to check the name, the kwargs and the attention sites
            with torch.device("meta"):
                model = create_classifier(nodes["model"], int(data["num_classes"]))
        except NotImplementedError:
            model = create_classifier(nodes["model"], int(data["num_classes"]))
        for spec, run_cfg in runs:
            # the arm's sites, patterns and head counts checked as the default arm sees them: no weight changes
            apply_arm_spec(model, dataclasses.replace(arm_spec(run_cfg, spec.seed), arm="default"))
            run_train = node(run_cfg, "train")
            if options.eval_only:
                path = eval_checkpoint(run_train, run_train["output_dir"])
                if not os.path.isfile(path):
                    raise UsageError(
                        f"--eval-only: {path} does not exist; train the run first or pass train.init_checkpoint=PATH"
                    )
            else:
                path = last_checkpoint(run_train["output_dir"]) if options.resume else None
            if path:
                check_loadable(path, trust_pickle=options.trust_pickle)

    def loader_workers(self, cfg) -> Optional[int]:
        return int(node(cfg, "train")["workers"])

    def set_loader_workers(self, cfg, workers: int) -> None:
        with open_dict(cfg):
            cfg.train.workers = int(workers)

    def finished(self, run_dir: str, length: int) -> bool:
        evaluated = any(r.get("epoch", 0) >= length for r in ResultsFile(run_dir).records("cls"))
        return evaluated and os.path.isfile(os.path.join(run_dir, FINAL_FILENAME))

    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        train_run(
            cfg,
            run_dir=run_dir,
            config_file=options.config_file,
            resume=options.resume,
            trust_pickle=options.trust_pickle,
        )

    def evaluate(self, options: RunOptions, cfg, run_dir: str) -> None:
        evaluate_checkpoint(
            cfg,
            run_dir=run_dir,
            checkpoint=eval_checkpoint(node(cfg, "train"), run_dir),
            config_file=options.config_file,
            trust_pickle=options.trust_pickle,
        )
