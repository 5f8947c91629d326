#!/usr/bin/env python
"""
Classification pretraining (ImageNet-style) of a timm model with an attention-initialization arm
(the installed command is ``condinit-pretrain``).

detectron2's command line (--config-file with a lazy .py config, --num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale and --allow-changed-run.
The command lives in condinit_det.commands.pretrain, the logic in condinit_det.pretrain.
"""
import sys

from condinit_det.commands.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
