"""Experiments on a Slurm cluster: each planned run is one element of a job array, a report job follows.

Both training stages submit the same way (``--slurm`` on ``tools/train_net.py`` and
``tools/pretrain_net.py``; :func:`submit_experiment`). An element (:class:`RunElement`) trains one
run with every GPU and node of its allocation: one Slurm task per node starts a supervising process,
which takes the rendezvous from Slurm's environment (:func:`condinit_det.launch.slurm.slurm_rendezvous`) and
runs the stage's own launcher for that run, with ``--resume`` semantics (a run that was requeued,
killed or submitted again continues from its last checkpoint; a finished run is skipped; failures are
recorded as in :func:`condinit_det.records.layout.execute_runs`).

Time limit and preemption: Slurm sends USR2 ``--signal-delay`` seconds before the limit to every
process of the element. The training processes (:class:`PreemptionWatch`) agree at the next step
boundary to stop: detection writes a checkpoint of that iteration, pretraining stops at its last
epoch checkpoint (epochs are its unit of exact resume); both leave ``<run>/preempted``. The element's
``checkpoint()`` (submitit's handler) waits for that file, then submitit requeues the element. A job
killed without warning (node failure, ``scontrol requeue``, ``scancel``) resumes from its last
checkpoint when it is requeued or the same command is submitted again.

``<base>/slurm.json`` maps each run directory to its job id (read by ``tools/experiment_status.py``).
This module imports no training stage: elements import theirs when they run.
"""
from __future__ import annotations

import copy
import importlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from submitit.helpers import Checkpointable, DelayedSubmission

from ..utils.fileio import atomic_write
from ..utils.preemption import PREEMPTED_FILENAME, Preempted
from ..records.layout import RunSpec
from ..records.failures import failure_of

__all__ = ["JOBS_FILENAME", "PREEMPTIBLE_ENV", "PreemptionWatch", "ReportJob", "RunElement", "read_jobs",
           "submit_experiment"]

JOBS_FILENAME = "slurm.json"
PREEMPTIBLE_ENV = "CONDINIT_PREEMPTIBLE"
_PREEMPTED_EXIT = 75
# Each stage's launcher for one planned run: execute(args, only=spec) -> exit status.
_STAGES = {"detection": "condinit_det.engine.training", "pretrain": "condinit_det.pretrain.launch"}


