"""The paper's protocol in one Slurm submission: pretraining runs, then each arm's fine-tuning from its own
pretraining run, then one report of both stages (``tools/submit_protocol.py``).

Layout under ``--output DIR``: ``DIR/pretrain/<arm>/seed<k>/`` (the pretraining experiment),
``DIR/finetune/<arm>/seed<k>/`` (the detection experiment; its ``train.init_checkpoint`` is set to
``DIR/pretrain/{arm}/seed{seed}``), ``DIR/report/`` (the comparison of both stages). Three
submissions: the pretraining array; the fine-tuning array, whose element ``i`` starts only after
pretraining element ``i`` (same arm and seed) succeeded (Slurm's ``aftercorr``); the report job after
both (``afterany``). Runs that finished earlier are not resubmitted; a fine-tune whose pretraining
finished earlier is submitted without a dependency. This module sits above both stages, like the tools.
"""
from __future__ import annotations

import argparse
import os
from typing import List

from .slurm import add_slurm_arguments

__all__ = ["build_argument_parser", "submit_protocol"]

_EPILOG = """
Example (XCiT-S12: ImageNet pretraining per arm, COCO Mask R-CNN per arm from it, three seeds):
    $ tools/submit_protocol.py --pretrain-config configs/ImageNet/xcit_s12_p16_400ep.py \\
        --finetune-config configs/COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py --seeds 0,1,2 --output output/protocol \\
        --nodes 1 --gpus-per-node 8 --cpus-per-task 64 --time 48:00:00 --partition gpu \\
        --pretrain-opt data.root=/data/imagenet
"""


def build_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit pretraining -> fine-tuning -> report of every arm and seed to Slurm.")
    parser.add_argument("--pretrain-config", required=True, help="lazy config of tools/pretrain_net.py")
    parser.add_argument("--finetune-config", required=True, help="lazy config of tools/train_net.py")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="DIR/pretrain, DIR/finetune and DIR/report (the two stages' train.output_dir)")
    parser.add_argument("--arm", default="all", choices=["default", "mimetic", "conditioned", "all"])
    parser.add_argument("--seeds", default="0", help="training seeds of both stages, e.g. '0,1,2' (default 0)")
    parser.add_argument("--num-gpus", type=int, default=1,
                        help="processes per node on CPU-only nodes (GPU nodes use every GPU of the node)")
    parser.add_argument("--pretrain-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the pretraining runs, repeatable")
    parser.add_argument("--finetune-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the fine-tuning runs, repeatable")
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                        help="image-bootstrap resamples for one-seed intervals in the report (default 1000; 0: off)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="also resubmit runs that diverged earlier (their directories are moved aside)")
    add_slurm_arguments(parser)
    return parser


def _stage_argv(args, config: str, opts: List[str], output: str) -> List[str]:
    argv = ["--config-file", config, "--arm", args.arm, "--seeds", args.seeds, "--num-gpus", str(args.num_gpus),
            "--slurm", "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
            "--time", str(args.time), "--signal-delay", str(args.signal_delay)]
    for flag in ("cpus_per_task", "mem", "partition", "account", "qos", "constraint", "max_parallel",
                 "slurm_folder"):
        value = getattr(args, flag)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    for key, value in args.slurm_extra:
        argv += ["--slurm-extra", f"{key}={value}"]
    if args.retry_failed:
        argv.append("--retry-failed")
    return argv + list(opts) + [f"train.output_dir={output}"]


def submit_protocol(args) -> int:
    """Validate both stages (one error line on bad input, nothing submitted), then submit; returns 0."""
    from .cluster import submit_experiment, submit_report
    from ..engine import training
    from ..pretrain import launch as pretraining
    from .slurm import after, after_each, slurm_folder

    pre_base, ft_base = os.path.join(args.output, "pretrain"), os.path.join(args.output, "finetune")
    pre_args = pretraining.build_argument_parser().parse_args(
        _stage_argv(args, args.pretrain_config, args.pretrain_opt, pre_base))
    pretraining.prepare_experiment(pre_args)
    # The fine-tune checkpoints do not exist yet: check the fine-tune runs without them, then name them.
    ft_argv = _stage_argv(args, args.finetune_config, args.finetune_opt, ft_base)
    training.check_invocation(training.build_argument_parser().parse_args(ft_argv + ["train.init_checkpoint="]))
    ft_args = training.build_argument_parser().parse_args(
        ft_argv + [f"train.init_checkpoint='{os.path.abspath(pre_base)}/{{arm}}/seed{{seed}}'"])
    ft_args.resume = True
    base, runs = training.plan_invocation(ft_args)
    cfg_of = dict(runs)
    training._write_plan(ft_args, base, runs)

    experiment = pre_args.experiment
    pre_jobs, pre_todo, _ = submit_experiment(
        pre_args, stage="pretrain", base=pre_base, specs=experiment.runs, report=False, name="condinit-pretrain",
        finished=lambda run: pretraining.run_finished(run.path(pre_base), experiment.epochs))
    ft_finished = lambda spec: training._final_recorded(cfg_of[spec])  # noqa: E731
    pending = [spec for spec, _ in runs if not ft_finished(spec)]
    after_pretraining = [s for s in pending if s in pre_todo]
    jobs = list(pre_jobs)
    if after_pretraining and after_pretraining == pre_todo:
        jobs += submit_experiment(ft_args, stage="detection", base=ft_base, specs=after_pretraining, report=False,
                                  name="condinit-finetune", finished=ft_finished, dependency=after_each(pre_jobs))[0]
    else:  # element by element, each after its own pretraining run
        for spec in after_pretraining:
            job = pre_jobs[pre_todo.index(spec)]
            jobs += submit_experiment(ft_args, stage="detection", base=ft_base, specs=[spec], report=False,
                                      name="condinit-finetune", finished=ft_finished,
                                      dependency=after("afterok", [job]))[0]
    pretrained = [s for s in pending if s not in pre_todo
                  and pretraining.run_finished(s.path(pre_base), experiment.epochs)]
    if pretrained:
        jobs += submit_experiment(ft_args, stage="detection", base=ft_base, specs=pretrained, report=False,
                                  name="condinit-finetune", finished=ft_finished)[0]
    submit_report(args, [pre_base, ft_base], os.path.join(args.output, "report"), jobs=jobs,
                  folder=slurm_folder(args, args.output), name="condinit-protocol-report", bootstrap=args.bootstrap)
    return 0
