#!/usr/bin/env python
"""
Classification pretraining (ImageNet-style) of a timm model with an attention-initialization arm.

detectron2's command line (--config-file with a lazy .py config, --num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale and --allow-changed-run.
The logic lives in condinit_det.pretrain.
"""
import sys
import warnings

# fvcore (imported by detectron2) scripts a loss with torch.jit, which recent torch marks deprecated.
warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)

from condinit_det.distributed import launch  # noqa: E402
from condinit_det.pretrain import UsageError, build_argument_parser, main, prepare_experiment  # noqa: E402

if __name__ == "__main__":
    parser = build_argument_parser()
    args = parser.parse_args()
    try:
        experiment = prepare_experiment(args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    launch(main, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
           dist_url=args.dist_url, args=(args,), device=experiment.device)
