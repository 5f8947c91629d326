"""The arm report ``condinit_arm_report.json`` (what the arm did to each attention site) and the run identity it
holds (arm, seeds, patterns, options, lr scale), which a ``--resume`` must match.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional

from ..utils.fileio import atomic_write, read_json

__all__ = ["ARM_REPORT_FILENAME", "IDENTITY_KEYS", "check_resume_identity", "read_arm_report", "write_arm_report"]

ARM_REPORT_FILENAME = "condinit_arm_report.json"
# What a resumed run must share with the run it continues.
IDENTITY_KEYS = ("arm", "seed", "arm_seed", "include", "exclude", "options", "lr_scale")


def read_arm_report(run_dir: str) -> Optional[dict]:
    """The run's ``condinit_arm_report.json`` as a dict, or None when absent."""
    return read_json(os.path.join(run_dir, ARM_REPORT_FILENAME), "; move it aside to start the run afresh")


def write_arm_report(run_dir: str, report: Mapping, identity: Mapping) -> str:
    """Write the arm report (``InitReport.to_dict()`` plus per-site extras) with the run identity."""
    path = os.path.join(run_dir, ARM_REPORT_FILENAME)
    atomic_write(path, json.dumps({"run": dict(identity), **dict(report)}, indent=2))
    return path


def check_resume_identity(run_dir: str, identity: Mapping, *, allow_change: bool = False) -> None:
    """Raise ValueError naming both when ``identity`` differs from the run identity in ``run_dir``'s arm report
    (arm, seed, patterns, options or lr scale), unless ``allow_change``."""
    previous = (read_arm_report(run_dir) or {}).get("run") or {}
    differing = [k for k in IDENTITY_KEYS if k in previous and previous[k] != identity.get(k)]
    if differing and not allow_change:
        was = ", ".join(f"{k}={previous[k]!r}" for k in differing)
        asked = ", ".join(f"{k}={identity.get(k)!r}" for k in differing)
        raise ValueError(
            f"{run_dir} was started with {was} but this run asks for {asked}; resume with the same settings, use "
            "another output directory, or pass --allow-changed-run to continue anyway"
        )
