"""Threads of a training process from the CPUs its job was given, not from the machine's.

torch sizes its intra-op pool (and OpenMP / OpenBLAS theirs) from the machine, whatever share of it the job
holds. Several processes on the same cores then run more busy threads than there are cores, and OpenMP's threads
spin-wait for each other at every parallel region: two Slurm array elements with ``--cpus-per-task 1`` on one
node, or the several training processes of one element, slow each other down many times over.

- :func:`allocated_cpus`: the CPUs this process may use: ``SLURM_CPUS_PER_TASK`` (bounded by the CPU affinity), else
  the affinity mask (``taskset``, cgroup cpusets, Slurm's task/affinity) when it is smaller than the machine, else
  None (the whole machine);
- :func:`threads_for_process`: the allocation divided among the processes of a run on one node: intra-op threads
  and data-loader workers per process (the rule below);
- :func:`apply_thread_settings`: sets them in this process (``torch.set_num_threads``; the BLAS and OpenMP pools
  through threadpoolctl; ``OMP_NUM_THREADS`` for the processes it starts) and logs one line.

The rule, per process: its share is ``allocated // processes_per_node`` CPUs (at least 1). Data-loader workers get
half of the share, rounded down, and at most ``max_workers`` (the config's worker count); the intra-op threads get
the rest, so at least 1 thread, and a one-CPU share loads data in the training process itself (0 workers). A user
value (``explicit_threads`` / ``explicit_workers``, from the command line) wins; the other value then takes what is
left of the share.
"""
from __future__ import annotations

import logging
import os
from typing import Collection, MutableMapping, NamedTuple, Optional, Tuple

__all__ = ["ALLOCATION_ENV", "ThreadPlan", "allocated_cpus", "apply_thread_settings", "threads_for_process"]

ALLOCATION_ENV = "SLURM_CPUS_PER_TASK"
# BLAS-specific variables take precedence over OMP_NUM_THREADS in their libraries: overwritten when present.
_BLAS_THREAD_ENVS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class ThreadPlan(NamedTuple):
    """What one training process runs with."""

    intra_op_threads: int  # torch's intra-op pool, the BLAS and OpenMP pools
    loader_workers: int  # data-loader worker processes (each computes on one thread)


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")
    return value


def _allocation(environ=None, *, affinity: Optional[Collection[int]] = None,
                machine_cpus: Optional[int] = None) -> Tuple[Optional[int], str]:
    """``(cpus, where the number comes from)``; cpus None when the whole machine is this process's."""
    env = os.environ if environ is None else environ
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = os.sched_getaffinity(0)
    usable = len(affinity) if affinity else None
    machine = machine_cpus if machine_cpus is not None else os.cpu_count()
    text = str(env.get(ALLOCATION_ENV, "")).strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{ALLOCATION_ENV}={text!r}: expected a positive integer (the CPUs Slurm gives each "
                             "task); unset it to use the CPU affinity")
        slurm = int(text)
        if usable is not None and usable < slurm:
            return usable, f"CPU affinity, within {ALLOCATION_ENV}={slurm}"
        return slurm, ALLOCATION_ENV
    if usable is not None and machine is not None and usable < machine:
        return usable, "CPU affinity"
    return None, "the whole machine"


def allocated_cpus(environ: Optional[MutableMapping[str, str]] = None, *,
                   affinity: Optional[Collection[int]] = None, machine_cpus: Optional[int] = None) -> Optional[int]:
    """The CPUs this process may use, or None when nothing restricts it to less than the machine.

    Args:
        environ: where ``SLURM_CPUS_PER_TASK`` is read (default ``os.environ``).
        affinity: the CPU ids this process may run on (default ``os.sched_getaffinity(0)``).
        machine_cpus: the machine's CPU count (default ``os.cpu_count()``).

    Returns ``SLURM_CPUS_PER_TASK`` (or the affinity's size when smaller: Slurm without task/affinity does not pin,
    a pinned one never gives more than the mask), else the affinity's size when smaller than the machine, else None.
    Raises ValueError for a ``SLURM_CPUS_PER_TASK`` that is not a positive integer.
    """
    return _allocation(environ, affinity=affinity, machine_cpus=machine_cpus)[0]


