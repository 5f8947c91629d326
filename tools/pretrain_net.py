#!/usr/bin/env python
"""
Classification pretraining (ImageNet-style) of a timm model with an attention-initialization arm.

detectron2's command line (--config-file with a lazy .py config, --num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale, --retry-failed and --allow-changed-run.
A run that fails or diverges is recorded and the others go on; the exit status is then 1.
The logic lives in condinit_det.pretrain.
"""
import sys
import warnings

# fvcore (imported by detectron2) scripts a loss with torch.jit, which recent torch marks deprecated.
warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)

from condinit_det.pretrain import UsageError, build_argument_parser, execute, prepare_experiment  # noqa: E402
from condinit_det.pretrain.launch import submit_to_slurm  # noqa: E402

if __name__ == "__main__":
    parser = build_argument_parser()
    args = parser.parse_args()
    try:
        experiment = prepare_experiment(args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(submit_to_slurm(args) if args.slurm else execute(args))
