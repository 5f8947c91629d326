"""The detection stage: detectron2 detectors (Mask R-CNN, DETR-style) trained with an arm, box / mask AP recorded."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..records.layout import RunSpec
from ..records.per_image import find_detection_evals
from ..stage import DETECTION, ConfigDefaults, RunOptions, Stage
from ..utils.errors import UsageError
from .config import (
    DEFAULT_SEED,
    arm_spec,
    check_arm_sites,
    check_run,
    check_shared_checkpoints,
    get_device,
    get_max_iter,
    get_output_dir,
    get_seed,
    is_yacs,
    load_config,
    prepare_config,
    run_identity,
)

__all__ = ["DetectionStage"]

EXAMPLES = """
Examples:

Train one arm on one machine (lazy config, CPU):
    $ condinit-train --config-file configs/demo/mask_rcnn_vit_tiny.py --arm conditioned

Every run goes to <output_dir>/<arm>/seed<k>/. Train the three arms, then write the comparison into
<output_dir>/report/ (several seeds; a learning-rate scan on the first seed):
    $ condinit-train --config-file cfg.py --arm all train.output_dir=output/exp1
    $ condinit-train --config-file cfg.py --arm all --seeds 0,1,2 --lr-scale 0.5,1,2 train.output_dir=output/exp1

Resume (finished runs are skipped; a run directory never changes arm, seed or patterns; a diverged run
is not retried, one that failed with an error continues from its last checkpoint):
    $ condinit-train --config-file cfg.py --arm all --resume train.output_dir=output/exp1
Train the failed and diverged runs afresh (their old directories are moved aside to <run>.failed<n>/):
    $ condinit-train --config-file cfg.py --arm all --retry-failed train.output_dir=output/exp1

Fine-tune each arm from its own pretrained backbone:
    $ condinit-train --config-file cfg.py --arm all "train.init_checkpoint='output/pretrain/{arm}/seed{seed}'"

Run on 8 GPUs / on several machines:
    $ condinit-train --num-gpus 8 --config-file cfg.py train.device=cuda
    (machine0)$ condinit-train --machine-rank 0 --num-machines 2 --dist-url <URL> [--other-flags]
    (machine1)$ condinit-train --machine-rank 1 --num-machines 2 --dist-url <URL> [--other-flags]
"""


class DetectionStage(Stage):
    """Detection with detectron2: lazy ``.py`` configs (and yacs ``.yaml`` ones); the length is
    ``train.max_iter`` iterations; each evaluation adds an ``"ap"`` record."""

    descriptor = DETECTION
    description = "Train or evaluate a detectron2 detector with an attention-initialization arm."
    examples = EXAMPLES
    config_help = (
        "a lazy .py or yacs .yaml config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)"
    )

    def load_config(self, config_file: str, opts: Sequence[str]):
        return load_config(config_file, list(opts or []))

    def defaults(self, cfg) -> ConfigDefaults:
        arm = arm_spec(cfg).arm if is_yacs(cfg) or cfg.get("condinit") is not None else "default"
        return ConfigDefaults(output_dir=get_output_dir(cfg), arm=arm, seed=max(get_seed(cfg), DEFAULT_SEED))

    def configure_run(self, cfg, spec: RunSpec, run_dir: str, *, init_from: Optional[str] = None):
        if init_from is not None:
            if is_yacs(cfg):
                cfg.defrost()
                cfg.MODEL.WEIGHTS = init_from
            else:
                cfg.train.init_checkpoint = init_from
        return prepare_config(cfg, arm=spec.arm, output_dir=run_dir, seed=spec.seed, lr_scale=spec.lr_scale)

    def length(self, cfg) -> int:
        return get_max_iter(cfg)

    def steps(self, cfg) -> int:
        return get_max_iter(cfg)

    def device(self, cfg) -> str:
        return get_device(cfg)

    def identity(self, cfg) -> dict:
        return run_identity(cfg)

    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]],
              *, upstream: Optional[str] = None) -> None:
        if options.eval_only and len(runs) > 1:
            raise UsageError("--eval-only evaluates one checkpoint; it cannot be combined with several arms, --seeds "
                             "or --lr-scale")
        if not is_yacs(runs[0][1]):
            check_arm_sites(runs[0][1])  # the runs differ in arm, seed and lr only: the same sites
        for _, cfg in runs:
            check_run(cfg, resume=options.resume, eval_only=options.eval_only, trust_pickle=options.trust_pickle,
                      allow_shared_checkpoint=options.allow_shared_checkpoint, upstream=upstream)
        check_shared_checkpoints(runs, allow_shared_checkpoint=options.allow_shared_checkpoint)

    def loader_workers(self, cfg) -> Optional[int]:
        if is_yacs(cfg):
            return int(cfg.DATALOADER.NUM_WORKERS)
        node = cfg.dataloader.get("train")
        return int(node.num_workers) if node is not None and "num_workers" in node else None

    def set_loader_workers(self, cfg, workers: int) -> None:
        if is_yacs(cfg):
            cfg.defrost()
            cfg.DATALOADER.NUM_WORKERS = int(workers)
            cfg.freeze()
            return
        for split in ("train", "test"):
            node = cfg.dataloader.get(split)
            if node is not None and "num_workers" in node:
                node.num_workers = int(workers)

    def stale_files(self, run_dir: str) -> List[str]:
        return list(find_detection_evals(run_dir).values())  # an earlier run's per-image data

    def finished(self, run_dir: str, length: int) -> bool:
        from .train import final_recorded

        return final_recorded(run_dir, length)

    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        from .train import run

        run(options, cfg)

    def evaluate(self, options: RunOptions, cfg, run_dir: str) -> None:
        from .train import run

        run(options, cfg)
