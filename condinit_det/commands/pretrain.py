"""``condinit-pretrain`` (``tools/pretrain_net.py``): classification pretraining of a timm model with an arm.

detectron2's command line (--config-file with a lazy .py config, a path or ``zoo:<name>``,
--num-gpus, --num-machines, --machine-rank, --dist-url, --resume, --eval-only, trailing key=value
overrides) plus --arm {default,mimetic,conditioned,all}, --seeds, --lr-scale, --retry-failed,
--allow-changed-run, and --slurm (with its resource flags). A bad input ends with one error line and
exit status 2; a run that fails or diverges is recorded, the others go on, and the exit status is 1.
The logic lives in :mod:`condinit_det.pretrain`.
"""
import sys
from typing import List, Optional

from condinit_det import pretrain
from condinit_det.pretrain.launch import submit_to_slurm


def main(argv: Optional[List[str]] = None) -> int:
    parser = pretrain.build_argument_parser()
    parser._option_string_actions["--config-file"].help = (
        "a lazy .py config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)")
    args = parser.parse_args(argv)
    try:
        pretrain.prepare_experiment(args)
    except pretrain.UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    return submit_to_slurm(args) if args.slurm else pretrain.execute(args)


if __name__ == "__main__":
    sys.exit(main())
