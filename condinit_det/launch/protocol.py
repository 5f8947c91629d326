"""The paper's protocol in one Slurm submission: pretraining runs, then each arm's fine-tuning from its own
pretraining run, then one report of both stages (``condinit-protocol``).

Layout under ``--output DIR``: ``DIR/pretrain/<arm>/seed<k>/`` (the upstream stage's experiment),
``DIR/finetune/<arm>/seed<k>/`` (the downstream stage's experiment; each run starts from the final weights of
``DIR/pretrain/<arm>/seed<k>/``), ``DIR/report/`` (the comparison of both stages). The two stages are planned and
checked like any experiment (:func:`condinit_det.launch.experiment.plan_experiment`), then submitted: the upstream
array; the downstream runs, each after its own upstream run succeeded (one array with Slurm's ``aftercorr`` when
they pair element by element, else one job each with ``afterok``; none for a run whose upstream run finished
earlier); the report job after every job of both stages, the ones already in flight included (``afterany``).
Runs that finished earlier are not resubmitted; runs in flight keep their job.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List

from ..records.layout import REPORT_DIRNAME, RunSpec
from ..stage import Stage
from .arguments import add_cost_arguments, add_experiment_arguments, build_parser, experiment_namespace
from .cluster import describe_submission, replace_report, submission_plan, submit_report, submit_runs
from .experiment import Experiment, plan_experiment
from .slurm import add_slurm_arguments, after, after_each, slurm_folder

__all__ = ["build_protocol_parser", "plan_protocol", "submit_protocol"]

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
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit pretraining -> fine-tuning -> report of every arm and seed to Slurm.")
    parser.add_argument("--pretrain-config", required=True, help="config of the pretraining runs (condinit-pretrain)")
    parser.add_argument("--finetune-config", required=True, help="config of the fine-tuning runs (condinit-train)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="DIR/pretrain, DIR/finetune and DIR/report (the two stages' experiment directories)")
    parser.add_argument("--num-gpus", type=int, default=1,
                        help="processes per node on CPU-only nodes (GPU nodes use every GPU of the node)")
    parser.add_argument("--pretrain-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the pretraining runs, repeatable")
    parser.add_argument("--finetune-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the fine-tuning runs, repeatable")
    add_experiment_arguments(parser, cost=False)
    add_cost_arguments(parser.add_argument_group("Cost (with --dry-run)"), prefixes=("pretrain-", "finetune-"))
    add_slurm_arguments(parser, switch=False)
    parser.set_defaults(arm="all", seeds="0")
    return parser


def _stage_args(args: argparse.Namespace, config_file: str, opts: List[str]) -> argparse.Namespace:
    """The namespace a training command would have for this stage: every shared flag as given to the protocol."""
    stage_parser = build_parser()
    shared = set(vars(stage_parser.parse_args([])))
    values = {k: v for k, v in vars(args).items() if k in shared}
    return experiment_namespace(stage_parser, **values, config_file=config_file, opts=list(opts), slurm=True)


def plan_protocol(args: argparse.Namespace, *, upstream: Stage, downstream: Stage):
    """Plan and check both stages (one error line on bad input, nothing written): (upstream, downstream)
    experiments. The downstream runs start from the upstream runs, which need not exist yet."""
    pre = plan_experiment(upstream, _stage_args(args, args.pretrain_config, args.pretrain_opt),
                          output_dir=os.path.join(args.output, "pretrain"))
    fine = plan_experiment(downstream, _stage_args(args, args.finetune_config, args.finetune_opt),
                           output_dir=os.path.join(args.output, "finetune"), upstream=pre.base)
    return pre, fine


def _upstream_of(spec: RunSpec) -> RunSpec:
    return RunSpec(spec.arm, spec.seed)


def submit_protocol(args: argparse.Namespace, *, upstream: Stage, downstream: Stage, log=print) -> int:
    """Plan and check both stages, then submit them and the report (module docstring); returns 0."""
    pre, fine = plan_protocol(args, upstream=upstream, downstream=downstream)
    if args.dry_run:
        from .cost import format_cost
        from .plan import describe_plan, plan_costs, step_time_of

        costs = []
        for experiment, seconds in ((pre, args.pretrain_step_time), (fine, args.finetune_step_time)):
            log(describe_plan(experiment, cost=False))
            costs += plan_costs(experiment, step_time_of(experiment, seconds))
        log("\n" + format_cost(costs))
        return 0
    pre.write_plan()
    fine.write_plan()
    pre_plan = submission_plan(pre)
    describe_submission(pre, pre_plan, log)
    pre_jobs = dict(zip(pre_plan.todo, submit_runs(pre, pre_plan.todo, name="condinit-pretrain", log=log)))
    fine_plan = submission_plan(fine)
    describe_submission(fine, fine_plan, log)
    jobs = [str(j.job_id) for j in pre_jobs.values()] + list(pre_plan.in_flight.values())
    jobs += list(fine_plan.in_flight.values())
    jobs += _submit_downstream(pre, fine, fine_plan.todo, pre_jobs, pre_plan.in_flight, log)
    if jobs:
        job = submit_report(args, [pre.base, fine.base], os.path.join(args.output, REPORT_DIRNAME), jobs=jobs,
                            folder=slurm_folder(args, args.output), name="condinit-protocol-report", log=log,
                            trackers=fine.trackers)
        replace_report(args.output, str(job.job_id), log=log)
    return 0


def _submit_downstream(pre: Experiment, fine: Experiment, todo: List[RunSpec], pre_jobs: Dict[RunSpec, object],
                       pre_in_flight: Dict[RunSpec, str], log) -> List[str]:
    """Submit the downstream runs each after its upstream run; returns their job ids."""
    after_new = [s for s in todo if _upstream_of(s) in pre_jobs]
    if after_new and [_upstream_of(s) for s in after_new] == list(pre_jobs):  # element i after element i
        jobs = submit_runs(fine, after_new, name="condinit-finetune", dependency=after_each(list(pre_jobs.values())),
                           log=log)
    else:
        jobs = [job for s in after_new for job in submit_runs(
            fine, [s], name="condinit-finetune", dependency=after("afterok", [pre_jobs[_upstream_of(s)]]), log=log)]
    ready = []
    for spec in todo:
        if spec in after_new:
            continue
        if _upstream_of(spec) in pre_in_flight:
            jobs += submit_runs(fine, [spec], name="condinit-finetune",
                                dependency=after("afterok", [pre_in_flight[_upstream_of(spec)]]), log=log)
        elif pre.finished(_upstream_of(spec)):
            ready.append(spec)
        else:
            log(f"  {spec.dir}: its pretraining run did not finish (failed or diverged): not submitted")
    jobs += submit_runs(fine, ready, name="condinit-finetune", log=log)
    return [str(j.job_id) for j in jobs]
