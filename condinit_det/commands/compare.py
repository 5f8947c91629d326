"""
``condinit-compare`` (``tools/compare_arms.py``): compare initialization arms across training runs.

    condinit-compare DIR [DIR ...] [--output DIR] [--bootstrap B] [--seed S]

DIR is a run directory (with results.json) or an experiment directory containing runs, of either
stage (classification pretraining or detection). Prints the Markdown report and writes report.md,
summary.csv, curves.csv, stats.csv and the plots into --output (default: <first DIR>/report).
"""
import argparse
import os
import sys
from typing import List, Optional

from condinit_det.report import compare_arms


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="run directories (with results.json) or directories containing them")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="where to write the report files (default: <first DIR>/report)")
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                        help="resamples of the paired bootstrap over evaluation images, used when an arm "
                             "and the default share exactly one seed (0: off; default 1000)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the bootstrap's generator")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.bootstrap < 0:
        parser.error("--bootstrap must be >= 0")
    output = args.output if args.output is not None else os.path.join(args.dirs[0], "report")
    try:
        _, text = compare_arms(args.dirs, output_dir=output, bootstrap=args.bootstrap, seed=args.seed)
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(text)
    print(f"Report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
