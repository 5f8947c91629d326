"""Experiments on a Slurm cluster with submitit: each planned run is one element of a job array, a report job follows.

Every stage submits the same way (``--slurm`` on ``condinit-train`` and ``condinit-pretrain``, and
``condinit-protocol``): :func:`submit_experiment` submits the runs that need a job as one array
(:func:`make_executor`: ``--signal=USR2@<signal delay>`` before the time limit, ``--max-parallel``, ``--slurm-extra``)
and a report job after them. An element (:class:`RunElement`) trains one run with every GPU and node of its
allocation: one Slurm task per node starts a supervising process, which takes the rendezvous from Slurm's environment
(:func:`slurm_rendezvous`) and runs the experiment reduced to that run with ``--resume`` semantics. On the time-limit
signal the training processes stop at the next step boundary and the element requeues itself. Submitting again knows
what is in flight (``<base>/slurm.json``): a run whose current job may still run is not submitted again, and the new
report job waits for it too. Job states come from ``squeue`` (:mod:`condinit_det.utils.squeue`), not ``sacct``.
What a job sees on the time-limit signal, ``scancel`` and ``scontrol requeue``: docs/slurm.md.
"""

import argparse
import copy
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission
from submitit.slurm.slurm import SlurmInfoWatcher

from ..records.failures import failure_of
from ..records.jobs import read_report_jobs, record_jobs
from ..records.layout import REPORT_DIRNAME, RunSpec
from ..utils.preemption import PREEMPTED_FILENAME, PREEMPTIBLE_ENV, Preempted
from ..utils.squeue import is_pending, query_jobs, squeue_command
from .plan import Experiment, in_flight
from .run import execute

__all__ = [
    "ReportJob",
    "RunElement",
    "Submission",
    "after",
    "after_each",
    "cancel_job",
    "describe_submission",
    "first_hostname",
    "make_executor",
    "replace_report",
    "slurm_folder",
    "slurm_rendezvous",
    "submission_plan",
    "submit",
    "submit_experiment",
    "submit_report",
    "submit_runs",
]


def slurm_folder(args: argparse.Namespace, output_dir: str) -> str:
    """Where submitit writes: ``--slurm-folder``, else ``<output_dir>/slurm``."""
    return args.slurm_folder or os.path.join(output_dir, "slurm")


def make_executor(args: argparse.Namespace, folder: str, name: str) -> submitit.SlurmExecutor:
    """A :class:`submitit.SlurmExecutor` for jobs named ``name``, configured from the submission flags in ``args``
    (:func:`condinit_det.launch.arguments.add_slurm_arguments`): ``--nodes`` nodes with one task each, ``--time``
    minutes, USR2 ``--signal-delay`` seconds before the limit, and the optional resources when given.

    ``folder`` must be on a file system the compute nodes share. It holds one subfolder per job id: ``<job>/`` (a
    plain job: ``<job>_submission.sh``, ``<job>_0_log.out`` / ``.err``, pickles) or, for an array,
    ``<array>/<array>_submission.sh`` and ``<array>_<i>/<array>_<i>_0_log.out`` / ``.err`` per element.
    Raises RuntimeError when ``sbatch`` or ``srun`` is not on PATH."""
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        raise RuntimeError(
            "--slurm: sbatch/srun are not on PATH; run on a Slurm login node (or start tools/slurm_local.sh)"
        )
    executor = submitit.SlurmExecutor(folder=os.path.join(folder, "%j"))
    # One task per node: its process starts the run's workers (detectron2's launch).
    params: Dict[str, Any] = dict(
        job_name=name, nodes=args.nodes, ntasks_per_node=1, time=args.time, signal_delay_s=args.signal_delay
    )
    optional = dict(
        gpus_per_node=args.gpus_per_node or None,
        cpus_per_task=args.cpus_per_task,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        constraint=args.constraint,
        array_parallelism=args.max_parallel,
        mem=args.mem,
        additional_parameters=dict(args.slurm_extra) if args.slurm_extra else None,
    )
    params.update({k: v for k, v in optional.items() if v is not None})
    executor.update_parameters(**params)
    return executor


