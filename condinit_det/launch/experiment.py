"""Experiments of any stage: plan the runs, check them, run each in a launch of its own, end with the report.

An experiment is the arm x seed x lr-scale runs of one config (:func:`plan_experiment`), laid out as
:mod:`condinit_det.records.layout` says. :func:`execute` trains them one after another on this machine (or on the
processes of one Slurm element, :mod:`.cluster`):

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
  to ``<run>.failed<n>/`` and trains it afresh; a run started without ``--resume`` sets the previous run's
  ``results.json`` and ``metrics.json`` aside (``*.<n>.json.bak``) and deletes its checkpoints;
- with several runs, the comparison is written into ``<base>/report/`` at the end;
- the trackers the config enables (W&B, MLflow: :mod:`condinit_det.tracking`) get one tracker run per run, opened
  in its main process, continued on resume and marked failed with it, and the report on a tracker run of its own.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import os
import sys
from dataclasses import dataclass
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
from ..records.layout import (
    REPORT_DIRNAME,
    RunSpec,
    parse_arms,
    parse_lr_scales,
    parse_seeds,
    plan_runs,
    set_aside,
    write_plan,
)
from ..records.lock import RunInUse, RunLock
from ..records.results import FAILED_KIND, ResultsFile
from ..stage import RunOptions, Stage
from ..tracking import (
    RunInfo,
    attach_report,
    check_trackers,
    enabled_trackers,
    forget_runs,
    mark_unfinished,
    tracked_run,
    tracker_settings,
)
from ..utils.distributed import launch, rank
from ..utils.errors import UsageError
from ..utils.fileio import move_aside
from ..utils.logs import console_logging, run_logging
from ..utils.preemption import PREEMPTED_FILENAME, Preempted
from ..utils.threads import apply_thread_settings

__all__ = [
    "Experiment",
    "Outcome",
    "execute",
    "failure_summary",
    "finish_experiment",
    "plan_experiment",
    "run_worker",
    "start_fresh",
]

logger = logging.getLogger("condinit_det.launch")


@dataclass
class Experiment:
    """The planned runs of one config in one stage.

    Attributes:
        stage: the training stage.
        args: the command's flags (:func:`condinit_det.launch.arguments.build_parser`).
        base: the experiment directory; run ``spec`` lives in ``spec.path(base)``.
        runs: the planned runs, in training order.
        length: how long each run trains, in ``stage.unit``.
        device: ``"cpu"`` or ``"cuda"``.
        upstream: an earlier stage's experiment directory: each run starts from the final weights of the run with
            the same arm and seed there (the paper's protocol: detection fine-tuned from each arm's pretraining).
        element: one run of a Slurm array (no plan written, no report at its end).
    """

    stage: Stage
    args: argparse.Namespace
    base: str
    runs: List[RunSpec]
    length: int
    device: str
    upstream: Optional[str] = None
    element: bool = False
    trackers: Optional[dict] = None  # the config's W&B / MLflow settings (condinit_det.tracking)

    @property
    def options(self) -> RunOptions:
        """What the stage gets of the command line."""
        args = self.args
        return RunOptions(config_file=args.config_file or "", resume=bool(args.resume), eval_only=bool(args.eval_only),
                          trust_pickle=bool(args.trust_pickle),
                          allow_shared_checkpoint=bool(args.allow_shared_checkpoint),
                          processes=int(args.num_gpus) * int(args.num_machines), submitted=bool(args.slurm))

    def run_dir(self, spec: RunSpec) -> str:
        return spec.path(self.base)

    def init_from(self, spec: RunSpec) -> Optional[str]:
        """The upstream run this run starts from (same arm and seed, the upstream's own learning rate)."""
        return RunSpec(spec.arm, spec.seed).path(self.upstream) if self.upstream else None

    def config(self, spec: RunSpec):
        """The run's config, loaded and set up afresh (every process calls this)."""
        cfg = self.stage.load_config(self.args.config_file, self.args.opts)
        return self.stage.configure_run(cfg, spec, self.run_dir(spec), init_from=self.init_from(spec))

    def finished(self, spec: RunSpec) -> bool:
        return self.stage.finished(self.run_dir(spec), self.length)

    def only(self, spec: RunSpec) -> "Experiment":
        """This experiment reduced to one of its runs, as a Slurm element runs it."""
        if spec not in self.runs:
            raise ValueError(f"{spec} is not a planned run of {self.base}")
        return dataclasses.replace(self, runs=[spec], element=True)

    def write_plan(self) -> str:
        """``<base>/experiment.json``: the runs the report and the status command expect."""
        return write_plan(self.base, self.runs, stage=self.stage.descriptor, config=self.args.config_file or None,
                          length=self.length)


def plan_experiment(stage: Stage, args: argparse.Namespace, *, output_dir: Optional[str] = None,
                    upstream: Optional[str] = None, check: bool = True) -> Experiment:
    """Plan the runs ``args`` asks for and, with ``check``, check everything that can be checked before a process
    starts; nothing is written. Raises :class:`UsageError` (one line) on bad input.

    Args:
        stage: the training stage.
        args: the parsed flags (``--retry-failed`` and ``--slurm`` set ``args.resume``).
        output_dir: the experiment directory instead of the config's output directory.
        upstream: see :attr:`Experiment.upstream`.
        check: run the stage's checks and the resume-identity check of every run.
    """
    try:
        return _plan(stage, args, output_dir=output_dir, upstream=upstream, check=check)
    except UsageError:
        raise
    except (ValueError, FileNotFoundError) as e:  # the stages' checks: bad input, said in one line
        raise UsageError(" ".join(str(e).split())) from None


def _plan(stage: Stage, args, *, output_dir, upstream, check) -> Experiment:
    if args.retry_failed or args.slurm:
        args.resume = True  # a submission continues what exists: resubmitting is always safe
    if args.slurm and args.eval_only:
        raise UsageError("--slurm submits training runs; run --eval-only directly")
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap {args.bootstrap}: expected a number of resamples >= 0 (0: no intervals)")
    cfg = stage.load_config(args.config_file, args.opts)
    defaults = stage.defaults(cfg)
    base = output_dir or defaults.output_dir
    if not base:
        raise UsageError("the config has no output directory (train.output_dir); runs go to "
                         "<output_dir>/<arm>/seed<k>/")
    arms = parse_arms(args.arm) if args.arm else [defaults.arm]
    seeds = parse_seeds(args.seeds) if args.seeds is not None else [defaults.seed]
    scales = parse_lr_scales(args.lr_scale) if args.lr_scale is not None else [1.0]
    if args.slurm:  # each array element runs with its allocation's processes (.cluster)
        args.num_machines = args.nodes
        args.num_gpus = args.gpus_per_node or args.num_gpus
    experiment = Experiment(stage=stage, args=args, base=base, runs=plan_runs(arms, seeds, scales),
                            length=stage.length(cfg), device=stage.device(cfg),
                            upstream=upstream, trackers=tracker_settings(cfg))
    if check:
        configured = [(spec, experiment.config(spec)) for spec in experiment.runs]
        stage.check(experiment.options, configured, upstream=upstream)
        if not args.eval_only:
            check_trackers(experiment.trackers, base)
        if args.resume and not args.eval_only:
            for spec, run_cfg in configured:
                run_dir = experiment.run_dir(spec)
                ResultsFile(run_dir).records()  # a corrupt results.json raises here, and stays as it is
                check_resume_identity(run_dir, stage.identity(run_cfg), allow_change=args.allow_changed_run)
    return experiment


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------
def run_worker(experiment: Experiment, spec: RunSpec) -> None:
    """Per-process entry point of one planned run (what ``detectron2.engine.launch`` calls in every process):
    train it, or with ``--eval-only`` evaluate it. A failure leaves a note in the run directory for the launching
    process and is re-raised."""
    args, stage = experiment.args, experiment.stage
    cfg = experiment.config(spec)
    run_dir = experiment.run_dir(spec)
    run_logging(run_dir, rank=rank())  # the stage sets its own up again; the thread sizing is in the run's log too
    _size_threads(experiment, cfg)
    try:
        if args.eval_only:
            stage.evaluate(experiment.options, cfg, run_dir)
        else:
            with _tracking(experiment, spec, cfg):
                stage.train(experiment.options, cfg, run_dir)
    except Preempted:
        raise
    except Exception as e:
        if not args.eval_only and os.path.isdir(run_dir) and note_failure(run_dir, e, rank=rank()):
            logger.exception(f"Run {run_dir} failed:")
        raise


def _tracking(experiment: Experiment, spec: RunSpec, cfg):
    """The run's tracker runs (W&B, MLflow) while it trains, in its main process only (:mod:`condinit_det.tracking`;
    the stages' writers send to them)."""
    if rank() != 0 or not enabled_trackers(experiment.trackers):
        return contextlib.nullcontext()
    stage = experiment.stage
    info = RunInfo(name=spec.dir, run_dir=experiment.run_dir(spec), experiment_dir=experiment.base, stage=stage.name,
                   arm=spec.arm, seed=spec.seed, lr_scale=spec.lr_scale, config=experiment.args.config_file or None,
                   identity=stage.identity(cfg))
    return tracked_run(experiment.trackers, info)


def _size_threads(experiment: Experiment, cfg) -> None:
    """Inside a Slurm job (or a CPU affinity smaller than the machine, or with ``--cpus-per-task``): intra-op
    threads and data-loader workers of this process from its share of the CPUs; the config's worker count is the
    most it gets. Elsewhere nothing changes."""
    from ..utils.threads import allocated_cpus

    args = experiment.args
    allocated = allocated_cpus() or args.cpus_per_task
    if allocated is None:
        return
    stage = experiment.stage
    plan = apply_thread_settings(max(int(args.num_gpus), 1), allocated=allocated,
                                 max_workers=stage.loader_workers(cfg), log=logger)
    stage.set_loader_workers(cfg, plan.loader_workers)


def start_fresh(stage: Stage, run_dir: str) -> None:
    """Before a run that is not resumed: set the previous run's ``results.json`` and ``metrics.json`` aside
    (``results.<n>.json.bak``, ``metrics.<n>.json.bak``) and delete the stage's stale files (its checkpoints)."""
    old = ResultsFile(run_dir).archive()
    if old:
        logger.warning(f"Fresh (non --resume) run: previous results moved to {old}")
    move_aside(os.path.join(run_dir, "metrics.json"))
    forget_runs(run_dir)  # new tracker runs
    stale = [p for p in stage.stale_files(run_dir) if os.path.isfile(p)]
    for path in stale:
        os.remove(path)
    if stale:
        logger.warning(f"Fresh (non --resume) run: removed the previous run's "
                       f"{', '.join(sorted(map(os.path.basename, stale)))}")


def _launch(experiment: Experiment, spec: RunSpec) -> None:
    """All processes of one run (this machine's share of them), then the launcher's console logging again."""
    import torch

    args = experiment.args
    try:
        launch(run_worker, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
               dist_url=args.dist_url, args=(experiment, spec), device=experiment.device)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        console_logging()


def _prepare(experiment: Experiment, spec: RunSpec) -> None:
    """In the main launcher, before a training run starts: its identity when resumed, a fresh start otherwise."""
    args, run_dir = experiment.args, experiment.run_dir(spec)
    if args.resume:
        identity = experiment.stage.identity(experiment.config(spec))
        check_resume_identity(run_dir, identity, allow_change=args.allow_changed_run)
    else:
        start_fresh(experiment.stage, run_dir)


# ---------------------------------------------------------------------------------------------
# Several runs
# ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What became of one planned run in :func:`execute`."""

    spec: RunSpec
    path: str
    failure: Optional[dict] = None  # the "failed" record; None when the run finished (now or earlier)
    in_use: Optional[str] = None  # "in use by ...": another process owns the run; it was not touched


def _run_one(experiment: Experiment, spec: RunSpec, *, main: bool) -> Outcome:
    """Own one planned run (the main launcher; the others follow it) and train it under the resume rules (module
    docstring)."""
    run_dir = experiment.run_dir(spec)
    if not main:
        return _train_one(experiment, spec, main=False, owned=contextlib.ExitStack())
    with contextlib.ExitStack() as owned:
        try:
            owned.enter_context(RunLock(run_dir, log=logger))
        except RunInUse as e:
            if len(experiment.runs) == 1:
                raise
            logger.error(f"Run {spec.dir}: {e}; going on with the next run")
            return Outcome(spec, run_dir, in_use=str(e))
        return _train_one(experiment, spec, main=True, owned=owned)


def _train_one(experiment: Experiment, spec: RunSpec, *, main: bool, owned: contextlib.ExitStack) -> Outcome:
    args, run_dir, name = experiment.args, experiment.run_dir(spec), spec.dir
    failure = failure_of(run_dir) if args.resume else None
    if failure is not None and args.retry_failed:
        aside = "<run>.failed<n>"
        if main:
            aside = set_aside(run_dir)  # the lock file goes with it: own the fresh directory before it is let go
            owned.enter_context(RunLock(run_dir, log=logger))
        logger.warning(f"Run {name} {describe_failure(failure)} earlier; moved aside to {aside}, training it "
                       "afresh (--retry-failed)")
    elif failure is not None and failure.get("reason") == "diverged":
        logger.warning(f"Run {name} {describe_failure(failure)} earlier: not retried, the same seed and settings "
                       "diverge again (--retry-failed trains it afresh)")
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
            _prepare(experiment, spec)
        _launch(experiment, spec)
    except Exception as e:  # noqa: BLE001 -- any failure of one run is a result; the experiment goes on
        if isinstance(e, Preempted) or os.path.exists(preempted):
            if main:
                discard_notes(run_dir)  # the processes stopped by the requeue signal are not failures
            raise Preempted(f"run {name} stopped for a requeue; it resumes from its last checkpoint") from e
        metadata = {"stage": experiment.stage.name, "arm": spec.arm, "seed": spec.seed, "lr_scale": spec.lr_scale,
                    "config": experiment.args.config_file or None}
        record = record_failure(run_dir, e, metadata) if main else {
            "kind": FAILED_KIND, "reason": failure_reason(e), "iteration": 0, "message": one_line(e), **metadata}
        if main:
            mark_unfinished(run_dir)  # the tracker runs of a process killed before it could mark them failed
        logger.error(f"Run {name} {describe_failure(record)} (traceback in {run_dir}/log*); going on with the "
                     "next run")
        return Outcome(spec, run_dir, record)
    return Outcome(spec, run_dir)


def _evaluate_one(experiment: Experiment, spec: RunSpec, *, main: bool) -> None:
    with RunLock(experiment.run_dir(spec), log=logger) if main else contextlib.nullcontext():
        _launch(experiment, spec)


def execute(experiment: Experiment) -> int:
    """Train (or with ``--eval-only`` evaluate) every planned run, each in a launch of its own; with several runs
    write the comparison at the end. Returns the exit status: 1 when a run failed or diverged (named on the last
    lines), else 0. Call :func:`plan_experiment` first."""
    args = experiment.args
    console_logging()
    main = int(args.machine_rank) == 0
    if args.eval_only:
        for spec in experiment.runs:
            _evaluate_one(experiment, spec, main=main)
        return 0
    if main and not experiment.element:
        experiment.write_plan()
    outcomes = [_run_one(experiment, spec, main=main) for spec in experiment.runs]
    report = len(experiment.runs) > 1 and main and not experiment.element
    return finish_experiment(experiment.base, outcomes, report=report, bootstrap=args.bootstrap,
                             trackers=experiment.trackers)


def failure_summary(outcomes: Sequence[Outcome]) -> List[str]:
    """Lines naming the runs that failed, diverged or were in use by another process (empty when none)."""
    failed = [o for o in outcomes if o.failure is not None or o.in_use is not None]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} run(s) did not finish:"]
    for o in failed:
        what = describe_failure(o.failure) if o.failure is not None else f"not trained here: {o.in_use}"
        lr_scale = "" if o.spec.lr_scale == 1.0 else f" lr scale {o.spec.lr_scale:g}"
        lines.append(f"  {o.spec.arm} seed {o.spec.seed}{lr_scale}: {what} ({o.path})")
    return lines


def finish_experiment(base: str, outcomes: Sequence[Outcome], *, report: bool, bootstrap: int = 1000,
                      trackers: Optional[dict] = None) -> int:
    """The end of an experiment: with ``report``, write and print the comparison into ``<base>/report/`` (and
    attach it to a tracker run of its own when ``trackers`` enables one); then name the runs that failed or
    diverged. Returns the exit status (1 when one did)."""
    if report:
        from ..report import compare_arms

        report_dir = os.path.join(base, REPORT_DIRNAME)
        try:
            _, text = compare_arms([base], output_dir=report_dir, bootstrap=bootstrap)
            print(text + f"\nReport written to {report_dir}", flush=True)
            attach_report(trackers, base, report_dir)
        except ValueError as e:  # e.g. no run finished: the failures below say why
            print(f"No report: {e}", file=sys.stderr, flush=True)
    lines = failure_summary(outcomes)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return 1 if lines else 0
