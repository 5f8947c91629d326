"""One training command for any stage: parse, plan and check, then train here or submit to Slurm."""

from __future__ import annotations

import shlex
import sys
from typing import Callable, List, Optional

from ..stage import Stage
from ..utils.errors import UsageError
from .arguments import build_parser, parse_arguments

__all__ = ["run_command"]


def run_command(
    make_stage: Callable[[], Stage],
    argv: Optional[List[str]] = None,
    *,
    description: str = "",
    examples: str = "",
    config_help: str = "",
) -> int:
    """The training command of a stage (``condinit-train``, ``condinit-pretrain``): returns the exit status.

    Args:
        make_stage: returns the stage; called after the command line is parsed, so that ``--help`` imports
            nothing of the stage.
        description, examples, config_help: the command's ``--help`` texts.

    Bad input ends with one error line and exit status 2, before anything is written; ``--dry-run`` prints the
    plan; ``--slurm`` submits the runs as a job array and returns 0; otherwise the runs train here, one after
    another, and a run that failed or diverged makes the status 1 (the others go on)."""
    parser = build_parser(description=description, examples=examples, config_help=config_help)
    args = parse_arguments(parser, argv)
    args.command = shlex.join([parser.prog, *(sys.argv[1:] if argv is None else argv)])  # what submits it again
    from ..records.lock import RunInUse
    from .plan import describe_plan, plan_experiment

    try:
        experiment = plan_experiment(make_stage(), args)
        if args.dry_run:
            print(describe_plan(experiment))
            return 0
        if args.slurm:
            from .slurm import submit_experiment

            experiment.write_plan()
            submit_experiment(experiment, name="condinit-" + experiment.stage.name, report=len(experiment.runs) > 1)
            return 0
        from .run import execute

        return execute(experiment)
    except (UsageError, RunInUse) as e:  # RunInUse: the one planned run is another process's
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
