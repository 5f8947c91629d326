"""What a planned experiment costs: wall time and GPU-hours per run, per stage and in total (pure Python).

    from condinit_det.launch.cost import RunCost, estimate, format_cost, resolve_step_time

    step = resolve_step_time("configs/COCO/mask_rcnn_xcit_s12_3x.py", step_bench="step_bench.json")
    runs = [RunCost.with_step_time(stage="detection", name="conditioned/seed0", steps=270000, processes=8,
                                   step_time=step)]
    print(format_cost(estimate(runs, eval_overhead=0.1)))

The model: a run of ``steps`` optimizer steps on ``processes`` GPUs takes
``wall = steps x step_seconds x (1 + eval_overhead)`` and costs ``wall x processes`` GPU-hours. Data
parallel training runs the recipe's per-GPU batch on every GPU at once, so one step of the whole group
takes about one GPU's step time at that batch, which ``bench/bench_gpu_step.py`` measures (on one GPU:
the gradient all-reduce across GPUs and any data-loading stall come on top; the evaluation's share is
``eval_overhead``). Per-stage and total wall times are those of the runs one after another (an array
of runs on a cluster finishes sooner; the GPU-hours do not change).

Step times (:class:`StepTime`) say where they came from: ``measured`` (a bench file, on a device),
``given`` (``--step-time``) or ``unknown`` (the plan still lists the run, without a time).

Bad input raises :class:`~condinit_det.utils.errors.UsageError` with one line naming what was wrong
and what is accepted. This module imports neither torch nor detectron2.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..utils.errors import UsageError

__all__ = ["STATISTICS", "STEP_BENCH_FORMAT", "CostTable", "RunCost", "RunEstimate", "StageTotal", "StepTime",
           "StepTimes", "estimate", "format_cost", "format_duration", "load_step_times", "resolve_step_time"]

STEP_BENCH_FORMAT = "condinit_det.step_bench/1"  # what bench/bench_gpu_step.py writes
# Which of a config's per-arm step times stands for it: the default arm's median, or the slowest arm's.
STATISTICS = ("default", "max")
DEFAULT_ARM = "default"
_STATISTIC_WORDS = {"default": "default arm's median step", "max": "slowest arm's median step"}


def _positive(value, what: str, *, integer: bool = False):
    """``value`` if it is a finite number > 0 (an int when ``integer``); else UsageError."""
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        kind = "a positive integer"
    else:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and value > 0)
        kind = "a positive number"
    if not ok:
        raise UsageError(f"{what} must be {kind}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Step times
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step of one config's run, and where the number came from.

    Attributes:
        seconds: seconds per step of the whole data-parallel group; None when unknown.
        origin: ``"measured"``, ``"given"`` or ``"unknown"``.
        detail: for ``measured``, the bench file, device and statistic; for ``given``, the flag.
        batch_per_gpu: the per-GPU batch the time was measured at (measured only), else None.
    """

    seconds: Optional[float]
    origin: str
    detail: str = ""
    batch_per_gpu: Optional[int] = None

    def __post_init__(self):
        if self.origin not in ("measured", "given", "unknown"):
            raise UsageError(f"StepTime origin {self.origin!r}; accepted: measured, given, unknown")
        if self.origin == "unknown":
            if self.seconds is not None:
                raise UsageError(f"an unknown step time holds no seconds, got {self.seconds!r}")
        else:
            _positive(self.seconds, "the step time (seconds)")

    @classmethod
    def given(cls, seconds: float, flag: str = "--step-time") -> "StepTime":
        """A step time stated by the user (``flag`` is named in the plan)."""
        return cls(seconds=_positive(seconds, flag), origin="given", detail=flag)

    @classmethod
    def unknown(cls) -> "StepTime":
        return cls(seconds=None, origin="unknown")

    def describe(self) -> str:
        """One line for the plan: ``measured: bench file X on device Y (...)``, ``given: --step-time 0.45``,
        ``unknown: pass --step-time or --step-bench``."""
        if self.origin == "measured":
            return f"measured: {self.detail}"
        if self.origin == "given":
            return f"given: {self.detail} {self.seconds:g}"
        return "unknown: pass --step-time or --step-bench"


