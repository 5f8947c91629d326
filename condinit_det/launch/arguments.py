"""The command line of every training command: detectron2's flags, the experiment flags and the Slurm flags.

Both training commands and the protocol build their parsers here, so every shared flag has one text and one
default. Building a parser imports neither torch nor detectron2: ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Callable, Tuple

from ..init.options import ARMS, FACTORIAL_ARMS, PAPER_ARMS
from ..utils.checkpoint_io import TRUST_FLAG

__all__ = [
    "add_cost_arguments",
    "add_experiment_arguments",
    "add_slurm_arguments",
    "build_parser",
    "parse_arguments",
    "parse_time_minutes",
]

_EXTRA_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")
_MEM = re.compile(r"^[0-9]+[KMGT]?$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def add_experiment_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the flags of an experiment (arms, seeds, lr scales, resume rules, the report, ``--dry-run``) as one
    group."""
    g = parser.add_argument_group("Experiments (several runs, then the comparison)")
    g.add_argument(
        "--arm",
        default=None,
        metavar="ARMS",
        help=f"attention-init arm(s): one of {', '.join(ARMS)}; 'all' ({', '.join(PAPER_ARMS)}); 'factorial' "
        f"({', '.join(FACTORIAL_ARMS)}: structure x scale); or a comma-separated list (e.g. 'all,scale_matched'). "
        "Several arms train with the same seeds into <output_dir>/<arm>/seed<k>/ and end with the comparison in "
        "<output_dir>/report/. Default: the config's condinit.arm",
    )
    g.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="training seeds, e.g. '0,1,2' or '0-2': one run per arm and seed in <output_dir>/<arm>/seed<k>/ (the "
        "arm's seed follows the training seed). Default: the config's seed",
    )
    g.add_argument(
        "--lr-scale",
        default=None,
        metavar="LIST",
        help="multipliers of the config's learning rate, e.g. '0.5,1,2': the scales other than 1 run for every arm "
        "on the first seed, into <output_dir>/<arm>/seed<k>-lr<s>/. Default: 1",
    )
    g.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="B",
        help="resamples of the evaluation images for the confidence intervals of the report written at the end of "
        "an experiment (0: none). Default: 1000",
    )
    g.add_argument(
        "--retry-failed",
        action="store_true",
        help="implies --resume; also train the runs that failed or diverged afresh, moving their old run directories "
        "aside to <run>.failed<n>/ (--resume alone skips a diverged run and continues one that failed with an error "
        "from its last checkpoint)",
    )
    g.add_argument(
        "--allow-changed-run",
        action="store_true",
        help="let --resume continue a run directory started with another arm, seed, patterns, options or lr scale",
    )
    g.add_argument(
        "--allow-shared-checkpoint",
        action="store_true",
        help="detection only (pretraining starts from random weights): allow train.init_checkpoint to give an arm "
        "weights that are not its own (the same checkpoint for every arm, or another arm's pretraining run)",
    )
    g.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="load checkpoints that need full unpickling (.pkl, e.g. detectron2:// model-zoo files, or .pth holding "
        "objects), which can run code stored in them; only for files from a source you trust",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and print the plan (every run, its length, its processes, what --slurm would submit "
        "and what it costs) without training or submitting anything",
    )
    return parser


def add_cost_arguments(group, *, prefixes=("",)) -> None:
    """``--step-bench`` and ``--<prefix>step-time`` (one per prefix): where ``--dry-run`` takes the step time of
    its cost estimate from."""
    group.add_argument(
        "--step-bench",
        default=None,
        metavar="FILE",
        help="with --dry-run: the step times measured by bench/bench_gpu_step.py --output FILE (the default arm's "
        "median step of each config), for the cost estimate",
    )
    for prefix in prefixes:
        stage = f" of the {prefix.rstrip('-')} runs" if prefix else ""
        group.add_argument(
            f"--{prefix}step-time",
            type=float,
            default=None,
            metavar="SECONDS",
            help=f"with --dry-run: seconds per optimizer step{stage} (all devices of a run together), for the cost "
            "estimate instead of --step-bench",
        )


def parse_time_minutes(value: str) -> int:
    """A time limit as whole minutes: ``"90"`` (minutes), ``"HH:MM:SS"`` or ``"D-HH:MM:SS"`` (seconds round up)."""
    text = str(value).strip()
    if text.isdigit():
        minutes = int(text)
    else:
        m = _TIME.match(text)
        if m is None:
            raise argparse.ArgumentTypeError(
                f"invalid time {value!r}: give minutes (e.g. 90), HH:MM:SS (e.g. 01:30:00) or D-HH:MM:SS"
            )
        days, hours, mins, secs = (int(g) if g else 0 for g in m.groups())
        if mins >= 60 or secs >= 60:
            raise argparse.ArgumentTypeError(f"invalid time {value!r}: minutes and seconds must be below 60")
        minutes = (((days * 24 + hours) * 60 + mins) * 60 + secs + 59) // 60
    if minutes <= 0:
        raise argparse.ArgumentTypeError(f"invalid time {value!r}: the time limit must be at least one minute")
    return minutes


def _at_least(name: str, minimum: int = 1) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"invalid {name} {value!r}: expected an integer >= {minimum}")
        return number

    return parse


def _mem(value: str) -> str:
    text = value.strip().upper().removesuffix("B")  # "64GB" is sbatch's "64G"
    if not _MEM.match(text):
        raise argparse.ArgumentTypeError(
            f"invalid memory {value!r}: expected a number with an optional unit K, M, "
            "G or T (e.g. 64G; 0 = all of the node's)"
        )
    return text


