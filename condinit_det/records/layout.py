"""Where the runs of an experiment live: ``<base>/experiment.json`` (the plan), ``<base>/<arm>/seed<k>[-lr<s>]/`` (a
run), ``<base>/<arm>/seed<k>.failed<n>/`` (set aside by ``--retry-failed``), ``<base>/report/``
(docs/training.md#where-runs-go). No detectron2 or timm import.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..init.options import ARM_GROUPS, ARMS
from ..utils.fileio import atomic_write, read_json

__all__ = [
    "PLAN_FILENAME",
    "REPORT_DIRNAME",
    "Plan",
    "RunSpec",
    "find_plans",
    "is_set_aside",
    "parse_arms",
    "parse_lr_scales",
    "parse_seeds",
    "plan_runs",
    "read_plan",
    "set_aside",
    "write_plan",
]

PLAN_FILENAME = "experiment.json"
REPORT_DIRNAME = "report"
_SET_ASIDE = re.compile(r"\.failed\d+$")


def parse_arms(text: str) -> List[str]:
    """``"all"`` -> the paper's arms; ``"factorial"`` -> the structure x scale design; ``"default,conditioned"`` or
    ``"all,scale_matched"`` -> those arms, in order; raises ValueError naming the accepted values."""
    arms: List[str] = []
    for part in str(text).split(","):
        part = part.strip()
        for arm in ARM_GROUPS.get(part, [part]):
            if arm not in ARMS:
                groups = ", ".join(f"'{name}' ({', '.join(members)})" for name, members in ARM_GROUPS.items())
                raise ValueError(
                    f"--arm {text!r}: {part!r} is not an arm; accepted: {', '.join(ARMS)}, {groups} or a "
                    "comma-separated list of them"
                )
            if arm not in arms:
                arms.append(arm)
    return arms


def parse_seeds(text: str) -> List[int]:
    """``"0,1,2"`` or ``"0-2"`` -> ``[0, 1, 2]``; raises ValueError naming the accepted forms."""
    seeds: List[int] = []
    try:
        for part in str(text).split(","):
            first, dash, last = part.strip().partition("-")  # "-1": no first seed, a ValueError
            seeds.extend(range(int(first), int(last) + 1) if dash else [int(first)])
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected non-negative integers like '0,1,2' or a range '0-2'") from None
    if not seeds or len(set(seeds)) != len(seeds):
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


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: arm, training seed and learning-rate multiplier."""

    arm: str
    seed: int
    lr_scale: float = 1.0

    @property
    def name(self) -> str:
        """``seed<k>`` or ``seed<k>-lr<s>``: the run's folder under ``<base>/<arm>/``."""
        return f"seed{self.seed}" + ("" if self.lr_scale == 1.0 else f"-lr{self.lr_scale:g}")

    @property
    def dir(self) -> str:
        """``<arm>/seed<k>[-lr<s>]``: the run's folder under its experiment (also its name in messages)."""
        return os.path.join(self.arm, self.name)

    def path(self, base: str) -> str:
        return os.path.join(base, self.dir)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "lr_scale": self.lr_scale, "dir": self.dir}


def plan_runs(arms: Sequence[str], seeds: Sequence[int], lr_scales: Sequence[float] = (1.0,)) -> List[RunSpec]:
    """Every run in training order: all arms at the config's learning rate, seed by seed (an interrupted experiment
    holds complete paired sets), then the other ``lr_scales`` for every arm on the first seed."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown arm(s) {unknown}; accepted: {', '.join(ARMS)} (or 'all')")
    runs = [RunSpec(arm, int(seed)) for seed in seeds for arm in arms]
    for scale in lr_scales:
        if float(scale) != 1.0:
            runs += [RunSpec(arm, int(seeds[0]), float(scale)) for arm in arms]
    return runs


@dataclass(frozen=True)
class Plan:
    """An experiment plan ``<base>/experiment.json``: the stage (its name and description), the config, each run's
    length in ``unit``, every run the report expects, and (None in older plans) the ``setup`` every run shares
    (dotted key -> text), the training ``dataset`` and the ``evaluation`` data's names."""

    base: str
    runs: Tuple[RunSpec, ...]
    stage: Optional[str]
    stage_description: Optional[dict]
    config: Optional[str]
    length: Optional[int]
    unit: Optional[str]
    setup: Optional[dict] = None
    dataset: Optional[str] = None
    evaluation: Optional[str] = None


def write_plan(
    base: str,
    runs: Sequence[RunSpec],
    *,
    stage,
    config: Optional[str],
    length: int,
    setup: Optional[dict] = None,
    dataset: Optional[str] = None,
    evaluation: Optional[str] = None,
) -> str:
    """Write ``<base>/experiment.json`` (``stage``: the :class:`condinit_det.stage.StageDescriptor`, stored whole; the
    rest as in :class:`Plan`); returns its path."""
    path = os.path.join(base, PLAN_FILENAME)
    payload = {
        "version": 1,
        "stage": stage.name,
        "stage_description": stage.to_dict(),
        "config": config,
        "length": {"unit": stage.unit, "total": int(length)},
        "setup": setup,
        "dataset": dataset,
        "evaluation": evaluation,
        "runs": [r.to_dict() for r in runs],
    }
    atomic_write(path, json.dumps(payload, indent=1))
    return path


def read_plan(base: str) -> Optional[Plan]:
    """The plan in ``<base>/experiment.json`` or None; a file that is not a plan raises ValueError."""
    path = os.path.join(base, PLAN_FILENAME)
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not an experiment plan: expected an object with a 'runs' list")
    try:
        runs = tuple(RunSpec(str(r["arm"]), int(r["seed"]), float(r.get("lr_scale", 1.0))) for r in data["runs"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(
            f"{path}: a run entry is not valid ({type(err).__name__}: {err}); each run is an object with an 'arm' "
            f"(a name), a 'seed' (an integer) and optionally an 'lr_scale' (a number)"
        ) from None
    length = data.get("length") or {}
    return Plan(
        base=base,
        runs=runs,
        stage=data.get("stage"),
        stage_description=data.get("stage_description"),
        config=data.get("config"),
        length=length.get("total"),
        unit=length.get("unit"),
        setup=data.get("setup"),
        dataset=data.get("dataset"),
        evaluation=data.get("evaluation"),
    )


def find_plans(path: str) -> List[str]:
    """The experiment directories (holding a plan) of ``path``: the nearest at or up to two levels above it (from a
    run directory), then every one below it."""
    bases = []
    up = os.path.abspath(path)
    for _ in range(3):
        if os.path.isfile(os.path.join(up, PLAN_FILENAME)):
            bases.append(up)
            break
        up = os.path.dirname(up)
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not is_set_aside(d))
        if PLAN_FILENAME in files and os.path.abspath(root) not in bases:
            bases.append(os.path.abspath(root))
    return bases


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
