"""What an experiment would do, said before it does it (``--dry-run``): every run, what becomes of it, its length
and processes, and what the runs to train cost."""
from __future__ import annotations

import os
from typing import List, Tuple

from tabulate import tabulate

from ..records.failures import describe_failure, failure_of
from ..records.layout import RunSpec
from ..records.lock import LOCK_FILENAME
from ..records.results import RESULTS_FILENAME
from .cost import RunCost, StepTime, format_cost, resolve_step_time
from .experiment import Experiment

__all__ = ["describe_plan", "plan_costs", "run_actions"]


def run_actions(experiment: Experiment) -> List[Tuple[RunSpec, str, bool]]:
    """Per planned run: what running the command would do with it, and whether that trains (the resume rules of
    :mod:`condinit_det.launch.experiment`; with ``--slurm``, a run in flight keeps its job)."""
    args = experiment.args
    in_flight = {}
    if args.slurm:
        from .cluster import submission_plan

        in_flight = submission_plan(experiment).in_flight
    actions = []
    for spec in experiment.runs:
        run_dir = experiment.run_dir(spec)
        failure = failure_of(run_dir) if args.resume else None
        if spec in in_flight:
            actions.append((spec, f"in flight as job {in_flight[spec]}: not resubmitted", False))
        elif not args.resume:
            earlier = os.path.isfile(os.path.join(run_dir, RESULTS_FILENAME))
            actions.append((spec, "train" + (" afresh (the earlier results are set aside)" if earlier else ""), True))
        elif failure is not None and args.retry_failed:
            actions.append((spec, f"train afresh ({describe_failure(failure)} earlier; moved aside)", True))
        elif failure is not None and failure.get("reason") == "diverged":
            actions.append((spec, f"skip: {describe_failure(failure)} earlier (--retry-failed trains it afresh)",
                            False))
        elif failure is not None:
            actions.append((spec, f"resume ({describe_failure(failure)} earlier)", True))
        elif experiment.finished(spec):
            actions.append((spec, "skip: finished", False))
        elif os.path.isdir(run_dir) and set(os.listdir(run_dir)) - {LOCK_FILENAME}:
            actions.append((spec, "resume from its last checkpoint", True))
        else:
            actions.append((spec, "train", True))
    return actions


def plan_costs(experiment: Experiment, step_time: StepTime) -> List[RunCost]:
    """What each run that would train costs at ``step_time`` (seconds per step of all its processes)."""
    args = experiment.args
    processes = int(args.num_gpus) * int(args.num_machines)
    trains = [spec for spec, _, trains in run_actions(experiment) if trains]
    steps = experiment.stage.steps(experiment.config(experiment.runs[0])) if trains else 0
    return [RunCost(stage=experiment.stage.name, name=spec.dir, steps=steps, processes=processes, step=step_time)
            for spec in trains]


def step_time_of(experiment: Experiment, seconds=None) -> StepTime:
    """The step time for the cost of ``experiment``: ``seconds`` (default ``--step-time``), else its config's
    time in ``--step-bench``, else unknown."""
    args = experiment.args
    seconds = args.step_time if seconds is None else seconds
    return resolve_step_time(args.config_file, step_time=seconds, step_bench=args.step_bench)


def describe_plan(experiment: Experiment, *, cost: bool = True) -> str:
    """The plan as text: a header (stage, config, length, processes per run), one line per run and, with ``cost``,
    the cost of the runs that would train."""
    args, stage = experiment.args, experiment.stage
    processes = int(args.num_gpus) * int(args.num_machines)
    where = ("Slurm: one job per run, " if args.slurm else "") + (
        f"{processes} process(es) per run on {experiment.device}")
    steps = stage.steps(experiment.config(experiment.runs[0]))
    lines = [f"Plan of {experiment.base} ({stage.name}, {args.config_file}): {len(experiment.runs)} run(s) of "
             f"{experiment.length} {stage.unit}s ({steps} optimizer steps) each; {where}"]
    actions = run_actions(experiment)
    table = tabulate([(spec.dir, action) for spec, action, _ in actions], tablefmt="plain", disable_numparse=True)
    lines += ["  " + line.rstrip() for line in table.splitlines()]
    to_train = sum(trains for _, _, trains in actions)
    lines.append(f"{to_train} of {len(actions)} run(s) would train; nothing was written"
                 + (" or submitted" if args.slurm else ""))
    if cost and to_train:
        lines += ["", format_cost(plan_costs(experiment, step_time_of(experiment)))]
    return "\n".join(lines)