class StepTimes(Mapping):
    """The step times of a bench file: ``{config path: seconds per step}`` (one statistic per config).

    Keys are the config paths as the bench wrote them (relative to the repository, e.g.
    ``configs/COCO/mask_rcnn_vitdet_b_100ep.py``); :meth:`step_time` also finds a config by an absolute
    or shorter path, ``zoo:`` name, file name or file name without ``.py``. Configs whose bench run
    failed are not keys (:attr:`failed` holds their errors).
    """

    def __init__(self, *, path: str, device: str, statistic: str, seconds: Dict[str, float],
                 batch_per_gpu: Dict[str, int], failed: Dict[str, str], tiny: bool = False):
        self.path = path
        self.device = device
        self.statistic = statistic
        self.tiny = tiny
        self.failed = dict(failed)
        self._seconds = dict(seconds)
        self._batch_per_gpu = dict(batch_per_gpu)

    def __getitem__(self, key: str) -> float:
        return self._seconds[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._seconds)

    def __len__(self) -> int:
        return len(self._seconds)

    def find(self, config: str) -> str:
        """The key (bench config path) that ``config`` names; UsageError when none or several do."""
        if not isinstance(config, str) or not config.strip():
            raise UsageError(f"a config path or file name is needed, got {config!r}")
        known = list(self._seconds) + list(self.failed)
        matches = [k for k in known if _same_config(config, k)]
        if len(matches) > 1:
            raise UsageError(f"config {config} matches several configs of bench file {self.path}: "
                             f"{', '.join(matches)}; give its path")
        if not matches:
            raise UsageError(f"config {config} is not in bench file {self.path}; it holds: "
                             f"{', '.join(known) or '(none)'}")
        key = matches[0]
        if key in self.failed:
            raise UsageError(f"bench file {self.path} has no step time for {key}: its run failed "
                             f"({self.failed[key]})")
        return key

    def step_time(self, config: str) -> StepTime:
        """The :class:`StepTime` of ``config`` (matched as :meth:`find` does)."""
        key = self.find(config)
        detail = (f"bench file {self.path} on device {self.device} ({_STATISTIC_WORDS[self.statistic]}"
                  f"{', tiny sizes' if self.tiny else ''})")
        return StepTime(seconds=self._seconds[key], origin="measured", detail=detail,
                        batch_per_gpu=self._batch_per_gpu.get(key))


def _config_parts(path: str) -> List[str]:
    if path.startswith("zoo:"):
        path = path[len("zoo:"):]
    return [p for p in os.path.normpath(path).replace(os.sep, "/").split("/") if p not in ("", ".")]


def _same_config(query: str, key: str) -> bool:
    """Whether ``query`` names the bench config ``key``: one's path components end the other's, or
    ``query`` is the file name of ``key`` with or without ``.py``."""
    q, k = _config_parts(query), _config_parts(key)
    if not q or not k:
        return False
    if len(q) == 1:
        return q[0] in (k[-1], os.path.splitext(k[-1])[0])
    n = min(len(q), len(k))
    return q[-n:] == k[-n:]


def _device_name(device) -> str:
    if not isinstance(device, dict) or not device.get("type"):
        return "unknown"
    name = device.get("name") or "unknown"
    return name if device["type"] == "cuda" else f"CPU {name}"


