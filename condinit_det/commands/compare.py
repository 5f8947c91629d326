"""
``condinit-compare`` (``tools/compare_arms.py``): compare initialization arms across training runs, or plan how many
seeds a comparison needs (docs/comparing_arms.md).

    condinit-compare DIR [DIR ...] [--output DIR] [--bootstrap B] [--seed S] [--delta D] [--std S] [--contrast A:B]
                     [--group-by-config]
    condinit-compare --plan-seeds --delta D --std S [--arms A] [--metrics M] [--power P] [--level L]

DIR is a run directory (with results.json) or a directory holding runs, of either stage. Prints the report and
writes it with its CSV files and figures into --output (default: <first DIR>/report). An unreadable file is named on
stderr and left out; runs of one stage with different setups exit with status 2 (or --group-by-config).
"""

import argparse
import os
import sys
from typing import Dict, List, Optional, Tuple, Union

# condinit_det.report is imported after parsing: --help answers without numpy, scipy or matplotlib.


def _positive_per_metric(text: str) -> Union[float, Dict[str, float]]:
    """``"0.6"`` or ``"bbox=0.6,segm=0.5"`` (metric keys: bbox, segm, top1, top5)."""
    try:
        pairs = [("", text)] if "=" not in text else [part.split("=", 1) for part in text.split(",")]
        values = {key.strip(): float(value) for key, value in pairs}
        if not all(v > 0 for v in values.values()):
            raise ValueError
        return values[""] if "" in values else values
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a positive number (e.g. 0.6) or metric=number pairs (e.g. bbox=0.6,segm=0.5)"
        ) from None


def _contrast(text: str) -> Tuple[str, str]:
    from condinit_det.report.paired import parse_contrast

    try:
        return parse_contrast(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="run directories or directories containing them")
    parser.add_argument("--output", metavar="DIR", help="where to write the report files (default: <first DIR>/report)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="B",
        help="image resamples of the image and two-level bootstraps (0: intervals over seeds only)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the resampling generators")
    parser.add_argument(
        "--delta",
        type=_positive_per_metric,
        metavar="D",
        help="difference the seed plans are for (default: the paper's gain, AP^b 0.6 / AP^m 0.5, "
        "else the observed difference); with --plan-seeds, the difference to detect",
    )
    parser.add_argument(
        "--contrast",
        type=_contrast,
        action="append",
        default=[],
        metavar="A:B",
        help="also compare arm A with arm B (A minus B, in the family of contrasts); repeatable",
    )
    parser.add_argument(
        "--group-by-config",
        action="store_true",
        help="one section per setup when the runs of a stage were trained with different configs",
    )
    plan = parser.add_argument_group("planning a comparison (--plan-seeds, no run directories)")
    plan.add_argument("--plan-seeds", action="store_true", help="print the seeds per arm needed to detect --delta")
    plan.add_argument(
        "--std",
        type=_positive_per_metric,
        metavar="S",
        help="std of the per-seed paired differences (in a report: replaces the measured one)",
    )
    plan.add_argument("--arms", type=int, default=1, metavar="A", help="arms against default, or contrasts")
    plan.add_argument("--metrics", type=int, default=1, metavar="M", help="headline metrics per arm (detection: 2)")
    plan.add_argument("--power", type=float, default=0.8, metavar="P", help="power (default 0.8)")
    plan.add_argument("--level", type=float, default=0.05, metavar="L", help="family-wise level (default 0.05)")
    plan.add_argument(
        "--shared-variance",
        type=float,
        default=0.0,
        metavar="V",
        help="evaluation-image variance shared by every training run (the report prints it)",
    )
    return parser


def _plan(parser: argparse.ArgumentParser, args) -> int:
    from tabulate import tabulate

    from condinit_det.report.statistics import plan_seeds, power

    if args.delta is None or args.std is None:
        parser.error(
            "--plan-seeds needs --delta (the difference to detect) and --std (std of the per-seed paired differences)"
        )
    if isinstance(args.delta, dict) or isinstance(args.std, dict):
        parser.error("--plan-seeds takes one number each for --delta and --std (e.g. --delta 0.6 --std 0.1)")
    if args.dirs or args.contrast:
        parser.error(
            "--plan-seeds takes no run directories and no --contrast (contrasts are a family of their own: --arms C)"
        )
    common = dict(comparisons=args.arms * args.metrics, level=args.level, shared_variance=args.shared_variance)
    try:
        p = plan_seeds(args.delta, args.std, power_target=args.power, **common)
    except ValueError as e:
        parser.error(str(e))
    print(
        f"{args.arms} arm{'s' * (args.arms > 1)} x {args.metrics} metric{'s' * (args.metrics > 1)} compared with "
        f"default: {p.text()}."
    )
    if p.needed is not None:
        rows = [[n, power(n, args.delta, args.std, **common)] for n in range(2, p.needed + 3)]
        print("\n" + tabulate(rows, ["seeds per arm", "power"], tablefmt="pipe", floatfmt=".3f"))
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
    from condinit_det.report import compare_arms

    output = args.output if args.output is not None else os.path.join(args.dirs[0], "report")
    try:
        report, text = compare_arms(
            args.dirs,
            output_dir=output,
            bootstrap=args.bootstrap,
            seed=args.seed,
            delta=args.delta,
            std=args.std,
            contrasts=args.contrast,
            group_by_config=args.group_by_config,
        )
    except ValueError as e:
        print(f"{parser.prog}: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    for problem in report.skipped:
        print(f"{parser.prog}: skipped {problem}", file=sys.stderr)
    print(text)
    print(f"Report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
