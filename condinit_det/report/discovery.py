"""Finding runs (directories with ``results.json``), the plans above them (``experiment.json``) and the runs they
expect; reading a run: its arm, seed and lr scale from its records (else ``condinit_arm_report.json``), its stage
from its plan (else its records), its training loss from ``metrics.json``. A file that cannot be read is skipped and
named, never fatal to the other runs."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from condinit_det.records.environment import ENVIRONMENT_KIND
from condinit_det.records.identity import ARM_REPORT_FILENAME, read_arm_report
from condinit_det.records.layout import PLAN_FILENAME, Plan, RunSpec, find_plans, is_set_aside, read_plan
from condinit_det.records.results import FAILED_KIND, METRICS_FILENAME, RESULTS_FILENAME, ResultsFile
from condinit_det.stage import Metric, StageDescriptor, stage_of

# Logged points in the trailing median, as detectron2's HistoryBuffer.median(20).
SMOOTHING_WINDOW = 20


def _parse(line: str) -> Optional[dict]:
    """The object on one line; a line a killed writer garbled (cut, then a new line appended) yields the new one."""
    start = 0
    while start != -1:
        try:
            obj = json.loads(line[start:])
            return obj if isinstance(obj, dict) else None
        except json.JSONDecodeError:
            start = line.find("{", start + 1)
    return None


def read_training_loss(path: str, key: str = "total_loss") -> Tuple[np.ndarray, np.ndarray]:
    """(iterations [N], loss [N]) of a ``metrics.json`` (a run directory or the file), increasing in iteration; empty
    when nothing was logged. A resumed run's lines, appended after those of the killed one, win."""
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    points: List[Tuple[int, float]] = []
    with open(path, errors="replace") as f:
        for line in filter(None, map(str.strip, f)):
            obj = _parse(line) or {}
            try:
                it, value = int(obj["iteration"]), float(obj[key])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                while points and points[-1][0] >= it:  # a resumed run: its points replace the old tail
                    points.pop()
                points.append((it, value))
    return np.asarray([p[0] for p in points], dtype=np.int64), np.asarray([p[1] for p in points], dtype=np.float64)


