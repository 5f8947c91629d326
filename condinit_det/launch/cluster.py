"""Experiments on a Slurm cluster: each planned run is one element of a job array, a report job follows.

Every stage submits the same way (``--slurm`` on ``condinit-train`` and ``condinit-pretrain``;
:func:`submit_experiment`). An element (:class:`RunElement`) trains one run with every GPU and node of its
allocation: one Slurm task per node starts a supervising process, which takes the rendezvous from Slurm's
environment (:func:`condinit_det.launch.slurm.slurm_rendezvous`) and runs the experiment reduced to that run
(:meth:`condinit_det.launch.experiment.Experiment.only`), with ``--resume`` semantics (a run that was requeued,
killed or submitted again continues from its last checkpoint; a finished run is skipped; failures are recorded as
in :func:`condinit_det.launch.experiment.execute`).

Time limit and preemption: Slurm sends USR2 ``--signal-delay`` seconds before the limit to every
process of the element. The training processes (:class:`condinit_det.utils.preemption.PreemptionWatch`)
agree at the next step boundary to stop: detection writes a checkpoint of that iteration, pretraining
stops at its last epoch checkpoint (epochs are its unit of exact resume); both leave ``<run>/preempted``.
The element's ``checkpoint()`` (submitit's handler) waits for that file, then submitit requeues the
element. A job killed without warning (node failure, ``scontrol requeue``, ``scancel``) resumes from its last
checkpoint when it is requeued or the same command is submitted again.

Submitting again knows what is in flight: ``<base>/slurm.json`` keeps every job each run directory ever had (its
history; the last one is the current one, shown by ``condinit-status``). A run whose current job is still pending
or running (``squeue``) is in flight: it is not submitted again, and the new report job waits for it too
(``afterany``), so that extending a running experiment (more seeds, arms or lr scales) submits only the new runs and
one final report covers them all. This module imports no training stage: an experiment carries its own.
"""
from __future__ import annotations

import copy
import json
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from submitit.helpers import Checkpointable, DelayedSubmission

from ..records.failures import failure_of
from ..records.layout import REPORT_DIRNAME, RunSpec
from ..utils.fileio import atomic_write
from ..utils.preemption import PREEMPTED_FILENAME, PREEMPTIBLE_ENV, Preempted
from .experiment import Experiment, execute

__all__ = ["IN_FLIGHT_STATES", "JOBS_FILENAME", "ReportJob", "RunElement", "Submission", "describe_submission",
           "read_job_history", "read_jobs", "replace_report", "submission_plan", "submit_experiment", "submit_report",
           "submit_runs"]

JOBS_FILENAME = "slurm.json"
# squeue states of a job that will still run or is running: its run is in flight.
IN_FLIGHT_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                              "REQUEUE_FED", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING"})
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
    """The comparison of an experiment (or of both stages of a protocol), written after its runs."""

    def __init__(self, paths: Sequence[str], output_dir: str, bootstrap: int):
        self.paths, self.output_dir, self.bootstrap = list(paths), output_dir, int(bootstrap)

    def __call__(self) -> str:
        from ..report import compare_arms

        _, text = compare_arms(self.paths, output_dir=self.output_dir, bootstrap=self.bootstrap)
        print(text, flush=True)
        return text


# ---------------------------------------------------------------------------------------------
# slurm.json: every job each run ever had
# ---------------------------------------------------------------------------------------------
def _read_jobs_file(base: str) -> dict:
    path = os.path.join(base, JOBS_FILENAME)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); move it aside to submit afresh") from None
    return data if isinstance(data, dict) else {}


def _history(value) -> List[str]:
    # Older files held one job id per run (a string).
    return [str(v) for v in value] if isinstance(value, list) else ([str(value)] if value else [])


def read_job_history(base: str) -> Dict[str, List[str]]:
    """``<base>/slurm.json``: run directory (relative to ``base``) -> every job id it had, oldest first."""
    return {run: _history(jobs) for run, jobs in _read_jobs_file(base).get("runs", {}).items()}


def read_jobs(base: str) -> Dict[str, str]:
    """Run directory (relative to ``base``) -> its current (latest) Slurm job id; {} without ``slurm.json``."""
    return {run: jobs[-1] for run, jobs in read_job_history(base).items() if jobs}


def _record_jobs(base: str, jobs: Dict[str, str], report: Optional[str]) -> None:
    data = _read_jobs_file(base)
    runs = {run: _history(v) for run, v in data.get("runs", {}).items()}
    for run, job in jobs.items():
        runs.setdefault(run, []).append(str(job))
    reports = _history(data.get("report"))
    if report:
        reports.append(str(report))
    atomic_write(os.path.join(base, JOBS_FILENAME), json.dumps({"runs": runs, "report": reports}, indent=1))


def replace_report(base: str, job_id: str, *, log=print) -> None:
    """Record ``job_id`` as the report job of ``base`` and cancel the previous one if it is still pending: the new
    one waits for every run the old one waited for, so one report covers them all and no two write at once."""
    from .slurm import cancel_job, job_states

    earlier = _history(_read_jobs_file(base).get("report"))
    _record_jobs(base, {}, job_id)
    if earlier and job_states([earlier[-1]]).get(earlier[-1]) == "PENDING":
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
    from .slurm import job_states

    current = read_jobs(experiment.base)
    if states is None:
        states = job_states([current[s.dir] for s in experiment.runs if s.dir in current])
    plan = Submission()
    for spec in experiment.runs:
        job = current.get(spec.dir)
        if job is not None and states.get(job) in IN_FLIGHT_STATES:
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
    _record_jobs(experiment.base, {s.dir: str(j.job_id) for s, j in zip(specs, jobs)}, None)
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
                                   log=log)
        replace_report(experiment.base, str(report_job.job_id), log=log)
    log(f"Watch it with: condinit-status {experiment.base}   (submitit logs: "
        f"{slurm_folder(experiment.args, experiment.base)})")
    return jobs, plan.todo, dict(plan.in_flight), report_job


def submit_report(args, paths: Sequence[str], output_dir: str, *, jobs: Sequence[str], folder: str, name: str,
                  log=print):
    """A one-node, CPU-only job writing the comparison of ``paths`` once every job in ``jobs`` (ids) ended in any
    way (none: at once)."""
    from .slurm import after, make_executor, submit

    report_args = copy.copy(args)
    report_args.nodes, report_args.gpus_per_node, report_args.max_parallel = 1, 0, None
    (job,) = submit(make_executor(report_args, folder, name), [ReportJob(paths, output_dir, args.bootstrap)],
                    dependency=after("afterany", jobs) if jobs else None)
    log(f"Report job {job.job_id} writes {output_dir} after them")
    return job
