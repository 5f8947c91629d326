"""Where the runs of an experiment live: the arm x seed x learning-rate layout and the plan file.

Both training stages lay their runs out the same way and the report reads them back::

    <base>/experiment.json                 the plan: stage, arms, seeds, lr scales, every run's directory
    <base>/<arm>/seed<k>/                  one run (seed k, the config's learning rate)
    <base>/<arm>/seed<k>-lr<s>/            one run of a learning-rate scan (s x the config's lr)
    <base>/<arm>/seed<k>.failed<n>/        a failed run moved aside by ``--retry-failed``
    <base>/report/                         the comparison

No detectron2 or timm import.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence

from ..init import ARMS, PAPER_ARMS
from ..utils.fileio import atomic_write

__all__ = [
    "PLAN_FILENAME",
    "REPORT_DIRNAME",
    "RunSpec",
    "is_set_aside",
    "parse_arms",
    "parse_lr_scales",
    "parse_seeds",
    "plan_runs",
    "read_plan",
    "set_aside",
    "write_plan",
]

ARM_CHOICES = tuple(ARMS) + ("all",)
PLAN_FILENAME = "experiment.json"
REPORT_DIRNAME = "report"
_SET_ASIDE = re.compile(r"\.failed\d+$")


def parse_arms(text: str) -> List[str]:
    """``"all"`` -> the paper's arms; ``"default,conditioned"`` or ``"all,scale_matched"`` -> those arms, in
    order; raises ValueError naming the accepted values."""
    arms: List[str] = []
    for part in str(text).split(","):
        part = part.strip()
        for arm in (PAPER_ARMS if part == "all" else [part]):
            if arm not in ARMS:
                raise ValueError(f"--arm {text!r}: {part!r} is not an arm; accepted: {', '.join(ARMS)}, 'all' "
                                 f"({', '.join(PAPER_ARMS)}) or a comma-separated list of them")
            if arm not in arms:
                arms.append(arm)
    return arms


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

    @property
    def dir(self) -> str:
        """``<arm>/seed<k>[-lr<s>]``: the run's folder relative to its experiment directory (also its name in
        messages)."""
        return os.path.join(self.arm, self.name)

    def path(self, base: str) -> str:
        return os.path.join(base, self.dir)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "lr_scale": self.lr_scale, "dir": self.dir}


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


def write_plan(base: str, runs: Sequence[RunSpec], *, stage: str, config: Optional[str],
               length: Optional[Mapping] = None) -> str:
    """Write ``<base>/experiment.json`` (the runs the report expects); returns its path.

    ``length``: how long each run trains, ``{"unit": "iteration" | "epoch", "total": N}`` (read by the
    status command to tell finished runs and estimate the time left).
    """
    path = os.path.join(base, PLAN_FILENAME)
    payload = {"version": 1, "stage": stage, "config": config, "runs": [r.to_dict() for r in runs]}
    if length is not None:
        payload["length"] = {"unit": str(length["unit"]), "total": int(length["total"])}
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


def is_set_aside(name: str) -> bool:
    """Whether a folder name is a run directory moved aside by ``--retry-failed`` (``seed0.failed1``)."""
    return bool(_SET_ASIDE.search(name))


def set_aside(run_dir: str) -> str:
    """Move ``run_dir`` to ``<run_dir>.failed<n>`` (the first free n); returns the new path."""
    n = 0
    while os.path.exists(f"{run_dir}.failed{n}"):
        n += 1
    os.replace(run_dir, f"{run_dir}.failed{n}")
    return f"{run_dir}.failed{n}"
