"""What a run ran on: the ``"environment"`` record of :data:`ENVIRONMENT_FIELDS` (None where unreadable) each start of
training adds to ``results.json``; the report names those in which pooled runs differ (docs/comparing_arms.md).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import subprocess
from typing import Dict, Optional

__all__ = ["ENVIRONMENT_FIELDS", "ENVIRONMENT_KIND", "environment_record"]

ENVIRONMENT_KIND = "environment"
# The fields the report compares, in the order it shows them.
ENVIRONMENT_FIELDS = (
    "cpu",
    "gpu",
    "gpus",
    "threads",
    "python",
    "torch",
    "detectron2",
    "timm",
    "condinit_det",
    "commit",
)


def _cpu_model() -> Optional[str]:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:  # Linux
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _version(package: str) -> Optional[str]:
    # The module's own version: detectron2's distribution may be named otherwise (a rewritten wheel).
    try:
        return str(importlib.import_module(package).__version__)
    except (ImportError, AttributeError):
        return None


def _commit() -> Optional[str]:
    """The git commit of this package's checkout (with ``+dirty`` for local changes); None when installed."""
    folder = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(folder, ".git")):
        return None
    try:  # every tag left out: the short commit hash alone
        done = subprocess.run(
            ["git", "-C", folder, "describe", "--always", "--dirty=+dirty", "--exclude=*"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment_record(iteration: int, *, device: str = "cpu") -> Dict[str, object]:
    """The ``"environment"`` record of a run (re)starting after ``iteration`` completed steps on ``device``."""
    import torch

    cuda = str(device).startswith("cuda") and torch.cuda.is_available()
    record = {
        "kind": ENVIRONMENT_KIND,
        "iteration": int(iteration),
        "cpu": _cpu_model(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "commit": _commit(),
    }
    record.update({package: _version(package) for package in ("torch", "detectron2", "timm", "condinit_det")})
    return record
