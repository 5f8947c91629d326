#!/usr/bin/env python
"""
Where an experiment stands (both stages): one line per planned run, then a count per state.

    python tools/experiment_status.py DIR [--json] [--stale-after S]

DIR is an experiment directory (with experiment.json), a folder of experiments, or one run
directory. Reads the run directories only; see condinit_det/launch/status.py for the states.
"""

import sys

from condinit_det.commands.status import main

if __name__ == "__main__":
    sys.exit(main())
