"""``condinit-pretrain`` (``tools/pretrain_net.py``): classification pretraining of a timm model with an arm.

The same command line as ``condinit-train`` (:mod:`condinit_det.launch.arguments`) with lazy ``.py`` pretraining
configs. A bad input ends with one error line and exit status 2; a run that fails or diverges is recorded, the
others go on, and the exit status is 1. The stage lives in :mod:`condinit_det.pretrain`.
"""
import sys
from typing import List, Optional

from condinit_det.launch.command import run_command
from condinit_det.pretrain import PretrainStage


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(PretrainStage(), argv)


if __name__ == "__main__":
    sys.exit(main())
