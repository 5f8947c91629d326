#!/usr/bin/env python
"""
Classification pretraining (ImageNet-style) of a timm model with an attention-initialization arm (the installed
command is ``condinit-pretrain``).

The same command line as tools/train_net.py (--help lists it) with lazy .py pretraining configs. The command lives
in condinit_det.commands.pretrain, the stage in condinit_det.pretrain, the launcher in condinit_det.launch.
"""

import sys

from condinit_det.commands.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
