"""The command line behind ``tools/pretrain_net.py``: plan and validate an experiment, then run it per process.

``prepare_experiment`` runs once per machine before any training process starts: it loads the
config, checks everything a run needs (arm options, model name and kwargs, dataset folders and
class count, batch split, resume identity) and raises :class:`UsageError` -- one line, exit status 2,
nothing written -- on bad input; then it writes ``<output_dir>/experiment.json``. ``main`` is what
``detectron2.engine.launch`` calls in every process: it trains (or evaluates) the planned runs and,
when there are several, prints the comparison report.
"""
from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import List, Optional

import torch

from ..init import ARMS
from ..runs import ARM_CHOICES, RunSpec, check_resume_identity, parse_lr_scales, parse_seeds, plan_runs, write_plan
from .checkpoint import FINAL_FILENAME
from .config import DEFAULTS, UsageError, arm_spec, load_config, node, run_identity
from .data import build_mixup, check_dataset_folders
from .model import check_arm_sites, create_classifier
from .trainer import evaluate_checkpoint, run_finished, total_epochs, train_run
from .writers import setup_logging

__all__ = ["Experiment", "REPORT_DIRNAME", "build_argument_parser", "configure_run", "main", "prepare_experiment"]

REPORT_DIRNAME = "report"
logger = logging.getLogger("condinit_det.pretrain")

_EPILOG = """
Examples:

Train the tiny CPU demo, three arms, then print the comparison:
    $ tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/p

One arm, three seeds, and a learning-rate scan on the first seed:
    $ tools/pretrain_net.py --config-file CFG.py --arm conditioned --seeds 0,1,2 --lr-scale 0.5,1,2

Resume (finished runs are skipped; a run directory never changes arm or seed):
    $ tools/pretrain_net.py --config-file CFG.py --arm all --resume train.output_dir=output/p

ImageNet on 8 GPUs, or on 2 machines (R = 0 on the first, 1 on the second):
    $ tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/vit_b16_deit_300ep.py data.root=/data/imagenet
    $ tools/pretrain_net.py --num-gpus 8 --num-machines 2 --machine-rank R --dist-url tcp://HOST0:PORT --config-file ...

Evaluate a run's model_final.pth (or train.init_checkpoint=PATH):
    $ tools/pretrain_net.py --config-file CFG.py --arm conditioned --eval-only train.output_dir=output/p
"""


def build_argument_parser():
    """detectron2's ``default_argument_parser`` plus ``--arm``, ``--seeds``, ``--lr-scale``, ``--allow-changed-run``."""
    from detectron2.engine import default_argument_parser

    parser = default_argument_parser(epilog=_EPILOG)
    parser.description = "Classification pretraining of a timm model with an attention-initialization arm."
    parser._option_string_actions["--resume"].help = (
        "continue every planned run after its last complete epoch (checkpoint_epochNNNN.pth); finished runs "
        "are skipped; a run directory is never resumed with another arm, seed or arm options")
    parser._option_string_actions["--eval-only"].help = (
        "evaluate each planned run's model_final.pth (or train.init_checkpoint=PATH) and add a cls_eval record")
    parser.add_argument("--arm", choices=ARM_CHOICES, default=None,
                        help="attention-init arm (sets condinit.arm); 'all' trains default, mimetic and conditioned. "
                             "Default: the config's condinit.arm.")
    parser.add_argument("--seeds", default=None,
                        help="training seeds, e.g. '0,1,2' or '0-2' (default: the config's train.seed)")
    parser.add_argument("--lr-scale", default="1",
                        help="multipliers of the config's learning rate, e.g. '0.5,1,2'; scales other than 1 run "
                             "on the first seed only")
    parser.add_argument("--allow-changed-run", action="store_true",
                        help="resume a run directory even if its arm, seed, patterns or options differ")
    return parser


@dataclass
class Experiment:
    """The planned runs of one invocation."""

    base: str
    runs: List[RunSpec]
    config_file: str
    opts: List[str]
    epochs: int
    device: str = "cpu"  # train.device: a CPU run's workers see no CUDA device (condinit_det.distributed.launch)