def after(kind: str, jobs: Sequence[Union[submitit.Job, str]]) -> str:
    """Dependency on every job in ``jobs`` (submitit jobs or job ids): ``kind`` is ``"afterany"`` (ended in any
    way), ``"afterok"`` (succeeded) or ``"afternotok"``."""
    if kind not in ("afterany", "afterok", "afternotok"):
        raise ValueError(f"dependency kind {kind!r}: expected afterany, afterok or afternotok")
    if not jobs:
        raise ValueError("a dependency needs at least one job")
    return kind + ":" + ":".join(str(getattr(j, "job_id", j)) for j in jobs)


def cancel_job(job_id: str) -> None:
    """``scancel <job_id>``; raises RuntimeError when scancel refuses."""
    proc = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"scancel {job_id} failed: {proc.stderr.strip()}")


def after_each(jobs: Sequence[submitit.Job]) -> str:
    """Per-element dependency on the array ``jobs`` (as returned by :func:`submit`): element ``i`` of
    the next array starts once element ``i`` of ``jobs`` succeeded (Slurm's ``aftercorr``). An element
    whose predecessor failed or was cancelled stays pending (reason ``DependencyNeverSatisfied``)."""
    if len(jobs) == 1 and "_" not in str(jobs[0].job_id):
        return after("afterok", jobs)  # submit() sends one callable as a plain job, not an array
    array_ids = {str(j.job_id).split("_")[0] for j in jobs}
    if len(array_ids) != 1:
        raise ValueError(f"after_each needs the elements of one array, got jobs {[j.job_id for j in jobs]}")
    return "aftercorr:" + array_ids.pop()


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher reading this user's jobs from ``squeue`` instead of ``sacct``."""

    def _make_command(self) -> Optional[List[str]]:
        if not self._registered - self._finished:
            return None
        return squeue_command(fields="%i|%T|%N")

    def read_info(self, string) -> Dict[str, Dict[str, str]]:
        if not isinstance(string, str):
            string = string.decode()
        # submitit's parser expects sacct's header and expands array ranges such as 12_[1-3%1].
        return super().read_info("JobID|State|NodeList\n" + string)


# One watcher for all jobs: one squeue call per poll, at most every 10 s.
_WATCHER = SqueueWatcher(delay_s=10)


def submit(
    executor: submitit.SlurmExecutor, callables: Sequence[Callable[[], Any]], dependency: Optional[str] = None
) -> List[submitit.Job]:
    """Submit ``callables`` as one job array (a single callable: one plain job), after ``dependency``.

    ``dependency`` is sbatch's ``--dependency`` value, e.g. from :func:`after` or :func:`after_each`.
    The jobs' ``done()``, ``state``, ``wait()`` and ``result()`` work without ``sacct`` (:class:`SqueueWatcher`).
    """
    if not callables:
        raise ValueError("nothing to submit: the list of callables is empty")
    saved = dict(executor.parameters)
    if dependency:
        executor.update_parameters(dependency=dependency)
    try:
        with executor.batch():
            jobs = [executor.submit(fn) for fn in callables]
    finally:
        executor.parameters.clear()
        executor.parameters.update(saved)
    for job in jobs:
        job.watcher = _WATCHER
    return jobs