class PreemptionWatch:
    """In a training process: whether to stop for a requeue, agreed by every process of the run.

    Active only inside a Slurm element (``CONDINIT_PREEMPTIBLE`` set); create it in the process's main
    thread (it installs the USR2 handler). :meth:`requested` is collective under torch.distributed: every
    process calls it at the same step boundary.
    """

    def __init__(self):
        self._flag: Optional[threading.Event] = None
        if os.environ.get(PREEMPTIBLE_ENV):
            from .slurm import requeue_flag

            self._flag = requeue_flag()

    @property
    def active(self) -> bool:
        return self._flag is not None

    def requested(self) -> bool:
        if self._flag is None:
            return False
        import torch
        import torch.distributed as dist

        local = self._flag.is_set()
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return local
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([int(local)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    @staticmethod
    def stop(run_dir: str, where: str) -> None:
        """Leave ``<run_dir>/preempted`` (main process) and raise :class:`Preempted`."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
            atomic_write(os.path.join(run_dir, PREEMPTED_FILENAME), where)
        raise Preempted(f"stopped for a requeue: {where}")


def _element_main(stage: str, args, base: str, spec: RunSpec) -> None:
    """The supervising process of an element on one node: the stage's launcher for ``spec``."""
    from .slurm import slurm_rendezvous

    os.environ[PREEMPTIBLE_ENV] = "1"
    signal.signal(signal.SIGUSR2, lambda *_: None)  # the training processes act on it, this one must not die
    args = copy.copy(args)
    args.num_machines, args.machine_rank, args.num_gpus, args.dist_url = slurm_rendezvous(
        cpu_processes_per_machine=max(int(args.num_gpus), 1))
    args.resume = True
    try:
        code = importlib.import_module(_STAGES[stage]).execute(args, only=spec)
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

    def __init__(self, stage: str, args, base: str, spec: RunSpec):
        if stage not in _STAGES:
            raise ValueError(f"unknown stage {stage!r}; accepted: {', '.join(_STAGES)}")
        self.stage, self.args, self.base, self.spec = stage, args, base, spec

    @property
    def run_dir(self) -> str:
        return self.spec.path(self.base)

    def __call__(self) -> str:
        process = multiprocessing.get_context("spawn").Process(
            target=_element_main, args=(self.stage, self.args, self.base, self.spec))
        process.start()
        process.join()
        if process.exitcode == 0:
            return f"{self.run_dir}: finished"
        if process.exitcode == _PREEMPTED_EXIT:  # checkpoint() is requeueing this job
            time.sleep(max(int(getattr(self.args, "signal_delay", 120)), 1))
        failure = failure_of(self.run_dir)
        why = failure.get("message") if failure else f"exit status {process.exitcode}"
        raise RuntimeError(f"{self.run_dir} did not finish: {why}")

    def checkpoint(self, *args, **kwargs):
        """USR2 (time limit): the training processes stop at their next step boundary and leave
        ``<run>/preempted``; wait for it (within the signal delay), then requeue this element."""
        delay = max(int(getattr(self.args, "signal_delay", 120)), 10)
        _wait_for(os.path.join(self.run_dir, PREEMPTED_FILENAME), timeout=0.75 * delay)
        return DelayedSubmission(RunElement(self.stage, self.args, self.base, self.spec))


class ReportJob:
    """The comparison of an experiment (or of both stages of a protocol), written after its runs."""

    def __init__(self, paths: Sequence[str], output_dir: str, bootstrap: int):
        self.paths, self.output_dir, self.bootstrap = list(paths), output_dir, int(bootstrap)

    def __call__(self) -> str:
        from ..report import compare_arms

        _, text = compare_arms(self.paths, output_dir=self.output_dir, bootstrap=self.bootstrap)
        print(text, flush=True)
        return text


def read_jobs(base: str) -> Dict[str, str]:
    """``<base>/slurm.json``: run directory (relative to ``base``) -> Slurm job id; {} without one."""
    path = os.path.join(base, JOBS_FILENAME)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return dict(json.load(f).get("runs", {}))


def _record_jobs(base: str, jobs: Dict[str, str], report: Optional[str]) -> None:
    runs = {**read_jobs(base), **jobs}
    payload = {"runs": runs}
    if report:
        payload["report"] = report
    atomic_write(os.path.join(base, JOBS_FILENAME), json.dumps(payload, indent=1))


def runs_to_submit(base: str, specs: Sequence[RunSpec], finished: Callable[[RunSpec], bool], *,
                   retry_failed: bool) -> List[RunSpec]:
    """The planned runs an element is needed for: not finished, and not diverged (unless retried)."""
    todo = []
    for spec in specs:
        failure = failure_of(spec.path(base))
        if failure is not None and failure.get("reason") == "diverged" and not retry_failed:
            continue
        if failure is None and finished(spec):
            continue
        todo.append(spec)
    return todo


def submit_experiment(args, *, stage: str, base: str, specs: Sequence[RunSpec], finished: Callable[[RunSpec], bool],
                      name: str, dependency: Optional[str] = None, report: bool = True, bootstrap: int = 1000,
                      log=print):
    """Submit the unfinished runs of ``specs`` as one job array (``dependency``: sbatch's, for every element)
    and, with ``report``, a report job after them (``afterany``). Returns (element jobs, their specs, report job)."""
    from .slurm import make_executor, slurm_folder, submit

    folder = slurm_folder(args, base)
    todo = runs_to_submit(base, specs, finished, retry_failed=getattr(args, "retry_failed", False))
    skipped = len(specs) - len(todo)
    jobs = []
    if todo:
        executor = make_executor(args, folder, name)
        jobs = submit(executor, [RunElement(stage, args, base, spec) for spec in todo], dependency=dependency)
        log(f"Submitted {len(jobs)} run(s) of {len(specs)} as job array {str(jobs[0].job_id).split('_')[0]}"
            + (f" ({skipped} finished or diverged earlier: not resubmitted)" if skipped else ""))
        for spec, job in zip(todo, jobs):
            log(f"  {job.job_id}: {spec.arm}/{spec.name}")
    else:
        log(f"Every run of {base} finished or diverged earlier: nothing to submit")
    report_job = None
    if report:
        report_job = submit_report(args, [base], os.path.join(base, "report"), jobs=jobs, folder=folder,
                                   name=f"{name}-report", bootstrap=bootstrap, log=log)
    _record_jobs(base, {os.path.join(s.arm, s.name): str(j.job_id) for s, j in zip(todo, jobs)},
                 str(report_job.job_id) if report_job is not None else None)
    log(f"Watch it with: tools/experiment_status.py {base}   (submitit logs: {folder})")
    return jobs, todo, report_job


def submit_report(args, paths: Sequence[str], output_dir: str, *, jobs, folder: str, name: str, bootstrap: int,
                  log=print):
    """A one-node, CPU-only job writing the comparison of ``paths`` once ``jobs`` ended (in any way)."""
    from .slurm import after, make_executor, submit

    report_args = copy.copy(args)
    report_args.nodes, report_args.gpus_per_node, report_args.max_parallel = 1, 0, None
    (job,) = submit(make_executor(report_args, folder, name), [ReportJob(paths, output_dir, bootstrap)],
                    dependency=after("afterany", jobs) if jobs else None)
    log(f"Report job {job.job_id} writes {output_dir} after them")
    return job
