"""``condinit-train`` (``tools/train_net.py``): train / evaluate a detector with an attention-initialization arm.

Lazy (.py) and yacs (.yaml) configs, as a path or a model-zoo name (``zoo:demo/...``,
:mod:`condinit_det.model_zoo`); detectron2's command line (--num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale, --retry-failed, and --slurm (with its
resource flags) to submit the runs as a job array. Everything that can be checked is checked before any
worker starts; a bad input ends with one error line and exit status 2. A run that fails or diverges is
recorded and the others go on; the exit status is then 1.
The logic lives in :mod:`condinit_det.engine.training`.
"""
import sys
from typing import List, Optional

from condinit_det.init.spec import ArmError
from condinit_det.engine import training


def main(argv: Optional[List[str]] = None) -> int:
    parser = training.build_argument_parser()
    parser._option_string_actions["--config-file"].help = (
        "a lazy .py or yacs .yaml config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)")
    args = parser.parse_args(argv)
    try:
        training.check_invocation(args)
    except (ValueError, FileNotFoundError, ArmError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    return training.submit_to_slurm(args) if args.slurm else training.execute(args)


if __name__ == "__main__":
    sys.exit(main())
