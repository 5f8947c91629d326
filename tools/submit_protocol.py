#!/usr/bin/env python
"""
The paper's protocol on Slurm in one command: each arm's pretraining runs (job array), each arm's fine-tuning
from its own pretraining run (job array, element i after pretraining element i), then one report of both
stages. The command lives in condinit_det.commands.protocol, the logic in condinit_det.launch.protocol.
"""

import sys
import warnings

# fvcore (imported by detectron2) scripts a loss with torch.jit, which recent torch marks deprecated.
warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)

from condinit_det.commands.protocol import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