def load_step_times(path: str, *, statistic: str = "default", allow_tiny: bool = False) -> StepTimes:
    """Read the JSON file of ``bench/bench_gpu_step.py``.

    Args:
        path: the file (``--output`` of the bench).
        statistic: ``"default"``: each config's default-arm median step time; ``"max"``: the largest median
            over the arms measured.
        allow_tiny: accept a file measured with ``--tiny`` (its times are not the recipes'; for tests).

    Returns:
        :class:`StepTimes`, a mapping ``{config path: seconds per step}`` with the file and device.
    """
    if statistic not in STATISTICS:
        raise UsageError(f"step time statistic {statistic!r}; accepted: {', '.join(STATISTICS)}")
    if not isinstance(path, str) or not path:
        raise UsageError(f"a step bench file path is needed, got {path!r}")
    if not os.path.isfile(path):
        raise UsageError(f"step bench file {path} does not exist (write it with bench/bench_gpu_step.py "
                         "--output PATH)")
    try:
        with open(path) as f:
            payload = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path} is not a step bench file: {str(e).splitlines()[0]}") from None
    if not isinstance(payload, dict) or payload.get("format") != STEP_BENCH_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise UsageError(f"{path} is not a step bench file: format {found!r}, expected {STEP_BENCH_FORMAT!r}")
    if payload.get("tiny") and not allow_tiny:
        raise UsageError(f"{path} was measured with --tiny: its step times are not the recipes'; measure at "
                         "full size on a GPU (bench/bench_gpu_step.py --output PATH)")
    configs = payload.get("configs")
    if not isinstance(configs, dict):
        raise UsageError(f"{path} is not a step bench file: 'configs' must map config paths to results")
    seconds, batches, failed = {}, {}, {}
    for key, entry in configs.items():
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: the entry of {key} is not an object")
        if entry.get("error"):
            failed[key] = str(entry["error"])
            continue
        seconds[key] = _config_seconds(path, key, entry, statistic)
        if isinstance(entry.get("batch_per_gpu"), int):
            batches[key] = entry["batch_per_gpu"]
    return StepTimes(path=path, device=_device_name(payload.get("device")), statistic=statistic, seconds=seconds,
                     batch_per_gpu=batches, failed=failed, tiny=bool(payload.get("tiny")))


def _config_seconds(path: str, key: str, entry: dict, statistic: str) -> float:
    arms = entry.get("arms")
    if not isinstance(arms, dict) or not arms:
        raise UsageError(f"{path}: {key} has no measured arm")
    values = {}
    for arm, result in arms.items():
        value = result.get("median_step_s") if isinstance(result, dict) else None
        values[arm] = _positive(value, f"{path}: {key} arms.{arm}.median_step_s")
    if statistic == "max":
        return max(values.values())
    if DEFAULT_ARM not in values:
        raise UsageError(f"{path}: {key} has no '{DEFAULT_ARM}' arm (arms: {', '.join(values)}); "
                         "use the statistic 'max'")
    return values[DEFAULT_ARM]


def resolve_step_time(config: str, *, step_time: Optional[float] = None, step_bench: Optional[str] = None,
                      statistic: str = "default") -> StepTime:
    """The step time of ``config`` for a plan: ``step_time`` (``--step-time``) when given, else the bench file
    ``step_bench`` (``--step-bench``) when given, else unknown. Both at once is an error."""
    if step_time is not None and step_bench is not None:
        raise UsageError("--step-time and --step-bench both given; pass one")
    if step_time is not None:
        return StepTime.given(step_time)
    if step_bench is not None:
        return load_step_times(step_bench, statistic=statistic).step_time(config)
    return StepTime.unknown()


# ---------------------------------------------------------------------------------------------
# Runs and their cost
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunCost:
    """One planned run.

    Attributes:
        stage: the training stage (``"pretrain"``, ``"detection"``, ...); the plan groups runs by it.
        name: the run, e.g. ``conditioned/seed0``.
        steps: optimizer steps of the run.
        processes: GPUs (training processes) of the run.
        step_seconds: seconds per step of the group; None when unknown.
        source: where ``step_seconds`` came from (:meth:`StepTime.describe`).
    """

    stage: str
    name: str
    steps: int
    processes: int
    step_seconds: Optional[float]
    source: str = ""

    def __post_init__(self):
        for attr in ("stage", "name"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"a run's {attr} must be a non-empty string, got {value!r}")
        _positive(self.steps, f"steps of run {self.name}", integer=True)
        _positive(self.processes, f"processes of run {self.name}", integer=True)
        if self.step_seconds is not None:
            _positive(self.step_seconds, f"step seconds of run {self.name}")
        if not self.source:
            source = (f"given: {self.step_seconds:g} s per step" if self.step_seconds is not None
                      else StepTime.unknown().describe())
            object.__setattr__(self, "source", source)

    @classmethod
    def with_step_time(cls, *, stage: str, name: str, steps: int, processes: int, step_time: StepTime) -> "RunCost":
        """A run whose step time (and its source) is ``step_time``."""
        return cls(stage=stage, name=name, steps=steps, processes=processes, step_seconds=step_time.seconds,
                   source=step_time.describe())


