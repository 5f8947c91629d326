#!/usr/bin/env python
"""
Compare initialization arms across training runs (classification pretraining and detection); the installed command
is ``condinit-compare``.

    python tools/compare_arms.py DIR [DIR ...] [--output DIR] [--bootstrap B] [--seed S] [--delta D] [--std S]
                                 [--contrast A:B] [--group-by-config]
    python tools/compare_arms.py --plan-seeds --delta D --std S [--arms A] [--metrics M]     (seeds needed)

DIR is a run directory (with results.json) or an experiment directory containing runs. Prints the Markdown report
and writes report.md, summary.csv, stats.csv and the figures into --output (default: <first
DIR>/report). The command lives in condinit_det.commands.compare.
"""

import sys

from condinit_det.commands.compare import main

if __name__ == "__main__":
    sys.exit(main())
