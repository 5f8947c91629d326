"""Experiments on a Slurm cluster: each planned run is one element of a job array, a report job follows.

Every stage submits the same way (``--slurm`` on ``condinit-train`` and ``condinit-pretrain``;
:func:`submit_experiment`). An element (:class:`RunElement`) trains one run with every GPU and node of its
allocation: one Slurm task per node starts a supervising process, which takes the rendezvous from Slurm's
environment (:func:`condinit_det.launch.slurm.slurm_rendezvous`) and runs the experiment reduced to that run
(:meth:`condinit_det.launch.experiment.Experiment.only`), with ``--resume`` semantics (a run that was requeued,
killed or submitted again continues from its last checkpoint; a finished run is skipped; failures are recorded as
in :func:`condinit_det.launch.experiment.execute`).

On the time-limit signal the training processes stop at the next step boundary (detection writes a checkpoint,
pretraining stops at its last epoch checkpoint) and the element requeues itself; a job killed without warning
resumes from its last checkpoint when it is requeued or submitted again. Submitting again knows what is in flight
(``<base>/slurm.json``, :mod:`condinit_det.records.jobs`): a run whose current job may still run is not submitted
again, and the new report job waits for it too. The operational detail: docs/slurm.md.
"""
from __future__ import annotations

import copy
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from submitit.helpers import Checkpointable, DelayedSubmission

from ..records.failures import failure_of
from ..records.jobs import read_jobs, read_report_jobs, record_jobs
from ..records.layout import REPORT_DIRNAME, RunSpec
from ..utils.preemption import PREEMPTED_FILENAME, PREEMPTIBLE_ENV, Preempted
from ..utils.squeue import is_pending, query_jobs, still_runs
from .experiment import Experiment, execute

__all__ = ["ReportJob", "RunElement", "Submission", "describe_submission", "replace_report", "submission_plan",
           "submit_experiment", "submit_report", "submit_runs"]

_PREEMPTED_EXIT = 75


def _element_main(experiment: Experiment, spec: RunSpec) -> None:
    """The supervising process of an element on one node: the experiment reduced to ``spec``."""
    from .slurm import slurm_rendezvous

    os.environ[PREEMPTIBLE_ENV] = "1"
    signal.signal(signal.SIGUSR2, lambda *_: None)  # the training processes act on it, this one must not die
    experiment = experiment.only(spec)
    args = experiment.args = copy.copy(experiment.args)
    args.num_machines, args.machine_rank, args.num_gpus, args.dist_url = slurm_rendezvous(
        cpu_processes_per_machine=max(int(args.num_gpus), 1))
    args.resume = True
    try:
        code = execute(experiment)
    except Preempted:
        code = _PREEMPTED_EXIT
    sys.exit(code)


def _wait_for(path: str, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.5)
    return False


class RunElement(Checkpointable):
    """One planned run as a submitit callable (a job-array element); requeues itself on the time-limit signal."""

    def __init__(self, experiment: Experiment, spec: RunSpec):
        if spec not in experiment.runs:
            raise ValueError(f"{spec} is not a planned run of {experiment.base}")
        self.experiment, self.spec = experiment, spec

    @property
    def run_dir(self) -> str:
        return self.experiment.run_dir(self.spec)

    def __call__(self) -> str:
        process = multiprocessing.get_context("spawn").Process(target=_element_main,
                                                               args=(self.experiment, self.spec))
        process.start()
        process.join()
        if process.exitcode == 0:
            return f"{self.run_dir}: finished"
        if process.exitcode == _PREEMPTED_EXIT:  # checkpoint() is requeueing this job
            time.sleep(max(int(self.experiment.args.signal_delay), 1))
        failure = failure_of(self.run_dir)
        why = failure.get("message") if failure else f"exit status {process.exitcode}"
        raise RuntimeError(f"{self.run_dir} did not finish: {why}")

    def checkpoint(self, *args, **kwargs):
        """USR2 (time limit): the training processes stop at their next step boundary and leave
        ``<run>/preempted``; wait for it (within the signal delay), then requeue this element."""
        delay = max(int(self.experiment.args.signal_delay), 10)
        _wait_for(os.path.join(self.run_dir, PREEMPTED_FILENAME), timeout=0.75 * delay)
        return DelayedSubmission(RunElement(self.experiment, self.spec))


class ReportJob:
    """The comparison of an experiment (or of both stages of a protocol), written after its runs; with
    ``trackers`` enabling one, attached to a tracker run of its own in the group of ``experiment`` (the experiment
    directory; for a protocol, its fine-tuning stage's)."""

    def __init__(self, paths: Sequence[str], output_dir: str, bootstrap: int, *, trackers: Optional[dict] = None,
                 experiment: Optional[str] = None):
        self.paths, self.output_dir, self.bootstrap = list(paths), output_dir, int(bootstrap)
        self.trackers, self.experiment = trackers, experiment or (self.paths[-1] if self.paths else output_dir)

    def __call__(self) -> str:
        from ..report import compare_arms
        from ..tracking import attach_report

        _, text = compare_arms(self.paths, output_dir=self.output_dir, bootstrap=self.bootstrap)
        print(text, flush=True)
        attach_report(self.trackers, self.experiment, self.output_dir)
        return text


def replace_report(base: str, job_id: str, *, log=print) -> None:
    """Record ``job_id`` as the report job of ``base`` and cancel the previous one if it is still pending: the new
    one waits for every run the old one waited for, so one report covers them all and no two write at once."""
    from .slurm import cancel_job

    earlier = read_report_jobs(base)
    record_jobs(base, {}, job_id)
    if earlier and is_pending(query_jobs([earlier[-1]]).get(earlier[-1])):
        cancel_job(earlier[-1])
        log(f"Report job {earlier[-1]} (pending) is replaced by report job {job_id}")


