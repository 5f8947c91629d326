"""Which Slurm jobs an experiment's runs had, oldest first (the last is the current one), and its report jobs:
``<base>/slurm.json``, ``{"runs": {"<arm>/seed<k>": ["805_0", "811_2"], ...}, "report": ["806", "812"]}``.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional, Tuple

from ..utils.fileio import atomic_write, read_json

__all__ = ["JOBS_FILENAME", "read_jobs", "read_report_jobs", "record_jobs"]

JOBS_FILENAME = "slurm.json"


def _read(base: str) -> Tuple[Dict[str, List[str]], List[str]]:
    """(run directory relative to ``base`` -> every job id it had, the report jobs), oldest first."""
    data = read_json(os.path.join(base, JOBS_FILENAME), "; move it aside to submit afresh") or {}
    runs = {run: [str(j) for j in jobs] for run, jobs in data.get("runs", {}).items()}
    return runs, [str(j) for j in data.get("report", [])]


def read_jobs(base: str) -> Dict[str, str]:
    """Run directory (relative to ``base``) -> its current (latest) Slurm job id; {} without ``slurm.json``."""
    return {run: jobs[-1] for run, jobs in _read(base)[0].items() if jobs}


def read_report_jobs(base: str) -> List[str]:
    """The report jobs submitted for ``base``, oldest first."""
    return _read(base)[1]


def record_jobs(base: str, jobs: Mapping[str, str], report: Optional[str] = None) -> None:
    """Add each run's new job (run directory relative to ``base`` -> job id) and a new report job."""
    runs, reports = _read(base)
    for run, job in jobs.items():
        runs.setdefault(run, []).append(str(job))
    reports += [str(report)] if report else []
    atomic_write(os.path.join(base, JOBS_FILENAME), json.dumps({"runs": runs, "report": reports}, indent=1))
