"""The command line behind ``tools/pretrain_net.py``: plan and validate an experiment, then run it per process.

``prepare_experiment`` runs once per machine before any training process starts: it loads the
config, checks everything a run needs (arm options, model name and kwargs, dataset folders and
class count, batch split, resume identity) and raises :class:`UsageError` -- one line, exit status 2,
nothing written -- on bad input; then it writes ``<output_dir>/experiment.json``. ``execute`` runs
each planned run in a launch of its own (``run_worker`` is what ``detectron2.engine.launch`` calls in
every process): a run that diverges or raises is recorded as failed (:func:`condinit_det.records.layout.execute_runs`),
every process of it stops, and the next run starts; with several runs it prints the comparison.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
from dataclasses import dataclass
from typing import List, Optional

import torch

from ..utils.checkpoint_io import TRUST_FLAG, check_loadable, final_weights_file
from ..init import ARMS
from ..launch.slurm import add_slurm_arguments
from ..records.layout import ARM_CHOICES, RunSpec, parse_lr_scales, parse_seeds, plan_runs, write_plan
from ..utils.preemption import Preempted
from ..records.identity import check_resume_identity
from ..launch.experiment import execute_runs
from ..records.failures import note_failure
from .checkpoint import FINAL_FILENAME, last_checkpoint
from .config import DEFAULTS, UsageError, arm_spec, load_config, node, run_identity
from .data import build_mixup, check_dataset_folders
from .model import check_arm_sites, create_classifier
from .trainer import evaluate_checkpoint, run_finished, total_epochs, train_run
from .writers import setup_logging

__all__ = ["Experiment", "REPORT_DIRNAME", "build_argument_parser", "configure_run", "execute", "prepare_experiment",
           "run_worker"]

REPORT_DIRNAME = "report"
logger = logging.getLogger("condinit_det.pretrain")

_EPILOG = """
Examples:

Train the tiny CPU demo, three arms, then print the comparison:
    $ tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/p

One arm, three seeds, and a learning-rate scan on the first seed:
    $ tools/pretrain_net.py --config-file CFG.py --arm conditioned --seeds 0,1,2 --lr-scale 0.5,1,2

Resume (finished runs are skipped; a run directory never changes arm or seed; a diverged run is not
retried, one that failed with an error continues from its last checkpoint):
    $ tools/pretrain_net.py --config-file CFG.py --arm all --resume train.output_dir=output/p
Train the failed and diverged runs afresh (their old directories are moved aside to <run>.failed<n>/):
    $ tools/pretrain_net.py --config-file CFG.py --arm all --retry-failed train.output_dir=output/p

ImageNet on 8 GPUs, or on 2 machines (R = 0 on the first, 1 on the second):
    $ tools/pretrain_net.py --num-gpus 8 --config-file configs/ImageNet/vit_b16_deit_300ep.py data.root=/data/imagenet
    $ tools/pretrain_net.py --num-gpus 8 --num-machines 2 --machine-rank R --dist-url tcp://HOST0:PORT --config-file ...

Evaluate a run's model_final.safetensors or .pth (or train.init_checkpoint=PATH):
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
        "evaluate each planned run's model_final.safetensors (else .pth; or train.init_checkpoint=PATH) and add a "
        "cls_eval record")
    parser.add_argument("--arm", choices=ARM_CHOICES, default=None,
                        help="attention-init arm (sets condinit.arm); 'all' trains default, mimetic and conditioned. "
                             "Default: the config's condinit.arm.")
    parser.add_argument("--seeds", default=None,
                        help="training seeds, e.g. '0,1,2' or '0-2' (default: the config's train.seed)")
    parser.add_argument("--lr-scale", default="1",
                        help="multipliers of the config's learning rate, e.g. '0.5,1,2'; scales other than 1 run "
                             "on the first seed only")
    parser.add_argument("--retry-failed", action="store_true",
                        help="implies --resume; also train the runs that failed or diverged afresh, moving their old "
                             "run directories aside to <run>.failed<n>/ (--resume alone skips a diverged run and "
                             "continues one that failed with an error from its last checkpoint)")
    add_slurm_arguments(parser)
    parser.add_argument("--allow-changed-run", action="store_true",
                        help="resume a run directory even if its arm, seed, patterns or options differ")
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="load checkpoints that need full unpickling (.pkl, or .pth holding objects), which can "
                             "run code stored in them; only for files from a source you trust")
    return parser


@dataclass
class Experiment:
    """The planned runs of one invocation."""

    base: str
    runs: List[RunSpec]
    config_file: str
    opts: List[str]
    epochs: int
    device: str = "cpu"  # train.device: a CPU run's workers see no CUDA device (condinit_det.utils.distributed.launch)


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
    from ..init.spec import plain

    return str((plain(cfg.get("condinit")) or {}).get("arm", "default"))


