"""``condinit-protocol`` (``tools/submit_protocol.py``): the paper's protocol in one Slurm submission
(pretraining array -> fine-tuning array, element by element -> report of both stages); the logic is in
:mod:`condinit_det.launch.protocol`.
"""
import sys
from typing import List, Optional

from condinit_det.launch.protocol import build_argument_parser, submit_protocol


def main(argv: Optional[List[str]] = None) -> int:
    from condinit_det.init.spec import ArmError
    from condinit_det.pretrain import UsageError

    parser = build_argument_parser()
    args = parser.parse_args(argv)
    try:
        return submit_protocol(args)
    except (UsageError, ValueError, FileNotFoundError, ArmError, RuntimeError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