@dataclass(frozen=True)
class RunEstimate:
    """A run's wall time (seconds, evaluation overhead included) and GPU-hours; None when its step time is unknown."""

    run: RunCost
    wall_seconds: Optional[float]
    gpu_hours: Optional[float]


@dataclass(frozen=True)
class StageTotal:
    """Sums over runs (those with a known step time; ``unknown_runs`` counts the others)."""

    stage: str
    runs: int
    unknown_runs: int
    steps: int
    wall_seconds: float
    gpu_hours: float
    sources: Tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.unknown_runs == 0


@dataclass(frozen=True)
class CostTable:
    """Per-run estimates, per-stage subtotals (in the order stages first appear) and the total."""

    rows: Tuple[RunEstimate, ...]
    stages: Tuple[StageTotal, ...]
    total: StageTotal
    eval_overhead: float = 0.0

    def as_dict(self) -> dict:
        """Plain data (for a JSON plan file)."""
        def total(t: StageTotal) -> dict:
            return {"stage": t.stage, "runs": t.runs, "unknown_runs": t.unknown_runs, "steps": t.steps,
                    "wall_seconds": t.wall_seconds, "gpu_hours": t.gpu_hours, "sources": list(t.sources)}

        return {"eval_overhead": self.eval_overhead,
                "runs": [{"stage": r.run.stage, "name": r.run.name, "steps": r.run.steps,
                          "processes": r.run.processes, "step_seconds": r.run.step_seconds,
                          "source": r.run.source, "wall_seconds": r.wall_seconds, "gpu_hours": r.gpu_hours}
                         for r in self.rows],
                "stages": [total(s) for s in self.stages], "total": total(self.total)}


def _sum(stage: str, rows: Sequence[RunEstimate]) -> StageTotal:
    known = [r for r in rows if r.wall_seconds is not None]
    sources = tuple(dict.fromkeys(r.run.source for r in rows))
    return StageTotal(stage=stage, runs=len(rows), unknown_runs=len(rows) - len(known),
                      steps=sum(r.run.steps for r in rows), wall_seconds=sum(r.wall_seconds for r in known),
                      gpu_hours=sum(r.gpu_hours for r in known), sources=sources)


def estimate(runs: Sequence[RunCost], *, eval_overhead: float = 0.0) -> CostTable:
    """Wall time and GPU-hours of every run, per stage and in total.

    Args:
        runs: the planned runs (at least one).
        eval_overhead: evaluation time as a fraction of the training time (0.1: +10%); 0 leaves it out.

    Returns:
        :class:`CostTable`. A run: ``wall = steps x step_seconds x (1 + eval_overhead)``,
        ``GPU-hours = wall x processes / 3600``; runs without a step time are listed, not summed.
    """
    runs = list(runs)
    if not runs:
        raise UsageError("no run to estimate: the plan is empty")
    bad = [r for r in runs if not isinstance(r, RunCost)]
    if bad:
        raise UsageError(f"estimate() takes RunCost objects, got {type(bad[0]).__name__}")
    if (not isinstance(eval_overhead, (int, float)) or isinstance(eval_overhead, bool)
            or not math.isfinite(eval_overhead) or eval_overhead < 0):
        raise UsageError(f"the evaluation overhead must be a fraction >= 0 (0.1 = +10%), got {eval_overhead!r}")
    rows = []
    for run in runs:
        if run.step_seconds is None:
            rows.append(RunEstimate(run=run, wall_seconds=None, gpu_hours=None))
            continue
        wall = run.steps * run.step_seconds * (1.0 + eval_overhead)
        rows.append(RunEstimate(run=run, wall_seconds=wall, gpu_hours=wall * run.processes / 3600.0))
    stage_names = list(dict.fromkeys(r.stage for r in runs))
    stages = tuple(_sum(s, [r for r in rows if r.run.stage == s]) for s in stage_names)
    return CostTable(rows=tuple(rows), stages=stages, total=_sum("total", rows), eval_overhead=float(eval_overhead))


