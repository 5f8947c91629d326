"""The paper's protocol in one Slurm submission: pretraining runs, then each arm's fine-tuning from its own
pretraining run, then one report of both stages (``condinit-protocol``).

Layout under ``--output DIR``: ``DIR/pretrain/<arm>/seed<k>/`` (the upstream stage's experiment),
``DIR/finetune/<arm>/seed<k>/`` (the downstream stage's experiment; each run starts from the final weights of
``DIR/pretrain/<arm>/seed<k>/``), ``DIR/report/`` (the comparison of both stages). The two stages are planned and
checked like any experiment (:func:`condinit_det.launch.plan.plan_experiment`), then submitted together
(:func:`condinit_det.launch.slurm.submit_stages`). Runs that finished earlier are not resubmitted; runs in flight keep
their job. The protocol's flags: docs/slurm.md.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

from ..records.layout import REPORT_DIRNAME
from ..stage import Stage
from .arguments import add_cost_arguments, add_experiment_arguments, add_slurm_arguments, build_parser
from .plan import plan_experiment

__all__ = ["build_protocol_parser", "submit_protocol"]

EXAMPLES = """
Example (XCiT-S12: ImageNet pretraining per arm, COCO Mask R-CNN per arm from it, three seeds):
    $ condinit-protocol --pretrain-config configs/ImageNet/xcit_s12_p16_400ep.py \\
        --finetune-config configs/COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py --seeds 0,1,2 --output output/protocol \\
        --nodes 1 --gpus-per-node 8 --cpus-per-task 64 --time 48:00:00 --partition gpu \\
        --pretrain-opt data.root=/data/imagenet
"""


def build_protocol_parser() -> argparse.ArgumentParser:
    """The protocol's own flags, then the experiment and Slurm flags the training commands share."""
    parser = argparse.ArgumentParser(
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit pretraining -> fine-tuning -> report of every arm and seed to Slurm.",
    )
    parser.add_argument("--pretrain-config", required=True, help="config of the pretraining runs (condinit-pretrain)")
    parser.add_argument("--finetune-config", required=True, help="config of the fine-tuning runs (condinit-train)")
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="DIR/pretrain, DIR/finetune and DIR/report (the two stages' experiment directories)",
    )
    parser.add_argument(
        "--num-gpus",
        type=int,
        default=1,
        help="processes per node on CPU-only nodes (GPU nodes use every GPU of the node)",
    )
    parser.add_argument(
        "--pretrain-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the pretraining runs, repeatable",
    )
    parser.add_argument(
        "--finetune-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the fine-tuning runs, repeatable",
    )
    add_experiment_arguments(parser)
    add_cost_arguments(parser.add_argument_group("Cost (with --dry-run)"), prefixes=("pretrain-", "finetune-"))
    add_slurm_arguments(parser, switch=False)
    parser.set_defaults(arm="all", seeds="0")
    return parser


def _stage_args(
    args: argparse.Namespace, config_file: str, opts: List[str], step_time: Optional[float]
) -> argparse.Namespace:
    """The namespace a training command would have for this stage: every shared flag as given to the protocol, and
    the stage's own config, overrides and ``--step-time``."""
    stage_args = build_parser().parse_args([])
    shared = {key: value for key, value in vars(args).items() if key in vars(stage_args)}
    vars(stage_args).update(shared, config_file=config_file, opts=list(opts), step_time=step_time, slurm=True)
    stage_args.command = getattr(args, "command", None)
    return stage_args


def submit_protocol(args: argparse.Namespace, *, upstream: Stage, downstream: Stage, log=print) -> int:
    """Plan and check both stages (one error line on bad input, nothing written; the downstream runs start from
    the upstream runs, which need not exist yet), then print the plan and its cost (``--dry-run``) or submit them
    and the report (:func:`condinit_det.launch.slurm.submit_stages`); returns 0."""
    pre = plan_experiment(
        upstream,
        _stage_args(args, args.pretrain_config, args.pretrain_opt, args.pretrain_step_time),
        output_dir=os.path.join(args.output, "pretrain"),
    )
    fine = plan_experiment(
        downstream,
        _stage_args(args, args.finetune_config, args.finetune_opt, args.finetune_step_time),
        output_dir=os.path.join(args.output, "finetune"),
        upstream=pre.base,
    )
    if args.dry_run:
        from .plan import describe_plan, format_cost, plan_costs

        log(describe_plan(pre, cost=False))
        log(describe_plan(fine, cost=False))
        log("\n" + format_cost(plan_costs(pre) + plan_costs(fine)))
        return 0
    from .slurm import submit_stages

    submit_stages(pre, fine, os.path.join(args.output, REPORT_DIRNAME), log=log)
    return 0