def threads_for_process(processes_per_node: int, *, allocated: Optional[int], explicit_threads: Optional[int] = None,
                        explicit_workers: Optional[int] = None, max_workers: Optional[int] = None) -> ThreadPlan:
    """Divide the allocation among the training processes of one node (the rule in the module docstring).

    Args:
        processes_per_node: training processes of the run on this node (GPUs, or CPU processes), >= 1.
        allocated: the CPUs of this node's task (:func:`allocated_cpus`); None: ``os.cpu_count()``.
        explicit_threads: intra-op threads the user asked for (>= 1), or None.
        explicit_workers: data-loader workers the user asked for (>= 0), or None.
        max_workers: the most workers the config asks for (>= 0), or None; ignored when ``explicit_workers`` is set.

    Returns a :class:`ThreadPlan` ``(intra_op_threads, loader_workers)`` per process.
    """
    processes = _count("processes_per_node", processes_per_node, 1)
    cpus = _count("allocated", allocated, 1) if allocated is not None else (os.cpu_count() or 1)
    if explicit_threads is not None:
        _count("explicit_threads", explicit_threads, 1)
    if explicit_workers is not None:
        _count("explicit_workers", explicit_workers, 0)
    cap = _count("max_workers", max_workers, 0) if max_workers is not None else None
    share = max(1, cpus // processes)
    if explicit_workers is not None:
        workers = explicit_workers
    elif explicit_threads is not None:
        workers = max(0, share - explicit_threads)
    else:
        workers = share // 2
    if explicit_workers is None and cap is not None:
        workers = min(workers, cap)
    threads = explicit_threads if explicit_threads is not None else max(1, share - workers)
    return ThreadPlan(threads, workers)


def apply_thread_settings(processes_per_node: int, *, allocated: Optional[int] = None,
                          explicit_threads: Optional[int] = None, explicit_workers: Optional[int] = None,
                          max_workers: Optional[int] = None, environ: Optional[MutableMapping[str, str]] = None,
                          log: Optional[logging.Logger] = None) -> ThreadPlan:
    """Size this process's thread pools from the allocation and return the plan (the caller sets its data
    loaders' worker counts to ``plan.loader_workers``). Call it in every training process before the model and the
    data loaders are built.

    Args:
        processes_per_node, explicit_threads, explicit_workers, max_workers: as in :func:`threads_for_process`.
        allocated: the CPUs of this node's task when the environment does not say (a run outside Slurm given its
            CPUs on the command line); the environment's allocation wins.
        environ: read for the allocation and updated with ``OMP_NUM_THREADS`` (and ``OPENBLAS_NUM_THREADS`` /
            ``MKL_NUM_THREADS`` where set), which processes started later inherit. Default ``os.environ``.
        log: where the one line goes (default: this module's logger).
    """
    import threadpoolctl  # imported on use: reading and dividing the allocation needs neither
    import torch

    env = os.environ if environ is None else environ
    logger = log or logging.getLogger(__name__)
    cpus, source = _allocation(env)
    if cpus is None and allocated is not None:
        cpus, source = allocated, "given"
    plan = threads_for_process(processes_per_node, allocated=cpus, explicit_threads=explicit_threads,
                               explicit_workers=explicit_workers, max_workers=max_workers)
    torch.set_num_threads(plan.intra_op_threads)
    threadpoolctl.threadpool_limits(limits=plan.intra_op_threads)  # BLAS and OpenMP libraries loaded so far
    env["OMP_NUM_THREADS"] = str(plan.intra_op_threads)  # read by libraries loaded later and by child processes
    for name in _BLAS_THREAD_ENVS:
        if name in env:
            env[name] = str(plan.intra_op_threads)
    total = cpus if cpus is not None else (os.cpu_count() or 1)
    threads_note = " (set explicitly)" if explicit_threads is not None else ""
    workers_note = " (set explicitly)" if explicit_workers is not None else ""
    logger.info(f"Threads: {plan.intra_op_threads} intra-op thread(s){threads_note} and {plan.loader_workers} "
                f"data-loader worker(s){workers_note} per process: {total} CPU(s) ({source}) for "
                f"{processes_per_node} process(es) on this node")
    demand = processes_per_node * (plan.intra_op_threads + plan.loader_workers)
    if demand > total:
        logger.warning(f"Threads: {processes_per_node} process(es) x ({plan.intra_op_threads} thread(s) + "
                       f"{plan.loader_workers} worker(s)) = {demand} busy threads on {total} CPU(s): oversubscribed, "
                       "expect a slowdown")
    return plan
