"""The detection stage: detectron2 detectors (Mask R-CNN, DETR-style) trained with an arm, box / mask AP recorded."""

import os
from typing import List, Optional, Sequence, Tuple

import torch

from ..records.layout import RunSpec, find_plans, read_plan
from ..stage import DETECTION, ConfigDefaults, RunOptions, Stage
from ..utils.errors import UsageError
from .checkpoint import pretrain_checkpoint_file
from .config import (
    DEFAULT_SEED,
    arm_spec,
    check_arm_sites,
    check_run,
    check_shared_checkpoints,
    dataset_names,
    load_config,
    prepare_config,
    run_identity,
)

__all__ = ["DetectionStage"]

_LAZY_RUN_KEYS = ("condinit.arm", "condinit.seed", "train.seed", "train.output_dir", "train.trackers")
_YACS_RUN_KEYS = ("yacs.MODEL.CONDINIT", "yacs.SEED", "yacs.OUTPUT_DIR", "yacs.TRACKERS")  # a yacs config's values


class DetectionStage(Stage):
    """Detection with detectron2: lazy ``.py`` configs (and yacs ``.yaml`` ones, converted); the length is
    ``train.max_iter`` iterations; each evaluation adds an ``"ap"`` record."""

    descriptor = DETECTION
    run_keys = _LAZY_RUN_KEYS + _YACS_RUN_KEYS

    def load_config(self, config_file: str, opts: Sequence[str]):
        return load_config(config_file, list(opts or []))

    def defaults(self, cfg) -> ConfigDefaults:
        return ConfigDefaults(
            output_dir=cfg.train.output_dir,
            arm=arm_spec(cfg).arm,
            seed=max(int(cfg.train.get("seed", -1)), DEFAULT_SEED),
        )

    def configure_run(self, cfg, spec: RunSpec, run_dir: str, *, init_from: Optional[str] = None):
        if init_from is not None:
            cfg.train.init_checkpoint = init_from
        return prepare_config(cfg, arm=spec.arm, output_dir=run_dir, seed=spec.seed, lr_scale=spec.lr_scale)

    def length(self, cfg) -> int:
        return int(cfg.train.max_iter)

    steps = length  # one optimizer step per iteration

    def device(self, cfg) -> str:
        return str(cfg.train.device)

    def identity(self, cfg) -> dict:
        return run_identity(cfg)

    def dataset(self, cfg) -> Optional[str]:
        return next(iter(dataset_names(cfg)), None)

    def evaluation_data(self, cfg) -> Optional[str]:
        return next(reversed(dataset_names(cfg)), None)  # the evaluator's

    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]], *, upstream: Optional[str] = None) -> None:
        if options.eval_only and len(runs) > 1:
            raise UsageError(
                "--eval-only evaluates one checkpoint; it cannot be combined with several arms, --seeds or --lr-scale"
            )
        device = self.device(runs[0][1])
        if device.startswith("cuda") and not (options.submitted or options.dry_run) and not torch.cuda.is_available():
            raise UsageError(
                f"train.device={device!r} (MODEL.DEVICE for yacs configs) but no CUDA device is "
                "available; pass train.device=cpu (MODEL.DEVICE cpu)"
            )
        check_arm_sites(runs[0][1])  # the runs differ in arm, seed and lr only: the same sites
        for _, cfg in runs:
            # A dry run prices a fine-tuning whose pretraining is not trained yet: its folder counts as the upstream.
            waits = self.waits_for(cfg, upstream) if options.dry_run else None
            check_run(
                cfg,
                resume=options.resume,
                eval_only=options.eval_only,
                trust_pickle=options.trust_pickle,
                allow_shared_checkpoint=options.allow_shared_checkpoint,
                upstream=os.path.dirname(waits) if waits else upstream,
                data=not options.dry_run,
            )
        check_shared_checkpoints(runs, allow_shared_checkpoint=options.allow_shared_checkpoint)

    def waits_for(self, cfg, upstream: Optional[str] = None) -> Optional[str]:
        init = cfg.train.get("init_checkpoint") or ""
        if not init or "://" in init:
            return None
        try:
            if os.path.isfile(pretrain_checkpoint_file(init)):
                return None
        except FileNotFoundError:  # a pretraining run directory without its final weights yet
            return init
        # Not there yet: a run of the upstream experiment, or one that a plan lists, else a path that is missing.
        if upstream and os.path.abspath(init).startswith(os.path.join(os.path.abspath(upstream), "")):
            return init
        plans = [read_plan(base) for base in find_plans(init)]
        listed = [os.path.abspath(s.path(p.base)) for p in plans if p for s in p.runs]
        return init if os.path.abspath(init) in listed else None

    def loader_workers(self, cfg) -> Optional[int]:
        return cfg.dataloader.train.get("num_workers")

    def set_loader_workers(self, cfg, workers: int) -> None:
        for split in ("train", "test"):
            node = cfg.dataloader.get(split)
            if node is not None and "num_workers" in node:
                node.num_workers = int(workers)

    def finished(self, run_dir: str, length: int) -> bool:
        from .train import final_recorded

        return final_recorded(run_dir, length)

    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        from .train import run

        run(options, cfg)

    evaluate = train  # run() evaluates with options.eval_only
