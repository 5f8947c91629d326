"""``condinit-pretrain`` (``tools/pretrain_net.py``): classification pretraining of a timm model with an arm; the
command line and exit statuses of ``condinit-train`` (:mod:`condinit_det.launch.arguments`), lazy ``.py`` configs.
"""

import sys
from typing import List, Optional

from condinit_det.launch.command import run_command

EXAMPLES = """
Examples:

The tiny CPU demo, three arms, then the comparison; resume it, or train its failed runs afresh:
    $ condinit-pretrain --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/p
    $ condinit-pretrain --config-file configs/demo/pretrain_vit_tiny.py --arm all --resume train.output_dir=output/p
    $ condinit-pretrain --config-file configs/demo/pretrain_vit_tiny.py --arm all --retry-failed ...

ImageNet on 8 GPUs; evaluate a run's final weights (or train.init_checkpoint=PATH):
    $ condinit-pretrain --num-gpus 8 --config-file configs/ImageNet/vit_b16_deit_300ep.py data.root=/data/imagenet
    $ condinit-pretrain --config-file CFG.py --arm conditioned --eval-only train.output_dir=output/p
"""


def _stage():
    from condinit_det.pretrain import PretrainStage

    return PretrainStage()


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(
        _stage,
        argv,
        description="Classification pretraining of a timm model with an attention-initialization arm.",
        examples=EXAMPLES,
        config_help="a lazy .py config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)",
    )


if __name__ == "__main__":
    sys.exit(main())
