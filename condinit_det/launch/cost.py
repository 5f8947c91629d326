"""What a planned experiment costs: wall time and GPU-hours per run, per stage and in total.

A run of ``steps`` optimizer steps on ``processes`` GPUs at ``seconds`` per step of the whole group (one GPU's
step at the recipe's per-GPU batch, as ``bench/bench_gpu_step.py`` measures it) takes
``wall = steps x seconds x (1 + eval_overhead)`` and costs ``wall x processes`` GPU-hours; stage and total wall
times are the runs one after another. A run without a step time is listed, not summed. Bad user input
(``--step-time``, ``--step-bench``) raises a one-line UsageError. Imports neither torch nor detectron2.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

from tabulate import tabulate

from ..utils.errors import UsageError

__all__ = ["STEP_BENCH_FORMAT", "Cost", "RunCost", "StepTime", "StepTimes", "estimate", "format_cost",
           "format_duration", "load_step_times", "resolve_step_time"]

STEP_BENCH_FORMAT = "condinit_det.step_bench/1"  # what bench/bench_gpu_step.py writes


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class StepTime:
    """Seconds per step of a run's whole group (None: unknown) and where they came from (the plan prints it)."""

    seconds: Optional[float] = None
    source: str = "unknown: pass --step-time or --step-bench"


def _same_config(query: str, key: str) -> bool:
    """One path's components end the other's, or ``query`` is ``key``'s file name, with or without ``.py``."""
    q, k = ([p for p in os.path.normpath(s.removeprefix("zoo:")).split(os.sep) if p not in ("", ".")]
            for s in (query, key))
    if len(q) == 1 and k:
        return q[0] in (k[-1], os.path.splitext(k[-1])[0])
    n = min(len(q), len(k))
    return n > 0 and q[-n:] == k[-n:]


class StepTimes(dict):
    """``{config path: the default arm's median seconds per step}`` of a bench file; ``failed`` holds the errors
    of the configs whose bench run failed."""

    def __init__(self, seconds: dict, *, path: str, device: str, tiny: bool, failed: dict):
        super().__init__(seconds)
        self.path, self.device, self.tiny, self.failed = path, device, tiny, failed

    def step_time(self, config: str) -> StepTime:
        """The step time of ``config``: its path (or a shorter one), ``zoo:`` name or file name (``.py`` optional)."""
        known = list(self) + list(self.failed)
        matches = [k for k in known if _same_config(config, k)]
        if len(matches) > 1:
            raise UsageError(f"config {config} matches several configs of bench file {self.path}: "
                             f"{', '.join(matches)}; give its path")
        if not matches:
            raise UsageError(f"config {config} is not in bench file {self.path}; it holds: "
                             f"{', '.join(known) or '(none)'}")
        key = matches[0]
        if key in self.failed:
            raise UsageError(f"bench file {self.path} has no step time for {key}: its run failed ({self.failed[key]})")
        tiny = ", tiny sizes" if self.tiny else ""
        return StepTime(self[key], f"measured: bench file {self.path} on device {self.device} (default arm's median "
                                   f"step{tiny})")


def load_step_times(path: str, *, allow_tiny: bool = False) -> StepTimes:
    """Read the JSON file of ``bench/bench_gpu_step.py --output PATH``; ``allow_tiny`` accepts one measured with
    ``--tiny`` (not the recipes' sizes; for tests)."""
    if not os.path.isfile(path):
        raise UsageError(f"step bench file {path} does not exist (write it with bench/bench_gpu_step.py --output PATH)")
    try:
        with open(path) as f:
            payload = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path} is not a step bench file: {str(e).splitlines()[0]}") from None
    found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
    if found != STEP_BENCH_FORMAT:
        raise UsageError(f"{path} is not a step bench file: format {found!r}, expected {STEP_BENCH_FORMAT!r}")
    if payload.get("tiny") and not allow_tiny:
        raise UsageError(f"{path} was measured with --tiny: its step times are not the recipes'; measure at full size "
                         "on a GPU (bench/bench_gpu_step.py --output PATH)")
    configs = payload.get("configs")
    if not isinstance(configs, dict):
        raise UsageError(f"{path} is not a step bench file: 'configs' must map config paths to results")
    seconds, failed = {}, {}
    for key, entry in configs.items():
        if isinstance(entry, dict) and entry.get("error"):
            failed[key] = str(entry["error"])
            continue
        arms = entry.get("arms") if isinstance(entry, dict) else None
        arms = arms if isinstance(arms, dict) else {}
        if not isinstance(arms.get("default"), dict):
            raise UsageError(f"{path}: {key} has no measured 'default' arm (arms: {', '.join(arms) or 'none'})")
        seconds[key] = arms["default"].get("median_step_s")
        if not _positive(seconds[key]):
            raise UsageError(f"{path}: {key} arms.default.median_step_s must be a positive number, got "
                             f"{seconds[key]!r}")
    device = payload.get("device") if isinstance(payload.get("device"), dict) else {}
    name = device.get("name") or "unknown"
    name = "unknown" if not device.get("type") else name if device["type"] == "cuda" else f"CPU {name}"
    return StepTimes(seconds, path=path, device=name, tiny=bool(payload.get("tiny")), failed=failed)


