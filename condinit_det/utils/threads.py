"""Threads of a training process from the CPUs its job was given, not from the machine's: its share is
``allocated // processes_per_node`` CPUs (at least 1), data-loader workers get half of it (rounded down, at most the
config's worker count), intra-op threads the rest (at least 1). Why: docs/training.md.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Optional, Tuple

__all__ = ["ThreadPlan", "allocated_cpus", "apply_thread_settings", "threads_for_process"]

ALLOCATION_ENV = "SLURM_CPUS_PER_TASK"
# BLAS-specific variables take precedence over OMP_NUM_THREADS in their libraries: overwritten when present.
_BLAS_THREAD_ENVS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class ThreadPlan(NamedTuple):
    """What one training process runs with."""

    intra_op_threads: int  # torch's intra-op pool, the BLAS and OpenMP pools
    loader_workers: int  # data-loader worker processes (each computes on one thread)


def _allocation() -> Tuple[Optional[int], str]:
    """``(cpus, where the number comes from)``; cpus None when the whole machine is this process's."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    text = os.environ.get(ALLOCATION_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"{ALLOCATION_ENV}={text!r}: expected a positive integer (the CPUs Slurm gives each "
                "task); unset it to use the CPU affinity"
            )
        if usable is not None and usable < int(text):  # Slurm without task/affinity does not pin
            return usable, f"CPU affinity, within {ALLOCATION_ENV}={text}"
        return int(text), ALLOCATION_ENV
    if usable is not None and usable < os.cpu_count():  # the affinity's platforms always count their CPUs
        return usable, "CPU affinity"
    return None, "the whole machine"


def allocated_cpus() -> Optional[int]:
    """The CPUs this process may use: ``SLURM_CPUS_PER_TASK`` or the CPU affinity, whichever is smaller; None when
    nothing restricts it. A ``SLURM_CPUS_PER_TASK`` that is not a positive integer raises ValueError."""
    return _allocation()[0]


def threads_for_process(
    processes_per_node: int, *, allocated: Optional[int], max_workers: Optional[int] = None
) -> ThreadPlan:
    """Divide the allocation among the training processes of one node (the rule in the module docstring).

    Args:
        processes_per_node: training processes of the run on this node, >= 1.
        allocated: the CPUs of this node's task (:func:`allocated_cpus`); None: ``os.cpu_count()``.
        max_workers: the most data-loader workers the config asks for, or None.
    """
    cpus = allocated if allocated is not None else (os.cpu_count() or 1)
    share = max(1, cpus // processes_per_node)
    workers = share // 2 if max_workers is None else min(share // 2, max_workers)
    return ThreadPlan(max(1, share - workers), workers)


def apply_thread_settings(
    processes_per_node: int,
    *,
    allocated: Optional[int] = None,
    max_workers: Optional[int] = None,
    log: Optional[logging.Logger] = None,
) -> ThreadPlan:
    """Size this process's thread pools (and ``OMP_NUM_THREADS`` for what loads or starts later) from the allocation,
    before the model and the data loaders are built; returns the plan, whose ``loader_workers`` the caller applies.

    Args:
        processes_per_node, max_workers: as in :func:`threads_for_process`.
        allocated: the CPUs when the environment does not say (``--cpus-per-task`` outside Slurm).
        log: where the one line goes (default: this module's logger).
    """
    import threadpoolctl
    import torch

    logger = log or logging.getLogger(__name__)
    cpus, source = _allocation()
    if cpus is None and allocated is not None:
        cpus, source = allocated, "given"
    plan = threads_for_process(processes_per_node, allocated=cpus, max_workers=max_workers)
    torch.set_num_threads(plan.intra_op_threads)
    threadpoolctl.threadpool_limits(limits=plan.intra_op_threads)  # BLAS and OpenMP libraries loaded so far
    os.environ["OMP_NUM_THREADS"] = str(plan.intra_op_threads)  # read by libraries loaded later and by children
    for name in _BLAS_THREAD_ENVS:
        if name in os.environ:
            os.environ[name] = str(plan.intra_op_threads)
    total = cpus if cpus is not None else (os.cpu_count() or 1)
    logger.info(
        f"Threads: {plan.intra_op_threads} intra-op thread(s) and {plan.loader_workers} data-loader "
        f"worker(s) per process: {total} CPU(s) ({source}) for {processes_per_node} process(es) on this node"
    )
    demand = processes_per_node * (plan.intra_op_threads + plan.loader_workers)
    if demand > total:
        logger.warning(
            f"Threads: {processes_per_node} process(es) x ({plan.intra_op_threads} thread(s) + "
            f"{plan.loader_workers} worker(s)) = {demand} busy threads on {total} CPU(s): oversubscribed, "
            "expect a slowdown"
        )
    return plan
