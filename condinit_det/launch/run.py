"""Run a planned experiment here: each run in a launch of its own, failures recorded, the report at the end.

:func:`execute` trains the runs of a plan (:mod:`.plan`) one after another on this machine, or on the processes of
one Slurm element (:mod:`.slurm`):

- each run has a launch of its own (detectron2's ``launch``: one process per GPU, or CPU processes with gloo),
  owned by this process for its whole duration (:mod:`condinit_det.records.lock`): a run another process owns is
  not touched ("in use by ..."; a single run then ends with exit status 2, an experiment goes on);
- inside a Slurm job (or with ``--cpus-per-task``) every training process sizes its threads and data-loader
  workers from the CPUs the job was given (:mod:`condinit_det.utils.threads`);
- a run that raises is a result: it gets a ``"failed"`` record (``"diverged"`` for a non-finite loss, else
  ``"error"``), every process of it stops, and the next run starts; the command ends with exit status 1 and names
  the failed runs on its last lines;
- ``--resume`` skips finished runs, continues one that failed with an error from its last checkpoint and skips a
  diverged one (the same seed and settings diverge again); ``--retry-failed`` moves a failed or diverged run aside
  to ``<run>.failed<n>/`` and trains it afresh;
- with several runs, the comparison is written into ``<base>/report/`` at the end (and attached to the trackers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import sys
from typing import List, Optional, Sequence

from ..records.failures import (
    describe_failure,
    discard_notes,
    failure_of,
    failure_reason,
    note_failure,
    one_line,
    record_failure,
)
from ..records.identity import check_resume_identity
from ..records.layout import REPORT_DIRNAME, RunSpec, set_aside
from ..records.lock import RunInUse, RunLock
from ..records.results import FAILED_KIND, ResultsFile
from ..utils.preemption import PREEMPTED_FILENAME, Preempted
from ..utils.threads import allocated_cpus, apply_thread_settings
from .plan import Experiment

__all__ = ["Outcome", "ReportJob", "execute", "failure_summary", "run_worker"]

logger = logging.getLogger("condinit_det.launch")


def _logging(run_dir: Optional[str], *, process_rank: int = 0) -> None:
    """:func:`condinit_det.utils.logs.run_logging` into ``run_dir`` (None: the launcher's console). It, and the
    distributed helpers, are imported where used: a report job and the supervising process of a Slurm element load
    this module, and neither needs torch."""
    from ..utils.logs import run_logging

    run_logging(run_dir, rank=process_rank)


def run_worker(experiment: Experiment, spec: RunSpec) -> None:
    """Per-process entry point of one planned run (what ``detectron2.engine.launch`` calls in every process):
    train it, or with ``--eval-only`` evaluate it. A failure leaves a note in the run directory for the launching
    process and is re-raised."""
    from ..utils.distributed import rank

    args, stage = experiment.args, experiment.stage
    cfg = experiment.config(spec)
    run_dir = experiment.run_dir(spec)
    _logging(run_dir, process_rank=rank())
    allocated = allocated_cpus() or args.cpus_per_task
    if allocated is not None:  # a Slurm job, a CPU affinity or --cpus-per-task: this process's share of the CPUs
        plan = apply_thread_settings(
            max(int(args.num_gpus), 1), allocated=allocated, max_workers=stage.loader_workers(cfg), log=logger
        )
        stage.set_loader_workers(cfg, plan.loader_workers)
    run = stage.evaluate if args.eval_only else stage.train
    try:
        run(experiment.options, cfg, run_dir)
    except Preempted:
        raise
    except Exception as e:
        if not args.eval_only and os.path.isdir(run_dir) and note_failure(run_dir, e, rank=rank()):
            logger.exception(f"Run {run_dir} failed:")
        raise


def _launch(experiment: Experiment, spec: RunSpec) -> None:
    """All processes of one run (this machine's share of them), then the launcher's console logging again."""
    import torch

    from ..utils.distributed import launch

    args = experiment.args
    try:
        launch(
            run_worker,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(experiment, spec),
            device=experiment.device,
        )
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _logging(None)


class ReportJob:
    """The comparison of an experiment (or of both stages of a protocol), written and printed after its runs (at the
    end of :func:`execute`, or as a Slurm job of its own); with ``trackers`` enabling one, attached to a tracker run
    of its own in the group of the last of ``paths`` (the experiment directory; for a protocol, its fine-tuning
    stage's)."""

    def __init__(self, paths: Sequence[str], output_dir: str, bootstrap: int, trackers: Optional[dict] = None):
        self.paths, self.output_dir, self.bootstrap, self.trackers = list(paths), output_dir, int(bootstrap), trackers

    def __call__(self) -> str:
        from .. import tracking
        from ..report import compare_arms

        _, text = compare_arms(self.paths, output_dir=self.output_dir, bootstrap=self.bootstrap)
        print(text, flush=True)
        if tracking.enabled_trackers(self.trackers):  # the writers load detectron2 and torch
            tracking.attach_report(self.trackers, self.paths[-1], self.output_dir)
        return text


@dataclasses.dataclass
class Outcome:
    """What became of one planned run in :func:`execute`."""

    spec: RunSpec
    path: str
    failure: Optional[dict] = None  # the "failed" record; None when the run finished (now or earlier)
    not_run: Optional[str] = None  # why it was not touched: another process owns it, or its records are unreadable


def _run_one(experiment: Experiment, spec: RunSpec, *, main: bool) -> Outcome:
    """Own one planned run (the main launcher; the others follow it) and train it under the resume rules (module
    docstring)."""
    run_dir = experiment.run_dir(spec)
    if spec in experiment.unreadable:
        logger.error(f"Run {spec.dir}: {experiment.unreadable[spec]}; not touched, going on with the next run")
        return Outcome(spec, run_dir, not_run=experiment.unreadable[spec])
    with contextlib.ExitStack() as owned:
        try:
            if main:
                owned.enter_context(RunLock(run_dir, log=logger))
        except RunInUse as e:
            if len(experiment.runs) == 1:
                raise
            logger.error(f"Run {spec.dir}: {e}; going on with the next run")
            return Outcome(spec, run_dir, not_run=f"not trained here: {e}")
        return _train_one(experiment, spec, main=main, owned=owned)


def _train_one(experiment: Experiment, spec: RunSpec, *, main: bool, owned: contextlib.ExitStack) -> Outcome:
    args, run_dir, name = experiment.args, experiment.run_dir(spec), spec.dir
    failure = failure_of(run_dir) if args.resume else None
    if failure is not None and args.retry_failed:
        aside = "<run>.failed<n>"
        if main:
            aside = set_aside(run_dir)  # the lock file goes with it: own the fresh directory before it is let go
            owned.enter_context(RunLock(run_dir, log=logger))
        logger.warning(
            f"Run {name} {describe_failure(failure)} earlier; moved aside to {aside}, training it "
            "afresh (--retry-failed)"
        )
    elif failure is not None and failure.get("reason") == "diverged":
        logger.warning(
            f"Run {name} {describe_failure(failure)} earlier: not retried, the same seed and settings "
            "diverge again (--retry-failed trains it afresh)"
        )
        return Outcome(spec, run_dir, failure)
    elif failure is not None:
        if main:
            ResultsFile(run_dir).remove(FAILED_KIND)
        logger.warning(f"Run {name} {describe_failure(failure)} earlier: resuming it from its last checkpoint")
    elif args.resume and experiment.finished(spec):
        logger.info(f"Run {name} already finished in {run_dir}: skipped, results kept")
        return Outcome(spec, run_dir)
    preempted = os.path.join(run_dir, PREEMPTED_FILENAME)
    try:
        if main:
            if os.path.exists(preempted):
                os.remove(preempted)
            if args.resume:
                identity = experiment.stage.identity(experiment.config(spec))
                check_resume_identity(run_dir, identity, allow_change=args.allow_changed_run)
        _launch(experiment, spec)
    except Exception as e:  # noqa: BLE001 -- any failure of one run is a result; the experiment goes on
        if isinstance(e, Preempted) or os.path.exists(preempted):
            if main:
                discard_notes(run_dir)  # the processes stopped by the requeue signal are not failures
            raise Preempted(f"run {name} stopped for a requeue; it resumes from its last checkpoint") from e
        metadata = {"stage": experiment.stage.name, **dataclasses.asdict(spec), "config": args.config_file or None}
        record = (
            record_failure(run_dir, e, metadata)
            if main
            else {"kind": FAILED_KIND, "reason": failure_reason(e), "iteration": 0, "message": one_line(e), **metadata}
        )
        logger.error(f"Run {name} {describe_failure(record)} (traceback in {run_dir}/log*); going on with the next run")
        return Outcome(spec, run_dir, record)
    return Outcome(spec, run_dir)


def execute(experiment: Experiment) -> int:
    """Train (or with ``--eval-only`` evaluate) every planned run, each in a launch of its own; with several runs
    write and print the comparison into ``<base>/report/`` at the end (and attach it to a tracker run of its own
    when the config's trackers enable one). Returns the exit status: 1 when a run failed, diverged or was not
    touched (named on the last lines), else 0. Call :func:`condinit_det.launch.plan.plan_experiment` first."""
    args = experiment.args
    _logging(None)
    main = int(args.machine_rank) == 0
    if args.eval_only:
        for spec in experiment.runs:
            with RunLock(experiment.run_dir(spec), log=logger) if main else contextlib.nullcontext():
                _launch(experiment, spec)
        return 0
    if main and not experiment.element:
        experiment.write_plan()
    outcomes = [_run_one(experiment, spec, main=main) for spec in experiment.runs]
    if len(experiment.runs) > 1 and main and not experiment.element:
        report_dir = os.path.join(experiment.base, REPORT_DIRNAME)
        try:
            ReportJob([experiment.base], report_dir, args.bootstrap, experiment.trackers)()
            print(f"Report written to {report_dir}", flush=True)
        except ValueError as e:  # e.g. no run finished: the failures below say why
            print(f"No report: {e}", file=sys.stderr, flush=True)
    lines = failure_summary(outcomes)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return 1 if lines else 0


def failure_summary(outcomes: Sequence[Outcome]) -> List[str]:
    """Lines naming the runs that failed, diverged or were not touched (empty when none)."""
    failed = [o for o in outcomes if o.failure is not None or o.not_run is not None]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} run(s) did not finish:"]
    for o in failed:
        what = describe_failure(o.failure) if o.failure is not None else o.not_run
        lr_scale = "" if o.spec.lr_scale == 1.0 else f" lr scale {o.spec.lr_scale:g}"
        lines.append(f"  {o.spec.arm} seed {o.spec.seed}{lr_scale}: {what} ({o.path})")
    return lines