def resolve_step_time(config: str, *, step_time: Optional[float] = None,
                      step_bench: Optional[str] = None) -> StepTime:
    """``--step-time`` when given, else ``config``'s time in the ``--step-bench`` file, else unknown."""
    if step_time is not None and step_bench is not None:
        raise UsageError("--step-time and --step-bench both given; pass one")
    if step_time is not None:
        if not _positive(step_time):
            raise UsageError(f"--step-time must be a positive number, got {step_time!r}")
        return StepTime(step_time, f"given: --step-time {step_time:g}")
    return load_step_times(step_bench).step_time(config) if step_bench is not None else StepTime()


@dataclass(frozen=True)
class RunCost:
    """One planned run: its stage (the plan groups runs by it), name, optimizer steps, GPUs and step time."""

    stage: str
    name: str
    steps: int
    processes: int
    step: StepTime


@dataclass(frozen=True)
class Cost:
    """Runs one after another: steps, and the wall seconds and GPU-hours of those with a step time (``unknown``
    counts the others)."""

    runs: int
    unknown: int
    steps: int
    wall_seconds: float
    gpu_hours: float


def estimate(runs: Sequence[RunCost], eval_overhead: float = 0.0) -> Cost:
    """The cost of ``runs`` (module docstring)."""
    known = [r for r in runs if r.step.seconds is not None]
    walls = [r.steps * r.step.seconds * (1.0 + eval_overhead) for r in known]
    return Cost(len(runs), len(runs) - len(known), sum(r.steps for r in runs), sum(walls),
                sum(w * r.processes for w, r in zip(walls, known)) / 3600.0)


def format_duration(seconds: float) -> str:
    """``h:mm`` rounded to the minute (``"151:05"``); ``"<0:01"`` under half a minute."""
    if 0 < seconds < 30:
        return "<0:01"
    hours, minutes = divmod(int(round(seconds / 60.0)), 60)
    return f"{hours}:{minutes:02d}"


def _row(label: str, stage: str, cost: Cost, gpus: str = "") -> List[str]:
    """Wall time and GPU-hours: ``?`` when no run has a step time, ``>= x`` when some have none."""
    if cost.unknown == cost.runs:
        wall = hours = "?"
    else:
        prefix = ">= " if cost.unknown else ""
        hours = f"{cost.gpu_hours:.1f}" if cost.gpu_hours >= 10 else f"{cost.gpu_hours:.2f}"
        wall, hours = prefix + format_duration(cost.wall_seconds), prefix + hours
    return [label, stage, str(cost.steps), gpus, wall, hours]


def format_cost(runs: Sequence[RunCost], *, eval_overhead: float = 0.0) -> str:
    """The plan's cost: one row per run, a subtotal per stage (in the order stages first appear), the total; then
    how the times were computed, where each stage's step times came from and the evaluation overhead."""
    if not runs:
        raise UsageError("no run to estimate: the plan is empty")
    stages = {}
    for run in runs:
        stages.setdefault(run.stage, []).append(run)
    body, sources = [], []
    for stage, group in stages.items():
        body += [_row(r.name, stage, estimate([r], eval_overhead), str(r.processes)) for r in group]
        body.append(_row(f"subtotal {stage} ({len(group)} run{'s' * (len(group) != 1)})", stage,
                         estimate(group, eval_overhead)))
        sources += [f"step time ({stage}): {source}" for source in dict.fromkeys(r.step.source for r in group)]
    total = estimate(runs, eval_overhead)
    body.append(_row(f"total ({len(runs)} run{'s' * (len(runs) != 1)})", "", total))
    lines = [tabulate(body, ["run", "stage", "steps", "GPUs", "wall h:mm", "GPU-hours"], tablefmt="github",
                      disable_numparse=True, colalign=("left", "left") + ("right",) * 4),
             "wall time: steps x step time x (1 + evaluation overhead); subtotals and total: the runs one after "
             "another. GPU-hours: wall time x GPUs.", *sources,
             f"evaluation overhead: +{eval_overhead * 100:g}% of the training time (eval_overhead={eval_overhead:g})"
             if eval_overhead > 0 else "evaluation overhead: not included (eval_overhead=0)"]
    if total.unknown:
        lines.append(f"{total.unknown} run(s) without a step time are not summed (>=): pass --step-time or "
                     "--step-bench")
    return "\n".join(lines)