def configure_run(cfg, run: RunSpec):
    """Set the run's arm and training seed in ``cfg`` (in place); ``condinit.seed`` follows ``train.seed`` unless set."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        if cfg.get("condinit") is None:
            cfg.condinit = OmegaConf.create({"arm": run.arm})
        cfg.condinit.arm = run.arm
        cfg.train.seed = int(run.seed)
    return cfg


def _config_arm(cfg) -> str:
    from ..arm_node import plain

    return str((plain(cfg.get("condinit")) or {}).get("arm", "default"))


def prepare_experiment(args, *, write: bool = True) -> Experiment:
    """Validate the invocation (UsageError on bad input, before anything is written) and write the plan.

    Attaches the result to ``args.experiment`` so that every training process gets it through ``launch``.
    """
    cfg = load_config(args.config_file, args.opts)
    nodes = {name: node(cfg, name) for name in DEFAULTS}
    train, data, augment = nodes["train"], nodes["data"], nodes["augment"]
    try:
        seeds = parse_seeds(args.seeds) if args.seeds is not None else [max(int(train["seed"]), 0)]
        scales = parse_lr_scales(args.lr_scale)
    except ValueError as e:
        raise UsageError(str(e)) from None
    arms = list(ARMS) if args.arm == "all" else [args.arm or _config_arm(cfg)]
    try:
        runs = plan_runs(arms, seeds, scales)
    except ValueError as e:
        raise UsageError(f"condinit.arm: {e}") from None
    base = str(train["output_dir"] or "")
    if not base:
        raise UsageError("train.output_dir is empty; runs go to <train.output_dir>/<arm>/seed<k>/")
    world = int(args.num_gpus) * int(args.num_machines)
    batch = int(train["batch_size"])
    if world < 1 or batch % world:
        raise UsageError(f"train.batch_size={batch} does not split over {world} process(es); use a multiple of {world}")
    if build_mixup(augment, 2) is not None and (batch // world) % 2:
        raise UsageError(f"mixup/cutmix need an even batch per process; train.batch_size={batch} over {world} "
                         f"process(es) gives {batch // world}")
    if str(train["device"]).startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("train.device='cuda' but no CUDA device is available; pass train.device=cpu")
    if data.get("num_classes") is None:
        raise UsageError("data.num_classes is not set; it must equal the number of class folders")
    _, classes = check_dataset_folders(data)
    try:  # no weights needed to check the name, the kwargs and the attention sites
        with torch.device("meta"):
            model = create_classifier(nodes["model"], len(classes))
    except NotImplementedError:
        model = create_classifier(nodes["model"], len(classes))
    specs = {}
    for run in runs:
        configure_run(cfg, run)
        spec = specs[(run.arm, run.seed)] = arm_spec(cfg, run.seed)
        check_arm_sites(model, spec)
    del model
    if args.resume and not args.eval_only:
        for run in runs:
            try:
                check_resume_identity(run.path(base), run_identity(specs[(run.arm, run.seed)], seed=run.seed,
                                                                   lr_scale=run.lr_scale),
                                      allow_change=args.allow_changed_run)
            except ValueError as e:
                raise UsageError(str(e)) from None
    if args.eval_only:
        given = train.get("init_checkpoint")
        for run in runs:
            path = given or os.path.join(run.path(base), FINAL_FILENAME)
            if not os.path.isfile(path):
                raise UsageError(f"--eval-only: {path} does not exist; train the run first or pass "
                                 "train.init_checkpoint=PATH")
    experiment = Experiment(base=base, runs=runs, config_file=args.config_file, opts=list(args.opts),
                            epochs=total_epochs(cfg), device=str(train["device"]))
    if write and not args.eval_only and int(getattr(args, "machine_rank", 0)) == 0:
        write_plan(base, runs, stage="pretrain", config=args.config_file)
    args.experiment = experiment
    return experiment


def main(args) -> Optional[str]:
    """Per-process entry point: train (or evaluate) every planned run; print the comparison when there are several."""
    from detectron2.utils import comm

    setup_logging(None, rank=comm.get_rank())  # console only, until each run logs into its own folder
    experiment: Experiment = getattr(args, "experiment", None) or prepare_experiment(args, write=comm.is_main_process())
    for run in experiment.runs:
        cfg = configure_run(load_config(experiment.config_file, experiment.opts), run)
        run_dir = run.path(experiment.base)
        if args.eval_only:
            train = node(cfg, "train")
            checkpoint = train.get("init_checkpoint") or os.path.join(run_dir, FINAL_FILENAME)
            evaluate_checkpoint(cfg, run=run, run_dir=run_dir, checkpoint=checkpoint,
                                config_file=experiment.config_file)
            continue
        if args.resume and run_finished(run_dir, experiment.epochs):
            setup_logging(None, rank=comm.get_rank())
            logger.info(f"{run_dir}: finished earlier; skipped, results kept")
            continue
        train_run(cfg, run=run, run_dir=run_dir, config_file=experiment.config_file, resume=args.resume,
                  allow_changed_run=args.allow_changed_run)
        comm.synchronize()
        gc.collect()
    text = None
    if len(experiment.runs) > 1 and not args.eval_only and comm.is_main_process():
        from ..report import compare_arms

        report_dir = os.path.join(experiment.base, REPORT_DIRNAME)
        _, text = compare_arms([experiment.base], output_dir=report_dir)
        print(text, flush=True)
        print(f"Report written to {report_dir}", flush=True)
    comm.synchronize()
    return text