def prepare_experiment(args, *, write: bool = True) -> Experiment:
    """Validate the invocation (UsageError on bad input, before anything is written) and write the plan.

    Attaches the result to ``args.experiment`` so that every training process gets it through ``launch``.
    """
    if getattr(args, "retry_failed", False) or getattr(args, "slurm", False):
        args.resume = True  # a submission continues what exists: resubmitting is always safe
    if getattr(args, "slurm", False) and args.eval_only:
        raise UsageError("--slurm submits training runs; run --eval-only directly")
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
    slurm = getattr(args, "slurm", False)
    if slurm:  # each array element runs with its allocation's processes (condinit_det.launch.cluster)
        args.num_machines = args.nodes
        args.num_gpus = args.gpus_per_node or args.num_gpus
    world = int(args.num_gpus) * int(args.num_machines)
    batch = int(train["batch_size"])
    if world < 1 or batch % world:
        raise UsageError(f"train.batch_size={batch} does not split over {world} process(es); use a multiple of {world}")
    if build_mixup(augment, 2) is not None and (batch // world) % 2:
        raise UsageError(f"mixup/cutmix need an even batch per process; train.batch_size={batch} over {world} "
                         f"process(es) gives {batch // world}")
    if str(train["device"]).startswith("cuda") and not slurm:  # a login node may have no GPU
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
    trust = args.trust_pickle
    if args.resume and not args.eval_only:
        for run in runs:
            try:
                check_resume_identity(run.path(base), run_identity(specs[(run.arm, run.seed)], seed=run.seed,
                                                                   lr_scale=run.lr_scale),
                                      allow_change=args.allow_changed_run)
                last = last_checkpoint(run.path(base))
                if last:
                    check_loadable(last, trust_pickle=trust)
            except ValueError as e:
                raise UsageError(str(e)) from None
    if args.eval_only:
        for run in runs:
            path = eval_checkpoint(train, run.path(base))
            if not os.path.isfile(path):
                raise UsageError(f"--eval-only: {path} does not exist; train the run first or pass "
                                 "train.init_checkpoint=PATH")
            try:
                check_loadable(path, trust_pickle=trust)
            except ValueError as e:
                raise UsageError(str(e)) from None
    experiment = Experiment(base=base, runs=runs, config_file=args.config_file, opts=list(args.opts),
                            epochs=total_epochs(cfg), device=str(train["device"]))
    if write and not args.eval_only and int(getattr(args, "machine_rank", 0)) == 0:
        write_plan(base, runs, stage="pretrain", config=args.config_file,
                   length={"unit": "epoch", "total": experiment.epochs})
    args.experiment = experiment
    return experiment


def eval_checkpoint(train, run_dir: str) -> str:
    """What --eval-only evaluates: ``train.init_checkpoint``, else the run's ``model_final.safetensors``
    (else ``model_final.pth``)."""
    return train.get("init_checkpoint") or final_weights_file(run_dir) or os.path.join(run_dir, FINAL_FILENAME)


def run_worker(args, run: RunSpec, experiment: Experiment) -> None:
    """Per-process entry point of one planned run: train it (or with --eval-only evaluate it). A failure
    leaves a note in the run directory for :func:`execute` and is re-raised."""
    from detectron2.utils import comm

    cfg = configure_run(load_config(experiment.config_file, experiment.opts), run)
    run_dir = run.path(experiment.base)
    if args.eval_only:
        evaluate_checkpoint(cfg, run=run, run_dir=run_dir, checkpoint=eval_checkpoint(node(cfg, "train"), run_dir),
                            config_file=experiment.config_file, trust_pickle=args.trust_pickle)
        return
    try:
        train_run(cfg, run=run, run_dir=run_dir, config_file=experiment.config_file, resume=args.resume,
                  allow_changed_run=args.allow_changed_run, trust_pickle=args.trust_pickle)
    except Preempted:
        raise
    except Exception as e:
        if os.path.isdir(run_dir) and note_failure(run_dir, e, rank=comm.get_rank()):
            logger.exception(f"Run {run_dir} failed:")
        raise


def execute(args, only: Optional[RunSpec] = None) -> int:
    """Train (or evaluate) every planned run, each in a launch of its own; print the comparison when there are
    several. Returns the exit status: 1 when a run failed or diverged (named on the last lines), else 0.
    Call :func:`prepare_experiment` first. ``only``: that planned run alone (a Slurm array element)."""
    from ..utils.distributed import launch

    setup_logging(None, rank=0)  # console only, until each run logs into its own folder
    if getattr(args, "experiment", None) is None:
        prepare_experiment(args, write=False)
    experiment: Experiment = args.experiment
    if only is not None:
        experiment = dataclasses.replace(experiment, runs=[r for r in experiment.runs if r == only])
    main_launcher = int(args.machine_rank) == 0

    def launch_run(run: RunSpec):
        try:
            launch(run_worker, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
                   dist_url=args.dist_url, args=(args, run, experiment), device=experiment.device)
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            setup_logging(None, rank=0)

    if args.eval_only:
        for run in experiment.runs:
            launch_run(run)
        return 0
    outcomes = execute_runs(experiment.runs, experiment.base, launch=launch_run,
                            finished=lambda run: run_finished(run.path(experiment.base), experiment.epochs),
                            resume=args.resume, retry_failed=getattr(args, "retry_failed", False),
                            config=experiment.config_file, main=main_launcher, log=logger)
    from ..launch.experiment import finish_experiment

    return finish_experiment(experiment.base, outcomes,
                             report=len(experiment.runs) > 1 and main_launcher and only is None)


def submit_to_slurm(args) -> int:
    """``--slurm``: submit every unfinished planned run as an element of one job array and a report job after
    them (:mod:`condinit_det.launch.cluster`); returns 0 once submitted. Call :func:`prepare_experiment` first."""
    from ..launch.cluster import submit_experiment

    experiment: Experiment = args.experiment
    submit_experiment(args, stage="pretrain", base=experiment.base, specs=experiment.runs,
                      finished=lambda run: run_finished(run.path(experiment.base), experiment.epochs),
                      name="condinit-pretrain", report=len(experiment.runs) > 1)
    return 0
