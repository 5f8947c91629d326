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
import dataclasses
import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJobEnvironment

from ..records.failures import failure_of
from ..records.jobs import read_jobs, read_report_jobs, record_jobs
from ..records.layout import REPORT_DIRNAME, RunSpec
from ..utils.preemption import PREEMPTED_FILENAME, PREEMPTIBLE_ENV, Preempted
from ..utils.squeue import NEVER_STARTS, is_pending, query_jobs, squeue_command
from .plan import Experiment, in_flight, plan_experiment, run_actions
from .run import ReportJob, execute

__all__ = [
    "after",
    "after_each",
    "make_executor",
    "slurm_folder",
    "slurm_rendezvous",
    "submit",
    "submit_experiment",
    "submit_stages",
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
    ``<array>/<array>_submission.sh`` and ``<array>_<i>/<array>_<i>_0_log.out`` / ``.err`` per element."""
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
    """Dependency on every job in ``jobs`` (submitit jobs or job ids, at least one): ``kind`` is ``"afterany"``
    (ended in any way), ``"afterok"`` (succeeded) or ``"afternotok"``."""
    return kind + ":" + ":".join(str(getattr(j, "job_id", j)) for j in jobs)


def after_each(jobs: Sequence[submitit.Job]) -> str:
    """Per-element dependency on the array ``jobs`` (as returned by one :func:`submit`): element ``i`` of
    the next array starts once element ``i`` of ``jobs`` succeeded (Slurm's ``aftercorr``). An element
    whose predecessor failed or was cancelled stays pending (reason ``DependencyNeverSatisfied``)."""
    if len(jobs) == 1 and "_" not in str(jobs[0].job_id):
        return after("afterok", jobs)  # submit() sends one callable as a plain job, not an array
    return "aftercorr:" + str(jobs[0].job_id).split("_")[0]


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

    ``dependency`` is sbatch's ``--dependency`` value, e.g. from :func:`after` or :func:`after_each`; it stays set on
    ``executor`` (the launcher makes an executor per submission). The jobs' ``done()``, ``state``, ``wait()`` and
    ``result()`` work without ``sacct`` (:class:`SqueueWatcher`).
    """
    if dependency:
        executor.update_parameters(dependency=dependency)
    with executor.batch():
        jobs = [executor.submit(fn) for fn in callables]
    for job in jobs:
        job.watcher = _WATCHER
    return jobs


def slurm_rendezvous(cpu_processes_per_machine: int = 1) -> Tuple[int, int, int, str]:
    """``(num_machines, machine_rank, num_gpus_per_machine, dist_url)`` for detectron2's ``launch`` from Slurm's
    environment, in the one task per node of a job made by :func:`make_executor`: the node's GPUs, or
    ``cpu_processes_per_machine`` gloo processes; ``tcp://<first node>:<port>`` with the port derived from the job id
    (10000-29999, below Linux's ephemeral range), the same on every node and after a requeue."""
    if not os.environ.get("SLURM_JOB_ID") or not os.environ.get("SLURM_JOB_NODELIST"):
        raise RuntimeError("slurm_rendezvous: not inside a Slurm job (SLURM_JOB_ID/SLURM_JOB_NODELIST are not set)")
    job = SlurmJobEnvironment()  # submitit's reading of the variables, the node list expanded
    # SLURM_GPUS_PER_NODE may name the type ("a100:4"); the count is the last field.
    gpus = os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_GPUS_PER_NODE") or "0"
    per_machine = int(gpus.split(":")[-1].split("(")[0]) or cpu_processes_per_machine
    port = 10000 + int(os.environ["SLURM_JOB_ID"]) % 20000
    return job.num_nodes, job.node, per_machine, f"tcp://{job.hostnames[0]}:{port}"


_PREEMPTED_EXIT = 75
ELEMENT_FORMAT = 1  # what an element carries (element_description): a change of meaning takes a new number


def element_description(experiment: Experiment, spec: RunSpec) -> Dict[str, Any]:
    """What a Slurm element carries of its run: plain data (the command's flags, the stage, the experiment and run
    directories), never a pickled object of the package's classes, so that an element queued by one version of the
    package starts under the next."""
    from .. import __version__  # at use: this module also loads without the package's __init__ (slurm_rendezvous)

    stage = type(experiment.stage)
    return {
        "format": ELEMENT_FORMAT,
        "version": __version__,
        "stage": f"{stage.__module__}.{stage.__qualname__}",
        "flags": json.loads(json.dumps(vars(experiment.args))),
        "output_dir": experiment.base,
        "upstream": experiment.upstream,
        "run": dataclasses.asdict(spec),
        "run_dir": experiment.run_dir(spec),
    }


def element_experiment(description: Mapping[str, Any]) -> Experiment:
    """The experiment of one element's run, planned again from its description (``--resume`` semantics)."""
    spec = RunSpec(**description["run"])
    args = argparse.Namespace(**description["flags"])
    args.arm, args.seeds, args.lr_scale = spec.arm, str(spec.seed), repr(spec.lr_scale)
    args.slurm, args.dry_run, args.resume = False, False, True
    module, _, name = description["stage"].rpartition(".")
    stage = getattr(importlib.import_module(module), name)()
    experiment = plan_experiment(stage, args, output_dir=description["output_dir"], upstream=description["upstream"])
    return experiment.only(spec)


def _element_main(description: Dict[str, Any]) -> None:
    """The supervising process of an element on one node: the run of ``description``."""
    os.environ[PREEMPTIBLE_ENV] = "1"
    signal.signal(signal.SIGUSR2, lambda *_: None)  # the training processes act on it, this one must not die
    experiment = element_experiment(description)
    args = experiment.args
    args.num_machines, args.machine_rank, args.num_gpus, args.dist_url = slurm_rendezvous(
        cpu_processes_per_machine=max(int(args.num_gpus), 1)
    )
    try:
        code = execute(experiment)
    except Preempted:
        code = _PREEMPTED_EXIT
    sys.exit(code)


class RunElement(Checkpointable):
    """One planned run as a submitit callable (a job-array element); requeues itself on the time-limit signal.
    It is pickled as a call of this class with its description (:func:`element_description`): an element queued
    with another :data:`ELEMENT_FORMAT` stops with one line that says how to submit it again."""

    def __init__(self, description: Dict[str, Any]):
        self.description = description

    def __reduce__(self):
        return RunElement, (self.description,)

    @property
    def run_dir(self) -> str:
        return self.description["run_dir"]

    def _check_format(self) -> None:
        from .. import __version__

        found = self.description.get("format")
        if found != ELEMENT_FORMAT:
            command = self.description.get("flags", {}).get("command") or "the command that submitted it"
            raise RuntimeError(
                f"{self.run_dir}: queued by condinit-det {self.description.get('version', '?')} (element format "
                f"{found}), started under condinit-det {__version__} (element format {ELEMENT_FORMAT}); submit it "
                f"again with: {command}"
            )

    def __call__(self) -> str:
        self._check_format()
        process = multiprocessing.get_context("spawn").Process(target=_element_main, args=(self.description,))
        process.start()
        process.join()
        if process.exitcode == 0:
            return f"{self.run_dir}: finished"
        if process.exitcode == _PREEMPTED_EXIT:  # checkpoint() is requeueing this job
            time.sleep(max(int(self.description["flags"]["signal_delay"]), 1))
        failure = failure_of(self.run_dir)
        why = failure.get("message") if failure else f"exit status {process.exitcode}"
        raise RuntimeError(f"{self.run_dir} did not finish: {why}")

    def checkpoint(self, *args, **kwargs):
        """USR2 (time limit): the training processes stop at their next step boundary and leave
        ``<run>/preempted``; wait for it (within the signal delay), then requeue this element."""
        deadline = time.time() + 0.75 * max(int(self.description["flags"]["signal_delay"]), 10)
        while not os.path.exists(os.path.join(self.run_dir, PREEMPTED_FILENAME)) and time.time() < deadline:
            time.sleep(0.5)
        return DelayedSubmission(RunElement(self.description))


# ---------------------------------------------------------------------------------------------
# Submitting
# ---------------------------------------------------------------------------------------------
def _runs_to_submit(experiment: Experiment, log) -> Tuple[List[RunSpec], Dict[RunSpec, str]]:
    """The runs that need a job (:func:`condinit_det.launch.plan.run_actions`) and the runs in flight, with their
    pending or running job; says what is left out (in flight; finished, or diverged and not ``--retry-failed``)."""
    current = list(read_jobs(experiment.base).values())
    stuck = [job for job, state in query_jobs(current).states.items() if state == NEVER_STARTS]
    if stuck:  # their runs are submitted again below, after the run they waited on
        subprocess.run(["scancel", *stuck], capture_output=True, timeout=60)
        log(f"  cancelled job(s) {', '.join(stuck)} of {experiment.base}: they waited on a job that failed")
    flying = in_flight(experiment)
    actions = run_actions(experiment, flying)
    todo = [spec for spec, _, trains in actions if trains]
    done = [s for s, _, trains in actions if not trains and s not in flying and s not in experiment.unreadable]
    for spec, job in flying.items():
        log(f"  {spec.dir}: in flight as job {job}: not resubmitted")
    if done:
        log(f"  {len(done)} run(s) of {experiment.base} finished or diverged earlier: not resubmitted")
    if not todo:
        log(f"Nothing new to submit for {experiment.base}" + (f": {len(flying)} run(s) in flight" if flying else ""))
    return todo, flying


def submit_runs(
    experiment: Experiment, specs: Sequence[RunSpec], *, name: str, dependency: Optional[str] = None, log=print
) -> list:
    """Submit ``specs`` (planned runs of ``experiment``) as one job array, each element after ``dependency``
    (sbatch's), and record their jobs in ``<base>/slurm.json``. Returns the submitit jobs, in the order of
    ``specs``."""
    if not specs:
        return []
    executor = make_executor(experiment.args, slurm_folder(experiment.args, experiment.base), name)
    elements = [RunElement(element_description(experiment, spec)) for spec in specs]
    jobs = submit(executor, elements, dependency=dependency)
    record_jobs(experiment.base, {s.dir: str(j.job_id) for s, j in zip(specs, jobs)})
    what = f"job array {str(jobs[0].job_id).split('_')[0]}" if len(jobs) > 1 else f"job {jobs[0].job_id}"
    log(f"Submitted {len(jobs)} run(s) of {experiment.base} as {what}" + (f" after {dependency}" if dependency else ""))
    for spec, job in zip(specs, jobs):
        log(f"  {job.job_id}: {spec.dir}")
    return jobs


def _submit_report(experiment: Experiment, paths: Sequence[str], report_dir: str, jobs: Sequence[str], name: str, log):
    """A one-node, CPU-only job writing the comparison of ``paths`` into ``report_dir`` once every job in ``jobs``
    (ids, at least one) ended in any way, with the flags and trackers of ``experiment``. It is recorded in the
    ``slurm.json`` of the folder above ``report_dir`` and replaces the report job recorded there if that one is
    still pending: the new one waits for every run the old one waited for, so one report covers them all and no
    two write at once."""
    args, base = experiment.args, os.path.dirname(report_dir)
    report_args = copy.copy(args)
    report_args.nodes, report_args.gpus_per_node, report_args.max_parallel = 1, 0, None
    executor = make_executor(report_args, slurm_folder(args, base), name)
    report = ReportJob(paths, report_dir, args.bootstrap, experiment.trackers)
    (job,) = submit(executor, [report], dependency=after("afterany", jobs))
    log(f"Report job {job.job_id} writes {report_dir} after them")
    earlier = read_report_jobs(base)
    record_jobs(base, {}, str(job.job_id))
    if earlier and is_pending(query_jobs([earlier[-1]]).get(earlier[-1])):
        proc = subprocess.run(["scancel", earlier[-1]], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"scancel {earlier[-1]} failed: {proc.stderr.strip()}")
        log(f"Report job {earlier[-1]} (pending) is replaced by report job {job.job_id}")


def submit_experiment(experiment: Experiment, *, name: str, report: bool = True, log=print) -> None:
    """Submit the runs of ``experiment`` that need a job as one job array and, with ``report``, a report job after
    them and after the runs still in flight (``afterany``)."""
    todo, flying = _runs_to_submit(experiment, log)
    jobs = [str(j.job_id) for j in submit_runs(experiment, todo, name=name, log=log)] + list(flying.values())
    if report and jobs:
        report_dir = os.path.join(experiment.base, REPORT_DIRNAME)
        _submit_report(experiment, [experiment.base], report_dir, jobs, f"{name}-report", log)
    folder = slurm_folder(experiment.args, experiment.base)
    log(f"Watch it with: condinit-status {experiment.base}   (submitit logs: {folder})")


def _upstream_of(spec: RunSpec) -> RunSpec:
    return RunSpec(spec.arm, spec.seed)


def submit_stages(pre: Experiment, fine: Experiment, report_dir: str, *, log=print) -> None:
    """Two stages of a protocol (:mod:`condinit_det.launch.protocol`): the upstream array; each downstream run after
    its own upstream run succeeded (one array with ``aftercorr`` when they pair element by element, else one job
    each with ``afterok``; at once when its upstream run finished earlier); the report of both stages after every
    job of both, the ones already in flight included."""
    pre.write_plan()
    fine.write_plan()
    pre_todo, pre_flying = _runs_to_submit(pre, log)
    pre_jobs = dict(zip(pre_todo, submit_runs(pre, pre_todo, name="condinit-pretrain", log=log)))
    fine_todo, fine_flying = _runs_to_submit(fine, log)
    jobs = [str(j.job_id) for j in pre_jobs.values()] + list(pre_flying.values()) + list(fine_flying.values())
    jobs += _submit_downstream(pre, fine, fine_todo, pre_jobs, pre_flying, log)
    if jobs:
        _submit_report(fine, [pre.base, fine.base], report_dir, jobs, "condinit-protocol-report", log)


def _submit_downstream(
    pre: Experiment,
    fine: Experiment,
    todo: List[RunSpec],
    pre_jobs: Dict[RunSpec, submitit.Job],
    pre_flying: Dict[RunSpec, str],
    log,
) -> List[str]:
    """Submit the downstream runs each after its upstream run; returns their job ids."""
    paired = [s for s in todo if _upstream_of(s) in pre_jobs]
    jobs = []
    if paired and [_upstream_of(s) for s in paired] == list(pre_jobs):  # element i after element i
        dependency = after_each(list(pre_jobs.values()))
        jobs = submit_runs(fine, paired, name="condinit-finetune", dependency=dependency, log=log)
        todo = [s for s in todo if s not in paired]
    upstream_jobs = {**{s: str(j.job_id) for s, j in pre_jobs.items()}, **pre_flying}
    ready = []
    for spec in todo:
        job = upstream_jobs.get(_upstream_of(spec))
        if job is not None:
            dependency = after("afterok", [job])
            jobs += submit_runs(fine, [spec], name="condinit-finetune", dependency=dependency, log=log)
        elif pre.finished(_upstream_of(spec)):
            ready.append(spec)
        else:
            log(f"  {spec.dir}: its pretraining run did not finish (failed or diverged): not submitted")
    jobs += submit_runs(fine, ready, name="condinit-finetune", log=log)
    return [str(j.job_id) for j in jobs]
