"""``condinit-protocol`` (``tools/submit_protocol.py``): the paper's protocol in one Slurm submission
(pretraining array -> fine-tuning array, element by element -> report of both stages); the logic is in
:mod:`condinit_det.launch.protocol`.
"""

import shlex
import sys
from typing import List, Optional

from condinit_det.launch.protocol import build_protocol_parser, submit_protocol
from condinit_det.utils.errors import UsageError


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_protocol_parser()
    args = parser.parse_args(argv)
    args.command = shlex.join([parser.prog, *(sys.argv[1:] if argv is None else argv)])  # what submits it again
    from condinit_det.engine import DetectionStage
    from condinit_det.pretrain import PretrainStage

    try:
        return submit_protocol(args, upstream=PretrainStage(), downstream=DetectionStage())
    except (UsageError, RuntimeError) as e:  # RuntimeError: scancel refused to replace a pending report job
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
