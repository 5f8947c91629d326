"""
``condinit-compare`` (``tools/compare_arms.py``): compare initialization arms across training runs, or plan
how many seeds a comparison needs before running it.

    condinit-compare DIR [DIR ...] [--output DIR] [--bootstrap B] [--seed S] [--delta D] [--std S] [--contrast A:B]
    condinit-compare --plan-seeds --delta D --std S [--arms A] [--metrics M] [--power P] [--level L]

DIR is a run directory (with results.json) or an experiment directory containing runs, of either
stage (classification pretraining or detection). Prints the Markdown report and writes report.md,
summary.csv, curves.csv, stats.csv and the plots into --output (default: <first DIR>/report).

Every arm is compared with default; beside that, contrasts between two other arms: conditioned vs
scale_matched and conditioned vs mimetic wherever both ran, and each --contrast A:B (A minus B, paired by
seed, in the same Holm family).

--plan-seeds needs no runs: the seeds per arm with which a two-sided paired t-test over seeds detects a
difference D at the given power, when the per-seed paired differences have standard deviation S and
the family holds A arms x M headline metrics (Holm's strictest threshold, level / (A x M); a contrast
between two arms counts as one more arm).
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Tuple, Union

from tabulate import tabulate

from condinit_det.report import compare_arms
from condinit_det.report.contrasts import parse_contrast
from condinit_det.report.planning import plan_seeds, power


def _positive_per_metric(text: str) -> Union[float, Dict[str, float]]:
    """``"0.6"`` or ``"bbox=0.6,segm=0.5"`` (metric keys: bbox, segm, top1, top5)."""
    try:
        if "=" not in text:
            value = float(text)
            if not value > 0:
                raise ValueError
            return value
        out = {}
        for part in text.split(","):
            key, value = part.split("=", 1)
            out[key.strip()] = float(value)
            if not out[key.strip()] > 0:
                raise ValueError
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a positive number (e.g. 0.6) or metric=number pairs (e.g. bbox=0.6,segm=0.5)"
        ) from None


def _contrast(text: str) -> Tuple[str, str]:
    """``"conditioned:scale_matched"`` -> ("conditioned", "scale_matched")."""
    try:
        return parse_contrast(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", metavar="DIR",
                        help="run directories (with results.json) or directories containing them")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="where to write the report files (default: <first DIR>/report)")
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                        help="image resamples of the one-seed image bootstrap and the two-level (seeds x images) "
                             "bootstrap (0: off, intervals over seeds only; default 1000)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the resampling generators")
    parser.add_argument("--delta", type=_positive_per_metric, default=None, metavar="D",
                        help="difference to detect: the seed plans of the report (default: the paper's claimed gain, "
                             "AP^b 0.6 / AP^m 0.5, else the observed difference), or the plan of --plan-seeds")
    parser.add_argument("--contrast", type=_contrast, action="append", default=[], metavar="A:B",
                        help="also compare arm A with arm B directly (A minus B, paired by seed, in the same Holm "
                             "family); repeatable. conditioned:scale_matched and conditioned:mimetic are made "
                             "whenever both arms ran")
    plan = parser.add_argument_group("planning a comparison (--plan-seeds, no run directories)")
    plan.add_argument("--plan-seeds", action="store_true",
                      help="print the seeds per arm needed to detect --delta, and exit")
    plan.add_argument("--std", type=_positive_per_metric, default=None, metavar="S",
                      help="standard deviation of the per-seed paired differences (arm minus default); in a report, "
                           "replaces the observed one in the seed plans (same forms as --delta)")
    plan.add_argument("--arms", type=int, default=1, metavar="A", help="arms compared with default (default 1)")
    plan.add_argument("--metrics", type=int, default=1, metavar="M",
                      help="headline metrics per arm (default 1; detection: 2, AP^b and AP^m)")
    plan.add_argument("--power", type=float, default=0.8, metavar="P", help="power (default 0.8)")
    plan.add_argument("--level", type=float, default=0.05, metavar="L", help="family-wise level (default 0.05)")
    plan.add_argument("--shared-variance", type=float, default=0.0, metavar="V",
                      help="evaluation-image variance shared by every training run (the report prints it; default 0)")
    return parser


def _plan(parser: argparse.ArgumentParser, args) -> int:
    if args.delta is None or args.std is None:
        parser.error("--plan-seeds needs --delta (the difference to detect) and --std (std of the per-seed paired "
                     "differences)")
    if isinstance(args.delta, dict) or isinstance(args.std, dict):
        parser.error("--plan-seeds takes one number each for --delta and --std (e.g. --delta 0.6 --std 0.1)")
    if args.dirs:
        parser.error("--plan-seeds takes no run directories")
    if args.contrast:
        parser.error("--plan-seeds takes no --contrast (count each contrast as one more arm in --arms)")
    if args.arms < 1 or args.metrics < 1:
        parser.error("--arms and --metrics must be >= 1")
    comparisons = args.arms * args.metrics
    try:
        p = plan_seeds(args.delta, args.std, comparisons=comparisons, level=args.level, power_target=args.power,
                       shared_variance=args.shared_variance)
    except ValueError as e:
        parser.error(str(e))
    family = f"{args.arms} arm{'s' * (args.arms > 1)} x {args.metrics} metric{'s' * (args.metrics > 1)}"
    print(f"{family} compared with default: {p.text()}.")
    if p.needed is not None:
        rows = []
        for n in range(2, p.needed + 3):
            value = power(n, args.delta, args.std, level=args.level, comparisons=comparisons,
                          shared_variance=args.shared_variance)
            rows.append([str(n), f"{value:.3f}"])
        print("\n" + tabulate(rows, ["seeds per arm", "power"], tablefmt="pipe", disable_numparse=True,
                                colalign=("right", "right")))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.plan_seeds:
        return _plan(parser, args)
    if not args.dirs:
        parser.error("give run or experiment directories to compare, or --plan-seeds --delta D --std S to plan")
    if args.bootstrap < 0:
        parser.error("--bootstrap must be >= 0")
    output = args.output if args.output is not None else os.path.join(args.dirs[0], "report")
    try:
        _, text = compare_arms(args.dirs, output_dir=output, bootstrap=args.bootstrap, seed=args.seed, delta=args.delta,
                               std=args.std, contrasts=args.contrast)
    except ValueError as e:
        print(f"{parser.prog}: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(text)
    print(f"Report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