# ---------------------------------------------------------------------------------------------
# Submitting
# ---------------------------------------------------------------------------------------------
@dataclass
class Submission:
    """What submitting an experiment does with each planned run."""

    todo: List[RunSpec] = field(default_factory=list)  # submitted now
    in_flight: Dict[RunSpec, str] = field(default_factory=dict)  # run -> its pending or running job
    done: List[RunSpec] = field(default_factory=list)  # finished, or diverged (not retried)


def submission_plan(experiment: Experiment, *, states: Optional[Dict[str, str]] = None) -> Submission:
    """Sort the planned runs into the ones to submit, the ones in flight (their current job is pending or
    running) and the ones that need nothing (finished, or diverged and not ``--retry-failed``). ``states``: job id
    -> squeue state (default: asked from ``squeue``)."""
    current = read_jobs(experiment.base)
    if states is None:
        states = query_jobs([current[s.dir] for s in experiment.runs if s.dir in current]).states
    plan = Submission()
    for spec in experiment.runs:
        job = current.get(spec.dir)
        if job is not None and still_runs(states.get(job)):
            plan.in_flight[spec] = job
            continue
        failure = failure_of(experiment.run_dir(spec))
        if failure is not None and failure.get("reason") == "diverged" and not experiment.args.retry_failed:
            plan.done.append(spec)
        elif failure is None and experiment.finished(spec):
            plan.done.append(spec)
        else:
            plan.todo.append(spec)
    return plan


def submit_runs(experiment: Experiment, specs: Sequence[RunSpec], *, name: str, dependency: Optional[str] = None,
                log=print) -> list:
    """Submit ``specs`` (planned runs of ``experiment``) as one job array, each element after ``dependency``
    (sbatch's), and record their jobs in ``<base>/slurm.json``. Returns the submitit jobs, in the order of
    ``specs``."""
    from .slurm import make_executor, slurm_folder, submit

    if not specs:
        return []
    executor = make_executor(experiment.args, slurm_folder(experiment.args, experiment.base), name)
    jobs = submit(executor, [RunElement(experiment, spec) for spec in specs], dependency=dependency)
    record_jobs(experiment.base, {s.dir: str(j.job_id) for s, j in zip(specs, jobs)})
    what = f"job array {str(jobs[0].job_id).split('_')[0]}" if len(jobs) > 1 else f"job {jobs[0].job_id}"
    log(f"Submitted {len(jobs)} run(s) of {experiment.base} as {what}" + (f" after {dependency}" if dependency else ""))
    for spec, job in zip(specs, jobs):
        log(f"  {job.job_id}: {spec.dir}")
    return jobs


def describe_submission(experiment: Experiment, plan: Submission, log=print) -> None:
    """Say what a submission leaves out: the runs in flight (with their job) and those that need nothing."""
    for spec, job in plan.in_flight.items():
        log(f"  {spec.dir}: in flight as job {job}: not resubmitted")
    if plan.done:
        log(f"  {len(plan.done)} run(s) of {experiment.base} finished or diverged earlier: not resubmitted")
    if not plan.todo:
        log(f"Nothing new to submit for {experiment.base}"
            + (f": {len(plan.in_flight)} run(s) in flight" if plan.in_flight else ""))


def submit_experiment(experiment: Experiment, *, name: str, report: bool = True, log=print):
    """Submit the runs of ``experiment`` that need a job (:func:`submission_plan`) as one job array and, with
    ``report``, a report job after them and after the runs still in flight (``afterany``). Returns (the submitted
    jobs, their specs, the in-flight runs' job ids, the report job or None)."""
    from .slurm import slurm_folder

    plan = submission_plan(experiment)
    describe_submission(experiment, plan, log)
    jobs = submit_runs(experiment, plan.todo, name=name, log=log)
    report_job = None
    waits = [str(j.job_id) for j in jobs] + list(plan.in_flight.values())
    if report and waits:
        report_job = submit_report(experiment.args, [experiment.base],
                                   os.path.join(experiment.base, REPORT_DIRNAME), jobs=waits,
                                   folder=slurm_folder(experiment.args, experiment.base), name=f"{name}-report",
                                   log=log, trackers=experiment.trackers)
        replace_report(experiment.base, str(report_job.job_id), log=log)
    log(f"Watch it with: condinit-status {experiment.base}   (submitit logs: "
        f"{slurm_folder(experiment.args, experiment.base)})")
    return jobs, plan.todo, dict(plan.in_flight), report_job


def submit_report(args, paths: Sequence[str], output_dir: str, *, jobs: Sequence[str], folder: str, name: str,
                  log=print, trackers: Optional[dict] = None):
    """A one-node, CPU-only job writing the comparison of ``paths`` once every job in ``jobs`` (ids) ended in any
    way (none: at once); ``trackers``: see :class:`ReportJob` (the last of ``paths`` is the experiment)."""
    from .slurm import after, make_executor, submit

    report_args = copy.copy(args)
    report_args.nodes, report_args.gpus_per_node, report_args.max_parallel = 1, 0, None
    report = ReportJob(paths, output_dir, args.bootstrap, trackers=trackers)
    (job,) = submit(make_executor(report_args, folder, name), [report],
                    dependency=after("afterany", jobs) if jobs else None)
    log(f"Report job {job.job_id} writes {output_dir} after them")
    return job
