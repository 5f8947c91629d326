"""What Slurm says of some jobs: one ``squeue`` query (array elements one per line, ``--array``; else pending ones
fold into ``123_[4-7]``) for the run lock, the submission and the status command.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

__all__ = ["ENDED_STATES", "NEVER_STARTS", "JobStates", "is_pending", "query_jobs", "squeue_command", "still_runs"]

# A pending job that waits on one that failed or was cancelled (squeue's reason DependencyNeverSatisfied): it never
# starts, so it counts as ended.
NEVER_STARTS = "DEPENDENCY_NEVER_SATISFIED"
# squeue's final states; a job in any other state (pending, running, suspended, requeued, held, ...) may still run.
ENDED_STATES = frozenset(
    {
        NEVER_STARTS,
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
_PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})


@dataclass
class JobStates:
    """The answer to :func:`query_jobs`: job id -> state of each job squeue lists, or why there is no answer."""

    states: Dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None

    def get(self, job_id: str) -> Optional[str]:
        return self.states.get(str(job_id))


def still_runs(state: Optional[str]) -> bool:
    """Whether a job in ``state`` may still run (None: not listed, so over)."""
    return state is not None and state not in ENDED_STATES


def is_pending(state: Optional[str]) -> bool:
    """Whether a job in ``state`` waits to start (again)."""
    return state in _PENDING_STATES


def squeue_command(job_ids: Optional[Sequence[str]] = None, fields: str = "%i|%T|%r") -> List[str]:
    """The squeue command line: every state, array elements one per line, no header, ``fields`` (squeue's
    ``--format``); the given jobs (default: this user's)."""
    command = ["squeue", "--noheader", "--array", "--states=all", f"--format={fields}"]
    return command + (["--jobs=" + ",".join(job_ids)] if job_ids else ["--me"])


def query_jobs(job_ids: Sequence[str]) -> JobStates:
    """What squeue says of ``job_ids`` (``"123"``, or ``"123_4"`` for an array element); no id asks nothing."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return JobStates()
    if shutil.which("squeue") is None:
        return JobStates(error="squeue is not on PATH")
    try:
        done = subprocess.run(squeue_command(ids), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return JobStates(error=f"squeue failed: {e}")
    if done.returncode != 0:
        # A job purged from the controller is "Invalid job id specified": no answer about it.
        message = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return JobStates(error=f"squeue: {message}")
    states = {}
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job and state:
            never = state.strip().upper() == "PENDING" and reason.strip() == "DependencyNeverSatisfied"
            states[job] = NEVER_STARTS if never else state.strip().upper()
    return JobStates(states)