def first_hostname(nodelist: str) -> str:
    """First host of a Slurm node list (``"gpu[07-09,12],cpu1"`` -> ``"gpu07"``): ``scontrol show
    hostnames`` where it answers, else the same expansion here (zero padding kept)."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
            if out:
                return out[0]
        except (subprocess.SubprocessError, OSError):
            pass
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    # Each bracket contributes its first range's lower bound, as written ("07" stays "07").
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], nodelist[:end])


def _gpus_on_node(env) -> int:
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = env.get(var, "")
        if value:
            # SLURM_GPUS_PER_NODE may name the type ("a100:4"); the count is the last field.
            return int(value.split(":")[-1].split("(")[0])
    return 0


def slurm_rendezvous(cpu_processes_per_machine: int = 1, environ=None) -> Tuple[int, int, int, str]:
    """``(num_machines, machine_rank, num_gpus_per_machine, dist_url)`` for detectron2's ``launch`` from Slurm's
    environment, in the one task per node of a job made by :func:`make_executor`: the node's GPUs, or
    ``cpu_processes_per_machine`` gloo processes; ``tcp://<first node>:<port>`` with the port derived from the job id
    (10000-29999, below Linux's ephemeral range), the same on every node and after a requeue."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        raise RuntimeError("slurm_rendezvous: not inside a Slurm job (SLURM_JOB_ID/SLURM_JOB_NODELIST are not set)")
    num_machines = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    machine_rank = int(env.get("SLURM_NODEID") or 0)
    gpus = _gpus_on_node(env)
    per_machine = gpus if gpus > 0 else cpu_processes_per_machine
    port = 10000 + int(env["SLURM_JOB_ID"]) % 20000
    return num_machines, machine_rank, per_machine, f"tcp://{first_hostname(env['SLURM_JOB_NODELIST'])}:{port}"


_PREEMPTED_EXIT = 75


def _element_main(experiment: Experiment, spec: RunSpec) -> None:
    """The supervising process of an element on one node: the experiment reduced to ``spec``."""
    os.environ[PREEMPTIBLE_ENV] = "1"
    signal.signal(signal.SIGUSR2, lambda *_: None)  # the training processes act on it, this one must not die
    experiment = experiment.only(spec)
    args = experiment.args = copy.copy(experiment.args)
    args.num_machines, args.machine_rank, args.num_gpus, args.dist_url = slurm_rendezvous(
        cpu_processes_per_machine=max(int(args.num_gpus), 1)
    )
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
        process = multiprocessing.get_context("spawn").Process(target=_element_main, args=(self.experiment, self.spec))
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

    def __init__(
        self,
        paths: Sequence[str],
        output_dir: str,
        bootstrap: int,
        *,
        trackers: Optional[dict] = None,
        experiment: Optional[str] = None,
    ):
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


def submission_plan(experiment: Experiment) -> Submission:
    """Sort the planned runs into the ones to submit, the ones in flight (their current job is pending or
    running) and the ones that need nothing (finished, or diverged and not ``--retry-failed``)."""
    plan = Submission(in_flight=in_flight(experiment))
    for spec in experiment.runs:
        if spec in plan.in_flight or spec in experiment.unreadable:
            continue
        failure = failure_of(experiment.run_dir(spec))
        if failure is not None and failure.get("reason") == "diverged" and not experiment.args.retry_failed:
            plan.done.append(spec)
        elif failure is None and experiment.finished(spec):
            plan.done.append(spec)
        else:
            plan.todo.append(spec)
    return plan


def submit_runs(
    experiment: Experiment, specs: Sequence[RunSpec], *, name: str, dependency: Optional[str] = None, log=print
) -> list:
    """Submit ``specs`` (planned runs of ``experiment``) as one job array, each element after ``dependency``
    (sbatch's), and record their jobs in ``<base>/slurm.json``. Returns the submitit jobs, in the order of
    ``specs``."""
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
        log(
            f"Nothing new to submit for {experiment.base}"
            + (f": {len(plan.in_flight)} run(s) in flight" if plan.in_flight else "")
        )


def submit_experiment(experiment: Experiment, *, name: str, report: bool = True, log=print):
    """Submit the runs of ``experiment`` that need a job (:func:`submission_plan`) as one job array and, with
    ``report``, a report job after them and after the runs still in flight (``afterany``). Returns (the submitted
    jobs, their specs, the in-flight runs' job ids, the report job or None)."""
    plan = submission_plan(experiment)
    describe_submission(experiment, plan, log)
    jobs = submit_runs(experiment, plan.todo, name=name, log=log)
    report_job = None
    waits = [str(j.job_id) for j in jobs] + list(plan.in_flight.values())
    if report and waits:
        report_job = submit_report(
            experiment.args,
            [experiment.base],
            os.path.join(experiment.base, REPORT_DIRNAME),
            jobs=waits,
            folder=slurm_folder(experiment.args, experiment.base),
            name=f"{name}-report",
            log=log,
            trackers=experiment.trackers,
        )
        replace_report(experiment.base, str(report_job.job_id), log=log)
    log(
        f"Watch it with: condinit-status {experiment.base}   (submitit logs: "
        f"{slurm_folder(experiment.args, experiment.base)})"
    )
    return jobs, plan.todo, dict(plan.in_flight), report_job


def submit_report(
    args,
    paths: Sequence[str],
    output_dir: str,
    *,
    jobs: Sequence[str],
    folder: str,
    name: str,
    log=print,
    trackers: Optional[dict] = None,
):
    """A one-node, CPU-only job writing the comparison of ``paths`` once every job in ``jobs`` (ids) ended in any
    way (none: at once); ``trackers``: see :class:`ReportJob` (the last of ``paths`` is the experiment)."""
    report_args = copy.copy(args)
    report_args.nodes, report_args.gpus_per_node, report_args.max_parallel = 1, 0, None
    report = ReportJob(paths, output_dir, args.bootstrap, trackers=trackers)
    (job,) = submit(
        make_executor(report_args, folder, name), [report], dependency=after("afterany", jobs) if jobs else None
    )
    log(f"Report job {job.job_id} writes {output_dir} after them")
    return job


def _upstream_of(spec: RunSpec) -> RunSpec:
    return RunSpec(spec.arm, spec.seed)


def submit_stages(pre: Experiment, fine: Experiment, report_dir: str, *, log=print) -> None:
    """Two stages of a protocol (:mod:`condinit_det.launch.protocol`): the upstream array; each downstream run after
    its own upstream run succeeded (one array with ``aftercorr`` when they pair element by element, else one job
    each with ``afterok``; at once when its upstream run finished earlier); the report of both stages after every
    job of both, the ones already in flight included."""
    args = fine.args
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
        output = os.path.dirname(report_dir)
        job = submit_report(
            args,
            [pre.base, fine.base],
            report_dir,
            jobs=jobs,
            folder=slurm_folder(args, output),
            name="condinit-protocol-report",
            log=log,
            trackers=fine.trackers,
        )
        replace_report(output, str(job.job_id), log=log)


def _submit_downstream(
    pre: Experiment,
    fine: Experiment,
    todo: List[RunSpec],
    pre_jobs: Dict[RunSpec, object],
    pre_in_flight: Dict[RunSpec, str],
    log,
) -> List[str]:
    """Submit the downstream runs each after its upstream run; returns their job ids."""
    after_new = [s for s in todo if _upstream_of(s) in pre_jobs]
    if after_new and [_upstream_of(s) for s in after_new] == list(pre_jobs):  # element i after element i
        jobs = submit_runs(
            fine, after_new, name="condinit-finetune", dependency=after_each(list(pre_jobs.values())), log=log
        )
    else:
        jobs = [
            job
            for s in after_new
            for job in submit_runs(
                fine, [s], name="condinit-finetune", dependency=after("afterok", [pre_jobs[_upstream_of(s)]]), log=log
            )
        ]
    ready = []
    for spec in todo:
        if spec in after_new:
            continue
        if _upstream_of(spec) in pre_in_flight:
            jobs += submit_runs(
                fine,
                [spec],
                name="condinit-finetune",
                dependency=after("afterok", [pre_in_flight[_upstream_of(spec)]]),
                log=log,
            )
        elif pre.finished(_upstream_of(spec)):
            ready.append(spec)
        else:
            log(f"  {spec.dir}: its pretraining run did not finish (failed or diverged): not submitted")
    jobs += submit_runs(fine, ready, name="condinit-finetune", log=log)
    return [str(j.job_id) for j in jobs]
