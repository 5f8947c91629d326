"""``condinit-status`` (``tools/experiment_status.py``): one line per run of an experiment (both stages); the states:
:mod:`condinit_det.launch.status`.
"""

import argparse
import json
import os
import sys
import time
from collections import Counter

from condinit_det.launch.status import STALE_AFTER, STATES, experiment_status, format_table, summary_line


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="One line per run of an experiment (both stages): state, progress, latest evaluation, time "
        "per iteration, ETA and log; then a count per state. Reads the run directories only."
    )
    parser.add_argument(
        "dir",
        metavar="DIR",
        help="an experiment directory (with experiment.json), a folder of experiments, or one run directory",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (runs and counts) instead")
    parser.add_argument(
        "--stale-after",
        type=float,
        default=STALE_AFTER,
        metavar="S",
        help="seconds without a log or metrics write after which a run counts as stopped rather "
        f"than running (default {STALE_AFTER:g})",
    )
    return parser


def main(argv=None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    try:
        statuses = experiment_status(args.dir, stale_after=args.stale_after)
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    if args.json:
        counts = Counter(s.state for s in statuses)
        payload = {
            "dir": os.path.abspath(args.dir),
            "time": time.time(),
            "stale_after": args.stale_after,
            "runs": [s.to_dict() for s in statuses],
            "counts": {state: counts[state] for state in STATES},
        }
        print(json.dumps(payload, indent=1))
    else:
        print(format_table(statuses, base=args.dir))
        print(summary_line(statuses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