def _extra(value: str) -> Tuple[str, str]:
    key, sep, val = value.partition("=")
    key = key.strip().lstrip("-")
    if not sep or not _EXTRA_KEY.match(key) or not val:
        raise argparse.ArgumentTypeError(
            f"invalid --slurm-extra {value!r}: expected KEY=VALUE with an sbatch option "
            "name as KEY (e.g. reservation=mine, exclusive=true)"
        )
    return key.replace("_", "-"), val


def _name(kind: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise argparse.ArgumentTypeError(f"invalid {kind} {value!r}: expected a non-empty name without spaces")
        return value

    return parse


def add_slurm_arguments(parser: argparse.ArgumentParser, *, switch: bool = True) -> argparse.ArgumentParser:
    """Add the submission flags (one argument group); ``switch``: with the ``--slurm`` flag itself (a command that
    always submits has only the resource flags). Each array element is one run with ``--nodes`` nodes, one Slurm
    task per node holding ``--gpus-per-node`` GPUs and ``--cpus-per-task`` CPUs."""
    g = parser.add_argument_group("Slurm (submit the runs as a job array instead of running them here)")
    if switch:
        g.add_argument("--slurm", action="store_true", help="submit to Slurm with submitit and return")
    g.add_argument("--nodes", type=_at_least("node count"), default=1, help="nodes per run (default 1)")
    g.add_argument(
        "--gpus-per-node", type=_at_least("GPU count", 0), default=0, help="GPUs per node (default 0: CPU, gloo)"
    )
    g.add_argument(
        "--cpus-per-task",
        type=_at_least("CPU count"),
        default=None,
        help="CPUs per node (one task per node); the run's processes on a node divide them into threads "
        "and data-loader workers (also for a run on this machine when given)",
    )
    g.add_argument("--mem", type=_mem, default=None, help="memory per node, e.g. 64G (0: all of it)")
    g.add_argument(
        "--time", type=parse_time_minutes, default=60, help="time limit per job: minutes or HH:MM:SS (default 60)"
    )
    g.add_argument(
        "--signal-delay",
        type=_at_least("signal delay"),
        default=120,
        help="seconds before the time limit at which the job gets USR2, checkpoints and requeues itself (default 120)",
    )
    g.add_argument(
        "--partition", type=_name("partition"), default=None, help="Slurm partition (default: the cluster's)"
    )
    g.add_argument("--account", type=_name("account"), default=None)
    g.add_argument("--qos", type=_name("QOS"), default=None)
    g.add_argument("--constraint", type=str, default=None, help="node features, sbatch syntax (e.g. 'a100|h100')")
    g.add_argument(
        "--slurm-extra",
        type=_extra,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other sbatch option, repeatable (e.g. --slurm-extra reservation=mine)",
    )
    g.add_argument(
        "--max-parallel", type=_at_least("--max-parallel"), default=None, help="array elements running at once"
    )
    g.add_argument("--slurm-folder", default=None, help="submitit's scripts and logs (default <output_dir>/slurm/)")
    return parser


# A number argparse takes for a flag (it knows "-1" and "-0.5" only): a yacs override's value ("SOLVER.BASE_LR -1e-3").
_FLAG_LIKE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)e[+-]?\d+|-(inf|infinity|nan)", re.IGNORECASE)


def parse_arguments(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``parser.parse_intermixed_args(argv)`` (flags before or after the overrides), reading a negative number in
    scientific notation or ``-inf`` as a value, as a yacs override gives it (``SOLVER.BASE_LR -1e-3``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # argparse reads a token holding a space as a value, never as a flag; the space goes again below
    args = parser.parse_intermixed_args([f"{a} " if _FLAG_LIKE_NUMBER.fullmatch(a) else a for a in argv])
    args.opts = [o[:-1] if o.endswith(" ") and _FLAG_LIKE_NUMBER.fullmatch(o[:-1]) else o for o in args.opts]
    return args


def build_parser(*, description: str = "", examples: str = "", config_help: str = "") -> argparse.ArgumentParser:
    """detectron2's command line (``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``,
    ``--num-machines``, ``--machine-rank``, ``--dist-url``, ``key=value`` overrides; the flags and defaults of
    ``detectron2.engine.default_argument_parser``) with the experiment and Slurm flags. Parse it with
    :func:`parse_arguments`: flags may come after the overrides too."""
    parser = argparse.ArgumentParser(
        description=description or None, epilog=examples or None, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config-file",
        default="",
        metavar="FILE",
        help=config_help or "a config file: a path, or a model-zoo name zoo:NAME",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue every planned run from its last checkpoint; finished runs are skipped, a diverged run is not "
        "retried; a run directory is never resumed with another arm, seed, patterns, options or lr scale",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate a checkpoint instead of training: train.init_checkpoint=PATH, else the run's final weights "
        "(with --resume: its last checkpoint), and add an evaluation record, under the checkpoint's own arm, to the "
        "run's results.json",
    )
    parser.add_argument(
        "--num-gpus", type=int, default=1, help="processes per machine: GPUs, or CPU processes with train.device=cpu"
    )
    parser.add_argument("--num-machines", type=int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=int, default=0, help="the rank of this machine (unique per machine)")
    # Not detectron2's default, one port per user: two runs of one user on one machine would both take it.
    parser.add_argument(
        "--dist-url",
        default="auto",
        help="initialization URL of torch.distributed: with several machines the first one's tcp://HOST:PORT, the "
        "same on every machine; default: auto (a free port of this machine)",
    )
    parser.add_argument(
        "opts",
        default=None,
        nargs="*",
        help='config overrides, before or after the flags: "path.key=value" (lazy configs; '
        '"+path.key=value" adds a key the config lacks), "PATH.KEY VALUE" pairs (yacs configs)',
    )
    add_experiment_arguments(parser)
    add_cost_arguments(parser.add_argument_group("Cost (with --dry-run)"))
    add_slurm_arguments(parser)
    return parser
