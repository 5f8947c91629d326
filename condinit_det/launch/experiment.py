"""Executing the planned runs of an experiment locally, one launch per run, failures recorded."""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from ..records.failures import describe_failure, discard_notes, failure_of, failure_reason, one_line, record_failure
from ..records.layout import REPORT_DIRNAME, RunSpec, set_aside
from ..records.results import FAILED_KIND, ResultsFile
from ..utils.preemption import PREEMPTED_FILENAME, Preempted

__all__ = ["Outcome", "execute_runs", "failure_summary", "finish_experiment"]


@dataclass
class Outcome:
    """What became of one planned run in :func:`execute_runs`."""

    spec: RunSpec
    path: str
    failure: Optional[dict] = None  # the "failed" record; None when the run finished (now or earlier)


def execute_runs(runs: Sequence[RunSpec], base: str, *, launch: Callable[[RunSpec], object],
                 finished: Callable[[RunSpec], bool], resume: bool, retry_failed: bool = False,
                 config: Optional[str] = None, main: bool = True,
                 log: Optional[logging.Logger] = None) -> List[Outcome]:
    """Train every planned run through ``launch(spec)`` (all processes of one run); a run that raises is
    recorded as failed and the next one starts. Resume rules: see the module docstring. ``main``: whether
    this is the launcher that writes (the first machine's); the others only launch. ``log``: the stage's
    console logger."""
    logger = log or logging.getLogger("condinit_det")
    outcomes = []
    for spec in runs:
        run_dir = spec.path(base)
        name = f"{spec.arm}/{spec.name}"
        failure = failure_of(run_dir) if resume else None
        if failure is not None and retry_failed:
            aside = set_aside(run_dir) if main else "<run>.failed<n>"
            logger.warning(f"Run {name} {describe_failure(failure)} earlier; moved aside to {aside}, training it "
                           "afresh (--retry-failed)")
        elif failure is not None and failure.get("reason") == "diverged":
            logger.warning(f"Run {name} {describe_failure(failure)} earlier: not retried, the same seed and settings "
                           "diverge again (--retry-failed trains it afresh)")
            outcomes.append(Outcome(spec, run_dir, failure))
            continue
        elif failure is not None:
            if main:
                ResultsFile(run_dir).remove(FAILED_KIND)
            logger.warning(f"Run {name} {describe_failure(failure)} earlier: resuming it from its last checkpoint")
        elif resume and finished(spec):
            logger.info(f"Run {name} already finished in {run_dir}: skipped, results kept")
            outcomes.append(Outcome(spec, run_dir))
            continue
        preempted = os.path.join(run_dir, PREEMPTED_FILENAME)
        if main and os.path.exists(preempted):
            os.remove(preempted)
        try:
            launch(spec)
        except Exception as e:  # noqa: BLE001 -- any failure of one run is a result; the experiment goes on
            if isinstance(e, Preempted) or os.path.exists(preempted):
                if main:
                    discard_notes(run_dir)  # the processes stopped by the requeue signal are not failures
                raise Preempted(f"run {name} stopped for a requeue; it resumes from its last checkpoint") from e
            metadata = {"arm": spec.arm, "seed": spec.seed, "lr_scale": spec.lr_scale, "config": config}
            record = record_failure(run_dir, e, metadata) if main else {
                "kind": FAILED_KIND, "reason": failure_reason(e), "iteration": 0, "message": one_line(e), **metadata}
            logger.error(f"Run {name} {describe_failure(record)} (traceback in {run_dir}/log*); going on with "
                         "the next run")
            outcomes.append(Outcome(spec, run_dir, record))
        else:
            outcomes.append(Outcome(spec, run_dir))
    return outcomes


def failure_summary(outcomes: Sequence[Outcome]) -> List[str]:
    """Lines naming the failed runs (empty when none failed)."""
    failed = [o for o in outcomes if o.failure is not None]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} run(s) did not finish:"]
    lines += [f"  {o.spec.arm} seed {o.spec.seed}" + ("" if o.spec.lr_scale == 1.0 else f" lr scale {o.spec.lr_scale:g}")
              + f": {describe_failure(o.failure)} ({o.path})" for o in failed]
    return lines


def finish_experiment(base: str, outcomes: Sequence[Outcome], *, report: bool, bootstrap: int = 1000) -> int:
    """The end of an experiment: with ``report``, write and print the comparison into ``<base>/report/``; then
    name the runs that failed or diverged. Returns the exit status (1 when one did)."""
    if report:
        from ..report import compare_arms

        report_dir = os.path.join(base, REPORT_DIRNAME)
        try:
            _, text = compare_arms([base], output_dir=report_dir, bootstrap=bootstrap)
            print(text + f"\nReport written to {report_dir}", flush=True)
        except ValueError as e:  # e.g. no run finished: the failures below say why
            print(f"No report: {e}", file=sys.stderr, flush=True)
    lines = failure_summary(outcomes)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return 1 if lines else 0
