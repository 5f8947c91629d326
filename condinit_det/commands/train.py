"""``condinit-train`` (``tools/train_net.py``): train / evaluate a detector with an attention-initialization arm.

Lazy (.py) and yacs (.yaml) configs, as a path or a model-zoo name (``zoo:demo/...``,
:mod:`condinit_det.model_zoo`); detectron2's command line (--num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}, --seeds, --lr-scale. Everything that can be checked is
checked before any worker starts; a bad input ends with one error line and exit status 2.
The logic lives in :mod:`condinit_det.engine.training`.
"""
import sys
from typing import List, Optional

from detectron2.engine import launch

from condinit_det.arm_node import ArmError
from condinit_det.engine import training


def _fail(prog: str, error: Exception) -> int:
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = training.build_argument_parser()
    parser._option_string_actions["--config-file"].help = (
        "a lazy .py or yacs .yaml config: a path, or a model-zoo name zoo:NAME (NAME = its path under configs/)")
    args = parser.parse_args(argv)
    try:
        training.check_invocation(args)
    except (ValueError, FileNotFoundError) as e:
        return _fail(parser.prog, e)
    try:
        launch(
            training.main,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args,),
        )
    except ArmError as e:  # raised while the model is built: the arm does not fit the model
        return _fail(parser.prog, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
