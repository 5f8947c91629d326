"""Stopping a run for a requeue: inside a Slurm element (``CONDINIT_PREEMPTIBLE`` set) USR2 comes before the time
limit; the processes agree at a step boundary, save what they resume from and raise :class:`Preempted`, neither a
failure nor a finish (docs/slurm.md).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

__all__ = ["PREEMPTED_FILENAME", "PREEMPTIBLE_ENV", "Preempted", "PreemptionWatch", "requeue_flag"]

PREEMPTED_FILENAME = "preempted"
PREEMPTIBLE_ENV = "CONDINIT_PREEMPTIBLE"


class Preempted(Exception):
    """A run stopped at a step boundary to be requeued (its processes leave ``<run_dir>/preempted``); it resumes from
    its last checkpoint."""


def requeue_flag() -> threading.Event:
    """An event set when this process receives USR2, the time-limit signal, instead of being terminated; call it in
    the main thread (signal handlers can only be installed there)."""
    event = threading.Event()
    signal.signal(signal.SIGUSR2, lambda *_: event.set())
    return event


class PreemptionWatch:
    """Whether to stop for a requeue, agreed by every process of a run inside a Slurm element; create it in the main
    thread. :meth:`requested` is collective: every process calls it at the same step boundary."""

    def __init__(self):
        self._flag: Optional[threading.Event] = requeue_flag() if os.environ.get(PREEMPTIBLE_ENV) else None

    def requested(self) -> bool:
        """Whether any process of the run received the time-limit signal (always False when not active)."""
        if self._flag is None:
            return False
        from detectron2.utils import comm

        return any(comm.all_gather(self._flag.is_set()))  # over gloo: no GPU synchronization at every step

    @staticmethod
    def stop(run_dir: str, where: str) -> None:
        """Leave ``<run_dir>/preempted`` (main process) and raise :class:`Preempted`."""
        from .distributed import rank
        from .fileio import atomic_write

        if rank() == 0:
            atomic_write(os.path.join(run_dir, PREEMPTED_FILENAME), where)
        raise Preempted(f"stopped for a requeue: {where}")
