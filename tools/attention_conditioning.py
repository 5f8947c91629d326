#!/usr/bin/env python
"""Per-site condition number of the attention Jacobian at initialization, for each arm (the
installed command is ``condinit-conditioning``).

    python tools/attention_conditioning.py --config-file configs/demo/mask_rcnn_vit_tiny.py \
        --arm all --output output/conditioning [key=value overrides]

Prints a Markdown table and writes <output>/attention_conditioning.{csv,md} and .json. The
command lives in condinit_det.commands.conditioning.
"""

import sys

from condinit_det.commands.conditioning import main

if __name__ == "__main__":
    sys.exit(main())
