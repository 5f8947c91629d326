"""The pretraining stage: timm classifiers trained with an arm from random weights, top-1 / top-5 recorded."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import torch

from ..init.spec import plain
from ..records.layout import RunSpec
from ..records.per_image import find_classification_evals
from ..stage import PRETRAIN, ConfigDefaults, RunOptions, Stage
from ..utils.checkpoint_io import check_loadable, final_weights_file
from ..utils.errors import UsageError
from .checkpoint import FINAL_FILENAME, FINAL_SAFETENSORS, find_checkpoints, last_checkpoint
from .conditioning import conditioning_options
from .config import arm_spec, load_config, node, run_identity
from .data import build_mixup, check_dataset_folders, count_images
from .model import check_arm_sites, create_classifier
from .trainer import PREDICTIONS_FILENAME, evaluate_checkpoint, run_finished, total_epochs, train_run

__all__ = ["PretrainStage"]

EXAMPLES = """
Examples:

Train the tiny CPU demo, three arms, then print the comparison:
    $ condinit-pretrain --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/p

One arm, three seeds, and a learning-rate scan on the first seed:
    $ condinit-pretrain --config-file CFG.py --arm conditioned --seeds 0,1,2 --lr-scale 0.5,1,2

Resume (finished runs are skipped; a run directory never changes arm or seed; a diverged run is not
retried, one that failed with an error continues from its last checkpoint):
    $ condinit-pretrain --config-file CFG.py --arm all --resume train.output_dir=output/p
Train the failed and diverged runs afresh (their old directories are moved aside to <run>.failed<n>/):
    $ condinit-pretrain --config-file CFG.py --arm all --retry-failed train.output_dir=output/p

ImageNet on 8 GPUs, or on 2 machines (R = 0 on the first, 1 on the second):
    $ condinit-pretrain --num-gpus 8 --config-file configs/ImageNet/vit_b16_deit_300ep.py data.root=/data/imagenet
    $ condinit-pretrain --num-gpus 8 --num-machines 2 --machine-rank R --dist-url tcp://HOST0:PORT --config-file ...

Evaluate a run's model_final.safetensors or .pth (or train.init_checkpoint=PATH):
    $ condinit-pretrain --config-file CFG.py --arm conditioned --eval-only train.output_dir=output/p
"""


def eval_checkpoint(train: dict, run_dir: str) -> str:
    """What --eval-only evaluates: ``train.init_checkpoint``, else the run's ``model_final.safetensors`` (else
    ``model_final.pth``)."""
    return train.get("init_checkpoint") or final_weights_file(run_dir) or os.path.join(run_dir, FINAL_FILENAME)


class PretrainStage(Stage):
    """Classification pretraining with timm: lazy ``.py`` configs (``configs/ImageNet``, ``configs/demo``); the
    length is the epochs timm's scheduler runs; each evaluated epoch adds a ``"cls"`` record; a finished run
    leaves ``model_final.{safetensors,pth}``, the backbone a detector fine-tunes from."""

    descriptor = PRETRAIN
    description = "Classification pretraining of a timm model with an attention-initialization arm."
    examples = EXAMPLES
    config_help = "a lazy .py config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)"

    def load_config(self, config_file: str, opts: Sequence[str]):
        return load_config(config_file, list(opts or []))

    def defaults(self, cfg) -> ConfigDefaults:
        train = node(cfg, "train")
        arm = str((plain(cfg.get("condinit")) or {}).get("arm", "default"))
        return ConfigDefaults(output_dir=str(train["output_dir"] or ""), arm=arm, seed=max(int(train["seed"]), 0))

    def configure_run(self, cfg, spec: RunSpec, run_dir: str, *, init_from: Optional[str] = None):
        from omegaconf import OmegaConf, open_dict

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
        return total_epochs(cfg)

    def steps(self, cfg) -> int:
        """Epochs x full batches per epoch of the training split (its images counted on disk; the
        ``data.num_train_images`` of the config when the data is not on this machine)."""
        train, data = node(cfg, "train"), node(cfg, "data")
        images = data.get("num_train_images") or count_images(data)
        return self.length(cfg) * (int(images) // int(train["batch_size"]))

    def device(self, cfg) -> str:
        return str(node(cfg, "train")["device"])

    def identity(self, cfg) -> dict:
        train = node(cfg, "train")
        return run_identity(arm_spec(cfg, int(train["seed"])), seed=int(train["seed"]),
                            lr_scale=float(train["lr_scale"]))

    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]], *,
              upstream: Optional[str] = None) -> None:
        cfg = runs[0][1]
        nodes = {name: node(cfg, name) for name in ("model", "data", "augment", "train")}
        train, data = nodes["train"], nodes["data"]
        world = options.processes
        batch = int(train["batch_size"])
        if world < 1 or batch % world:
            raise UsageError(f"train.batch_size={batch} does not split over {world} process(es); use a multiple of "
                             f"{world}")
        if build_mixup(nodes["augment"], 2) is not None and (batch // world) % 2:
            raise UsageError(f"mixup/cutmix need an even batch per process; train.batch_size={batch} over {world} "
                             f"process(es) gives {batch // world}")
        if str(train["device"]).startswith("cuda") and not options.submitted:  # a login node may have no GPU
            if not torch.cuda.is_available():
                raise UsageError("train.device='cuda' but no CUDA device is available; pass train.device=cpu")
        if data.get("num_classes") is None:
            raise UsageError("data.num_classes is not set; it must equal the number of class folders")
        conditioning_options(cfg)  # a misspelt condinit_analysis key stops here, before anything is written
        _, classes = check_dataset_folders(data)
        try:  # no weights needed to check the name, the kwargs and the attention sites
            with torch.device("meta"):
                model = create_classifier(nodes["model"], len(classes))
        except NotImplementedError:
            model = create_classifier(nodes["model"], len(classes))
        for spec, run_cfg in runs:
            check_arm_sites(model, arm_spec(run_cfg, spec.seed))
            run_dir = node(run_cfg, "train")["output_dir"]
            if options.resume and not options.eval_only:
                last = last_checkpoint(run_dir)
                if last:
                    check_loadable(last, trust_pickle=options.trust_pickle)
            if options.eval_only:
                path = eval_checkpoint(node(run_cfg, "train"), run_dir)
                if not os.path.isfile(path):
                    raise UsageError(f"--eval-only: {path} does not exist; train the run first or pass "
                                     "train.init_checkpoint=PATH")
                check_loadable(path, trust_pickle=options.trust_pickle)

    def loader_workers(self, cfg) -> Optional[int]:
        return int(node(cfg, "train")["workers"])

    def set_loader_workers(self, cfg, workers: int) -> None:
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.train.workers = int(workers)

    def finished(self, run_dir: str, length: int) -> bool:
        return run_finished(run_dir, length)

    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        train_run(cfg, run_dir=run_dir, config_file=options.config_file, resume=options.resume,
                  trust_pickle=options.trust_pickle)

    def evaluate(self, options: RunOptions, cfg, run_dir: str) -> None:
        evaluate_checkpoint(cfg, run_dir=run_dir, checkpoint=eval_checkpoint(node(cfg, "train"), run_dir),
                            config_file=options.config_file, trust_pickle=options.trust_pickle)

    def stale_files(self, run_dir: str) -> List[str]:
        names = (FINAL_FILENAME, FINAL_SAFETENSORS, PREDICTIONS_FILENAME)
        return (list(find_checkpoints(run_dir).values()) + list(find_classification_evals(run_dir).values())
                + [os.path.join(run_dir, n) for n in names])
