#!/usr/bin/env python
"""
Train / evaluate a detector with an attention-initialization arm (the installed command is ``condinit-train``).

Lazy (.py) and yacs (.yaml) configs; detectron2's command line (--num-gpus, --num-machines, --machine-rank,
--dist-url, --resume, --eval-only, key=value overrides before or after the flags) plus the experiment and Slurm
flags (--help lists them). The command lives in condinit_det.commands.train, the stage in condinit_det.engine, the
launcher in condinit_det.launch.
"""

import sys

from condinit_det.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