def smooth(values: np.ndarray, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """Trailing median over the last ``window`` points (fewer at the start)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.empty_like(v)
    for i in range(min(window - 1, v.size)):
        out[i] = np.median(v[: i + 1])
    if v.size >= window:
        out[window - 1 :] = np.median(np.lib.stride_tricks.sliding_window_view(v, window), axis=1)
    return out


def run_name(arm: str, seed: Optional[int], lr_scale: float = 1.0) -> str:
    """``"mimetic seed 2"``, ``"default seed 0, lr scale 2"``."""
    name = f"{arm} seed {'?' if seed is None else seed}"
    return name if lr_scale == 1.0 else f"{name}, lr scale {lr_scale:g}"


@dataclass
class Run:
    """One training run: its directory, identity, records and the plan it belongs to."""

    path: str
    arm: str
    seed: Optional[int]
    lr_scale: float
    records: List[dict]
    stage: Optional[StageDescriptor]  # None: neither a plan nor a record names it
    root: str = ""  # runs under one root share a schedule (an experiment or an input directory)
    plan: Optional[Plan] = None
    options: Optional[dict] = None  # the arm's resolved options, as its arm report recorded them
    _loss: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return run_name(self.arm, self.seed, self.lr_scale)

    def evaluations(self) -> List[dict]:
        """The evaluations made while training (the stage's ``eval_kind``), in increasing x."""
        if self.stage is None:
            return []
        unit = self.stage.unit
        return sorted(
            (r for r in self.records if r["kind"] == self.stage.eval_kind and r.get(unit) is not None),
            key=lambda r: r[unit],
        )

    @property
    def final(self) -> Optional[dict]:
        return (self.evaluations() or [None])[-1]

    @property
    def final_x(self) -> Optional[int]:
        return None if self.final is None else int(self.final[self.stage.unit])

    @property
    def failure(self) -> Optional[dict]:
        """The run's last ``"failed"`` record (it diverged or raised), or None."""
        return next((r for r in reversed(self.records) if r["kind"] == FAILED_KIND), None)

    @property
    def environments(self) -> List[dict]:
        """The ``"environment"`` records (one per start; none in runs written before they were recorded)."""
        return [r for r in self.records if r["kind"] == ENVIRONMENT_KIND]

    def curve(self, metric: Metric) -> Tuple[np.ndarray, np.ndarray]:
        """(x [N], values [N]) of one metric over the evaluations; NaN where missing."""
        evals = self.evaluations()
        x = np.asarray([r[self.stage.unit] for r in evals], dtype=np.int64)
        return x, np.asarray([metric.value(r) for r in evals], dtype=np.float64)

    def loss(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(iterations, logged total_loss, smoothed) from ``metrics.json``; empty without one."""
        if self._loss is None:
            path = os.path.join(self.path, METRICS_FILENAME)
            its, raw = read_training_loss(path) if os.path.isfile(path) else (np.zeros(0, dtype=np.int64), np.zeros(0))
            self._loss = (its, raw, smooth(raw))
        return self._loss


@dataclass(frozen=True)
class ExpectedRun:
    """A run an experiment plan lists."""

    spec: RunSpec
    path: str
    plan: Plan
    stage: StageDescriptor


@dataclass
class Found:
    """The runs under the input paths, the runs their plans expect, and every file skipped with what is wrong."""

    runs: List[Run]
    expected: List[ExpectedRun]
    skipped: List[str]  # "<path>: <what is wrong>"


def load_run(path: str, stage: Optional[StageDescriptor] = None) -> Run:
    """One run directory; ``stage``: its plan's (default: its records'). Raises ValueError: unreadable, arm unknown."""
    records = ResultsFile(path).records()
    arm_report = read_arm_report(path) or {}
    # the run's identity; older reports: the arm and seed at the top level
    ident = arm_report["run"] if isinstance(arm_report.get("run"), dict) else {"seed": arm_report.get("seed")}
    arm, seed, lr_scale = ident.get("arm", arm_report.get("arm")), ident.get("seed"), ident.get("lr_scale")
    stage = stage or next((stage_of(r["stage"]) for r in reversed(records) if r.get("stage")), None)
    # The evaluation records' training seed identifies the repetition: they are read last, so that they win.
    for r in sorted(records, key=lambda r: stage is not None and r["kind"] == stage.eval_kind):
        arm = r["arm"] if r.get("arm") is not None else arm
        seed = r["seed"] if r.get("seed") is not None else seed
        lr_scale = r["lr_scale"] if r.get("lr_scale") is not None else lr_scale
    if not isinstance(arm, str):
        raise ValueError(
            f"cannot tell its arm: neither {ARM_REPORT_FILENAME} nor the records of {RESULTS_FILENAME} name it"
        )
    return Run(
        path=path,
        arm=arm,
        seed=None if seed is None else int(seed),
        lr_scale=1.0 if lr_scale is None else float(lr_scale),
        records=records,
        stage=stage,
        options=ident.get("options"),
    )


def _within(path: str, root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)


def _problem(path: str, error: Exception) -> str:
    """``"<path>: <what is wrong>"`` in one line."""
    text = " ".join(str(error).split())
    return text if text.startswith(path) else f"{path}: {text}"


def _plans(path: str, skipped: List[str]) -> Dict[str, Tuple[Plan, StageDescriptor]]:
    """Plan directory -> (plan, its stage) of every readable plan at or above ``path``'s runs."""
    out = {}
    for base in find_plans(path):
        try:
            plan = read_plan(base)
            stage = stage_of(plan.stage, plan.stage_description)
            if stage is None:
                raise ValueError(
                    f"stage {plan.stage!r} is not described in the plan and no stage of that name is known"
                )
            out[base] = (plan, stage)
        except ValueError as e:
            skipped.append(_problem(os.path.join(base, PLAN_FILENAME), e))
    return out


def find_runs(paths: Sequence[str]) -> Found:
    """Runs under ``paths`` (run directories, or directories searched recursively for them) and the runs their plans
    expect. Raises ValueError for a path that is not a directory or holds no run."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs, expected, skipped, seen = [], {}, [], set()  # expected: by real path, each run once
    for p in map(os.fspath, paths):
        if not os.path.isdir(p):
            raise ValueError(f"{p} is not a directory; expected a run or experiment directory.")
        plans = _plans(p, skipped)
        for base, (plan, stage) in plans.items():
            for spec in (spec for spec in plan.runs if _within(spec.path(base), p)):
                expected.setdefault(os.path.realpath(spec.path(base)), ExpectedRun(spec, spec.path(base), plan, stage))
        dirs = []
        for root, subdirs, files in os.walk(p):
            subdirs[:] = sorted(d for d in subdirs if not is_set_aside(d))
            if RESULTS_FILENAME in files:
                dirs.append(root)
        if not dirs:
            raise ValueError(
                f"No runs under {p}: a run directory contains {RESULTS_FILENAME} (written by the "
                "training tools); an experiment directory contains run directories."
            )
        for path in dirs:
            if os.path.realpath(path) in seen:
                continue
            seen.add(os.path.realpath(path))
            owner = max((b for b in plans if _within(path, b)), key=len, default=None)
            plan, stage = plans.get(owner, (None, None))
            try:
                runs.append(load_run(path, stage))
            except ValueError as e:
                skipped.append(_problem(path, e))
                continue
            runs[-1].root, runs[-1].plan = os.path.realpath(owner or p), plan
    return Found(runs, list(expected.values()), skipped)