# ---------------------------------------------------------------------------------------------
# The plan table
# ---------------------------------------------------------------------------------------------
def format_duration(seconds: Optional[float]) -> str:
    """``h:mm`` rounded to the minute (``"151:05"``); ``"<0:01"`` under half a minute; ``"?"`` for None."""
    if seconds is None:
        return "?"
    if seconds < 0 or not math.isfinite(seconds):
        raise UsageError(f"a duration must be a finite number of seconds >= 0, got {seconds!r}")
    if 0 < seconds < 30:
        return "<0:01"
    hours, minutes = divmod(int(round(seconds / 60.0)), 60)
    return f"{hours}:{minutes:02d}"


def _gpu_hours(value: Optional[float]) -> str:
    if value is None:
        return "?"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _subtotal_cells(t: StageTotal) -> Tuple[str, str]:
    """Wall and GPU-hours cells of a sum: ``>= x`` when some runs have no step time, ``?`` when none has."""
    if t.unknown_runs == t.runs:
        return "?", "?"
    prefix = "" if t.complete else ">= "
    return prefix + format_duration(t.wall_seconds), prefix + _gpu_hours(t.gpu_hours)


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int]) -> List[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def format_cost(table: CostTable) -> str:
    """The plan as text: one row per run (run, stage, steps, GPUs, wall time h:mm, GPU-hours), a subtotal per
    stage, the total; then where each stage's step time came from and the evaluation overhead."""
    if not isinstance(table, CostTable):
        raise UsageError(f"format_cost() takes the CostTable of estimate(), got {type(table).__name__}")
    body = []
    for stage in table.stages:
        for r in (r for r in table.rows if r.run.stage == stage.stage):
            body.append([r.run.name, r.run.stage, str(r.run.steps), str(r.run.processes),
                         format_duration(r.wall_seconds), _gpu_hours(r.gpu_hours)])
        wall, hours = _subtotal_cells(stage)
        body.append([f"subtotal {stage.stage} ({stage.runs} run{'s' if stage.runs != 1 else ''})", stage.stage,
                     str(stage.steps), "", wall, hours])
    wall, hours = _subtotal_cells(table.total)
    body.append([f"total ({table.total.runs} run{'s' if table.total.runs != 1 else ''})", "",
                 str(table.total.steps), "", wall, hours])
    lines = _text_table(["run", "stage", "steps", "GPUs", "wall h:mm", "GPU-hours"], body, right=(2, 3, 4, 5))
    lines.append("wall time: steps x step time x (1 + evaluation overhead); subtotals and total: the runs one after "
                 "another. GPU-hours: wall time x GPUs.")
    for stage in table.stages:
        for source in stage.sources:
            lines.append(f"step time ({stage.stage}): {source}")
    if table.eval_overhead > 0:
        lines.append(f"evaluation overhead: +{table.eval_overhead * 100:g}% of the training time "
                     f"(eval_overhead={table.eval_overhead:g})")
    else:
        lines.append("evaluation overhead: not included (eval_overhead=0)")
    if table.total.unknown_runs:
        lines.append(f"{table.total.unknown_runs} run(s) without a step time are not summed (>=): pass --step-time "
                     "or --step-bench")
    return "\n".join(lines)
