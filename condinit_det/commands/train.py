"""``condinit-train`` (``tools/train_net.py``): train / evaluate a detector with an attention-initialization arm.

Lazy (.py) and yacs (.yaml) configs, as a path or a model-zoo name (``zoo:demo/...``,
:mod:`condinit_det.model_zoo`); detectron2's command line (--num-gpus, --num-machines, --machine-rank, --dist-url,
--resume, --eval-only, trailing key=value overrides) plus the experiment flags (--arm, --seeds, --lr-scale,
--retry-failed, ...) and --slurm with its resource flags (:mod:`condinit_det.launch.arguments`). Everything that can
be checked is checked before any process starts; a bad input ends with one error line and exit status 2. A run that
fails or diverges is recorded and the others go on; the exit status is then 1.
"""
import sys
from typing import List, Optional

from condinit_det.engine import DetectionStage
from condinit_det.launch.command import run_command


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(DetectionStage(), argv)


if __name__ == "__main__":
    sys.exit(main())
