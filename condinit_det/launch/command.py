"""One training command for any stage: parse, plan and check, then train here or submit to Slurm."""
from __future__ import annotations

import sys
from typing import List, Optional

from ..stage import Stage
from ..utils.errors import UsageError
from .arguments import build_parser

__all__ = ["run_command"]


def run_command(stage: Stage, argv: Optional[List[str]] = None) -> int:
    """The training command of ``stage`` (``condinit-train``, ``condinit-pretrain``): returns the exit status.

    Bad input ends with one error line and exit status 2, before anything is written; ``--dry-run`` prints the
    plan; ``--slurm`` submits the runs as a job array and returns 0; otherwise the runs train here, one after
    another, and a run that failed or diverged makes the status 1 (the others go on)."""
    from ..records.lock import RunInUse
    from .experiment import execute, plan_experiment

    parser = build_parser(description=stage.description, examples=stage.examples, config_help=stage.config_help)
    args = parser.parse_args(argv)
    try:
        experiment = plan_experiment(stage, args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from .plan import describe_plan

        print(describe_plan(experiment))
        return 0
    if args.slurm:
        from .cluster import submit_experiment

        experiment.write_plan()
        submit_experiment(experiment, name="condinit-" + stage.name, report=len(experiment.runs) > 1)
        return 0
    try:
        return execute(experiment)
    except RunInUse as e:  # the one planned run: another process trains it
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
