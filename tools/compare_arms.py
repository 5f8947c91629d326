#!/usr/bin/env python
"""
Compare initialization arms across training runs.

    python tools/compare_arms.py RUN_OR_EXPERIMENT_DIR [...] [--output DIR]

Prints the Markdown table (final box/mask AP per arm, mean ± std over seeds) and the
convergence metric; with --output (default: <first dir>/report) also writes report.md,
summary.csv, curves.csv and the AP (and κ) vs iteration plots.
"""
import argparse
import os
import sys

from condinit_det.report import compare_arms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="RUN_OR_EXPERIMENT_DIR",
                        help="run directories (with results.json) or directories containing them")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="where to write the report files (default: <first dir>/report)")
    args = parser.parse_args(argv)
    output = args.output if args.output is not None else os.path.join(args.dirs[0], "report")
    try:
        _, text = compare_arms(args.dirs, output_dir=output)
    except ValueError as e:
        print(f"compare_arms: error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"Report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
