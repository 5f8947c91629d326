"""``condinit-train`` (``tools/train_net.py``): train / evaluate a detector with an attention-initialization arm from
a lazy or yacs config; the command line: :mod:`condinit_det.launch.arguments`, docs/training.md.
"""

import sys
from typing import List, Optional

from condinit_det.launch.command import run_command

EXAMPLES = """
Examples:

Train one arm on this machine (lazy config, CPU); every run goes to <output_dir>/<arm>/seed<k>/:
    $ condinit-train --config-file configs/demo/mask_rcnn_vit_tiny.py --arm conditioned

The three arms over three seeds with a learning-rate scan on the first seed, then the comparison in
<output_dir>/report/; resume it, or train its failed and diverged runs afresh:
    $ condinit-train --config-file cfg.py --arm all --seeds 0,1,2 --lr-scale 0.5,1,2 train.output_dir=output/exp1
    $ condinit-train --config-file cfg.py --arm all --seeds 0,1,2 --lr-scale 0.5,1,2 --resume train.output_dir=...
    $ condinit-train --config-file cfg.py --arm all --retry-failed train.output_dir=output/exp1

Fine-tune each arm from its own pretrained backbone; run on 8 GPUs:
    $ condinit-train --config-file cfg.py --arm all "train.init_checkpoint='output/pretrain/{arm}/seed{seed}'"
    $ condinit-train --num-gpus 8 --config-file cfg.py train.device=cuda
"""


def _stage():
    from condinit_det.engine import DetectionStage

    return DetectionStage()


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(
        _stage,
        argv,
        description="Train or evaluate a detectron2 detector with an attention-initialization arm.",
        examples=EXAMPLES,
        config_help="a lazy .py or yacs .yaml config: a path, or a model-zoo name zoo:NAME (NAME = its "
        "path under configs/)",
    )


if __name__ == "__main__":
    sys.exit(main())
