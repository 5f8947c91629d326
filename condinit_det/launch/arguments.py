"""The command line of every training command: detectron2's flags, the experiment flags and the Slurm flags.

Both training commands (``condinit-train``, ``condinit-pretrain``) build their parser here, so every shared flag
has one text and one default. :func:`experiment_namespace` gives the same namespace to callers without a command
line (the protocol, scripts).
"""
from __future__ import annotations

import argparse
from typing import Optional

from ..init import ARMS, PAPER_ARMS
from ..utils.checkpoint_io import TRUST_FLAG
from .slurm import add_slurm_arguments

__all__ = ["add_cost_arguments", "add_experiment_arguments", "build_parser", "experiment_namespace"]


def add_experiment_arguments(parser: argparse.ArgumentParser, *, cost: bool = True) -> argparse.ArgumentParser:
    """Add the flags of an experiment (arms, seeds, lr scales, resume rules, the report, ``--dry-run``) as one
    group; ``cost``: with the flags of the dry run's cost estimate (:func:`add_cost_arguments`)."""
    g = parser.add_argument_group("Experiments (several runs, then the comparison)")
    g.add_argument(
        "--arm", default=None, metavar="ARMS",
        help=f"attention-init arm(s): one of {', '.join(ARMS)}; 'all' ({', '.join(PAPER_ARMS)}); or a comma-separated "
        "list (e.g. 'all,scale_matched'). Several arms train with the same seeds into <output_dir>/<arm>/seed<k>/ and "
        "end with the comparison in <output_dir>/report/. Default: the config's condinit.arm")
    g.add_argument(
        "--seeds", default=None, metavar="LIST",
        help="training seeds, e.g. '0,1,2' or '0-2': one run per arm and seed in <output_dir>/<arm>/seed<k>/ (the "
        "arm's seed follows the training seed). Default: the config's seed")
    g.add_argument(
        "--lr-scale", default=None, metavar="LIST",
        help="multipliers of the config's learning rate, e.g. '0.5,1,2': the scales other than 1 run for every arm "
        "on the first seed, into <output_dir>/<arm>/seed<k>-lr<s>/. Default: 1")
    g.add_argument(
        "--bootstrap", type=int, default=1000, metavar="B",
        help="resamples of the evaluation images for the confidence intervals of the report written at the end of "
        "an experiment (0: none). Default: 1000")
    g.add_argument(
        "--retry-failed", action="store_true",
        help="implies --resume; also train the runs that failed or diverged afresh, moving their old run directories "
        "aside to <run>.failed<n>/ (--resume alone skips a diverged run and continues one that failed with an error "
        "from its last checkpoint)")
    g.add_argument(
        "--allow-changed-run", action="store_true",
        help="let --resume continue a run directory started with another arm, seed, patterns, options or lr scale")
    g.add_argument(
        "--allow-shared-checkpoint", action="store_true",
        help="detection only (pretraining starts from random weights): allow train.init_checkpoint to give an arm "
        "weights that are not its own (the same checkpoint for every arm, or another arm's pretraining run)")
    g.add_argument(
        TRUST_FLAG, action="store_true",
        help="load checkpoints that need full unpickling (.pkl, e.g. detectron2:// model-zoo files, or .pth holding "
        "objects), which can run code stored in them; only for files from a source you trust")
    g.add_argument(
        "--dry-run", action="store_true",
        help="check everything and print the plan (every run, its length, its processes, what --slurm would submit "
        "and what it costs) without training or submitting anything")
    if cost:
        add_cost_arguments(g)
    return parser


def add_cost_arguments(group, *, prefixes=("",)) -> None:
    """``--step-bench`` and ``--<prefix>step-time`` (one per prefix): where ``--dry-run`` takes the step time of
    its cost estimate from."""
    group.add_argument(
        "--step-bench", default=None, metavar="FILE",
        help="with --dry-run: the step times measured by bench/bench_gpu_step.py --output FILE (the default arm's "
        "median step of each config), for the cost estimate")
    for prefix in prefixes:
        stage = f" of the {prefix.rstrip('-')} runs" if prefix else ""
        group.add_argument(
            f"--{prefix}step-time", type=float, default=None, metavar="SECONDS",
            help=f"with --dry-run: seconds per optimizer step{stage} (all GPUs of a run together), for the cost "
            "estimate instead of --step-bench")


def build_parser(*, description: str = "", examples: str = "", config_help: str = "") -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` (``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``,
    ``--num-machines``, ``--machine-rank``, ``--dist-url``, trailing ``key=value`` overrides) with the experiment
    and Slurm flags. ``description``/``examples``/``config_help``: the command's own texts."""
    from detectron2.engine import default_argument_parser

    parser = default_argument_parser(epilog=examples)
    parser.description = description or None
    actions = parser._option_string_actions  # detectron2's texts describe its own trainer: say what these do here
    actions["--config-file"].help = config_help or "a config file: a path, or a model-zoo name zoo:NAME"
    actions["--resume"].help = (
        "continue every planned run from its last checkpoint; finished runs are skipped, a diverged run is not "
        "retried; a run directory is never resumed with another arm, seed, patterns, options or lr scale")
    actions["--eval-only"].help = (
        "evaluate a checkpoint instead of training: train.init_checkpoint=PATH, else the run's final weights (with "
        "--resume: its last checkpoint), and add an evaluation record to the run's results.json")
    add_experiment_arguments(parser)
    add_slurm_arguments(parser)
    return parser


def experiment_namespace(parser: Optional[argparse.ArgumentParser] = None, **values) -> argparse.Namespace:
    """Every flag of :func:`build_parser` at its default, then ``values`` (by destination name, e.g.
    ``config_file=...``, ``seeds="0,1"``, ``opts=[...]``); unknown names raise TypeError."""
    parser = parser or build_parser()
    args = parser.parse_args([])
    unknown = sorted(set(values) - set(vars(args)))
    if unknown:
        raise TypeError(f"unknown experiment option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(vars(args)))}")
    for key, value in values.items():
        setattr(args, key, value)
    return args
