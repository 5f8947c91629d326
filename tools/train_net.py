#!/usr/bin/env python
"""
Train / evaluate a detector with an attention-initialization arm.

Lazy (.py) and yacs (.yaml) configs; detectron2's command line (--num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale. Everything that can be checked is
checked before any worker starts; a bad input ends with one error line and exit status 2.
The logic lives in condinit_det.engine.training.
"""
import sys
import warnings

# fvcore (imported by detectron2) scripts a loss with torch.jit, which recent torch marks deprecated.
warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)

from condinit_det.arm_node import ArmError  # noqa: E402
from condinit_det.distributed import launch  # noqa: E402
from condinit_det.engine.training import build_argument_parser, check_invocation, invocation_device, main  # noqa: E402


def _fail(error: Exception) -> None:
    print(f"train_net.py: error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    args = build_argument_parser().parse_args()
    try:
        check_invocation(args)
    except (ValueError, FileNotFoundError) as e:
        _fail(e)
    try:
        launch(main, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
               dist_url=args.dist_url, args=(args,), device=invocation_device(args))
    except ArmError as e:  # raised while the model is built: the arm does not fit the model
        _fail(e)
