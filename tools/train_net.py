#!/usr/bin/env python
"""
Train / evaluate a detector with an attention-initialization arm.

Lazy (.py) and yacs (.yaml) configs; detectron2's command line (--num-gpus, --num-machines,
--machine-rank, --dist-url, --resume, --eval-only, trailing key=value overrides) plus
--arm {default,mimetic,conditioned,all}. The logic lives in condinit_det.engine.training.
"""
from detectron2.engine import launch

from condinit_det.engine.training import build_argument_parser, main

if __name__ == "__main__":
    args = build_argument_parser().parse_args()
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
