"""Experiments as sets of runs: the arm x seed x learning-rate layout, the plan file and run identity.

Both training stages (``tools/pretrain_net.py``, ``tools/train_net.py``) lay their runs out the
same way and the report reads them back. No detectron2 or timm import.

Layout of an experiment directory ``<base>``::

    <base>/experiment.json                 the plan: arms, seeds, lr scales, every run's directory
    <base>/<arm>/seed<k>/                  one run (seed k, the config's learning rate)
    <base>/<arm>/seed<k>-lr<s>/            one run of a learning-rate scan (s x the config's lr)
    <base>/report/                         the comparison

A run directory holds ``results.json`` and ``condinit_arm_report.json``; the latter records the
run's *identity* (arm, seeds, include/exclude patterns, arm options, lr scale), against which a
``--resume`` is checked: a run directory never changes arm, seed or patterns silently.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from .fileio import atomic_write
from .init import ARMS
from .results import ARM_REPORT_FILENAME

__all__ = [
    "ARM_CHOICES",
    "IDENTITY_KEYS",
    "PLAN_FILENAME",
    "RunSpec",
    "check_resume_identity",
    "parse_lr_scales",
    "parse_seeds",
    "plan_runs",
    "read_arm_report",
    "read_plan",
    "write_arm_report",
    "write_plan",
]

ARM_CHOICES = tuple(ARMS) + ("all",)
PLAN_FILENAME = "experiment.json"
# What a resumed run must share with the run it continues.
IDENTITY_KEYS = ("arm", "seed", "arm_seed", "include", "exclude", "options", "lr_scale")


def parse_seeds(text: str) -> List[int]:
    """``"0,1,2"`` or ``"0-2"`` -> ``[0, 1, 2]``; raises ValueError naming the accepted forms."""
    seeds: List[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, "")
                seeds.extend(range(int(lo), int(hi) + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected non-negative integers like '0,1,2' or a range '0-2'") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: expected distinct non-negative integers like '0,1,2' or '0-2'")
    return seeds


def parse_lr_scales(text: str) -> List[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]`` (multipliers of the config's base learning rate)."""
    try:
        scales = [float(p) for p in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--lr-scale {text!r}: expected positive numbers like '0.5,1,2'") from None
    if not scales or any(not math.isfinite(s) or s <= 0 for s in scales) or len(set(scales)) != len(scales):
        raise ValueError(f"--lr-scale {text!r}: expected distinct positive numbers like '0.5,1,2'")
    return scales


def _format_scale(scale: float) -> str:
    return f"{scale:g}"


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: arm, training seed and learning-rate multiplier."""

    arm: str
    seed: int
    lr_scale: float = 1.0

    @property
    def name(self) -> str:
        """``seed<k>`` or ``seed<k>-lr<s>``: the run's folder under ``<base>/<arm>/``."""
        return f"seed{self.seed}" + ("" if self.lr_scale == 1.0 else f"-lr{_format_scale(self.lr_scale)}")

    def path(self, base: str) -> str:
        return os.path.join(base, self.arm, self.name)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "lr_scale": self.lr_scale, "dir": os.path.join(self.arm, self.name)}


def plan_runs(arms: Sequence[str], seeds: Sequence[int], lr_scales: Sequence[float] = (1.0,)) -> List[RunSpec]:
    """Every run of an experiment, in the order they are trained.

    All arms at the config's learning rate for every seed (seed by seed, so an interrupted
    experiment holds complete paired sets), then the learning-rate scan: the other scales for
    every arm on the first seed.
    """
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown arm(s) {unknown}; accepted: {', '.join(ARMS)} (or 'all')")
    runs = [RunSpec(arm, int(seed)) for seed in seeds for arm in arms]
    for scale in lr_scales:
        if float(scale) != 1.0:
            runs += [RunSpec(arm, int(seeds[0]), float(scale)) for arm in arms]
    return runs


def write_plan(base: str, runs: Sequence[RunSpec], *, stage: str, config: Optional[str]) -> str:
    """Write ``<base>/experiment.json`` (the runs the report expects); returns its path."""
    path = os.path.join(base, PLAN_FILENAME)
    payload = {"version": 1, "stage": stage, "config": config, "runs": [r.to_dict() for r in runs]}
    atomic_write(path, json.dumps(payload, indent=1))
    return path


def read_plan(base: str) -> Optional[List[RunSpec]]:
    """The runs listed in ``<base>/experiment.json``, or None when there is no plan file."""
    path = os.path.join(base, PLAN_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None
    return [RunSpec(r["arm"], int(r["seed"]), float(r.get("lr_scale", 1.0))) for r in data.get("runs", [])]


def read_arm_report(run_dir: str) -> Optional[dict]:
    """The run's ``condinit_arm_report.json`` as a dict, or None when absent."""
    path = os.path.join(run_dir, ARM_REPORT_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); move it aside to start the run afresh") from None


def write_arm_report(run_dir: str, report: Mapping, identity: Mapping) -> str:
    """Write the arm report (``InitReport.to_dict()`` plus per-site extras) with the run identity."""
    path = os.path.join(run_dir, ARM_REPORT_FILENAME)
    atomic_write(path, json.dumps({"run": dict(identity), **dict(report)}, indent=2))
    return path


def _describe(identity: Mapping) -> str:
    return ", ".join(f"{k}={identity.get(k)!r}" for k in IDENTITY_KEYS if k in identity)


def check_resume_identity(run_dir: str, identity: Mapping, *, allow_change: bool = False) -> Optional[Dict]:
    """Refuse to resume ``run_dir`` with another arm, seed, patterns, options or lr scale.

    Compares ``identity`` with the ``run`` section of the run's arm report (when there is one).
    Returns the previous identity (or None). Raises ValueError naming both unless ``allow_change``.
    """
    previous = (read_arm_report(run_dir) or {}).get("run")
    if not previous:
        return None
    differing = [k for k in IDENTITY_KEYS if k in previous and previous.get(k) != identity.get(k)]
    if differing and not allow_change:
        raise ValueError(
            f"{run_dir} was started with {_describe({k: previous.get(k) for k in differing})} but this run asks "
            f"for {_describe({k: identity.get(k) for k in differing})}; resume with the same settings, use "
            "another output directory, or pass --allow-changed-run to continue anyway"
        )
    return previous
