"""Finding runs and the runs an experiment plan expects.

A *run directory* holds ``results.json``; its arm, training seed and learning-rate scale come
from the records (``"arm"``, ``"seed"``, ``"lr_scale"``; absent scale = 1) and otherwise from
``condinit_arm_report.json``. Its stage is its plan's (``experiment.json``, :mod:`condinit_det.records.layout`),
else the one its records name (``"stage"``). An *experiment directory* holds run directories at any depth and
may hold the plan: a planned run without results is reported as missing, never averaged away.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from condinit_det.records.identity import ARM_REPORT_FILENAME
from condinit_det.records.layout import Plan, RunSpec, find_plans, is_set_aside, read_plan
from condinit_det.records.results import FAILED_KIND, RESULTS_FILENAME, ResultsFile
from condinit_det.stage import Metric, StageDescriptor, stage_of

from .loss import METRICS_FILENAME, read_training_loss, smooth

__all__ = ["ExpectedRun", "Missing", "Run", "find_expected", "find_runs", "load_run", "plan_stage", "run_name"]


def run_name(arm: str, seed: Optional[int], lr_scale: float = 1.0) -> str:
    """``"mimetic seed 2"``, ``"default seed 0, lr scale 2"``."""
    name = f"{arm} seed {'?' if seed is None else seed}"
    return name if lr_scale == 1.0 else f"{name}, lr scale {lr_scale:g}"


@dataclass
class Run:
    """One training run: its directory, identity and results records."""

    path: str
    arm: str
    seed: Optional[int]
    lr_scale: float
    records: List[dict]
    stage: Optional[StageDescriptor]  # None: neither a plan nor a record names it
    root: str = ""  # runs under one root share a schedule (an experiment or an input directory)
    _loss: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return run_name(self.arm, self.seed, self.lr_scale)

    def evaluations(self) -> List[dict]:
        """The evaluations made while training (the stage's ``eval_kind``), in increasing x."""
        if self.stage is None:
            return []
        recs = [r for r in self.records if r["kind"] == self.stage.eval_kind and r.get(self.stage.unit) is not None]
        return sorted(recs, key=lambda r: r[self.stage.unit])

    @property
    def final(self) -> Optional[dict]:
        evals = self.evaluations()
        return evals[-1] if evals else None

    @property
    def failure(self) -> Optional[dict]:
        """The run's ``"failed"`` record (it diverged or raised), or None."""
        failed = [r for r in self.records if r["kind"] == FAILED_KIND]
        return failed[-1] if failed else None

    @property
    def final_x(self) -> Optional[int]:
        final = self.final
        return None if final is None else int(final[self.stage.unit])

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
    """A run listed in an experiment plan."""

    spec: RunSpec
    path: str
    base: str
    stage: StageDescriptor


@dataclass
class Missing:
    """A planned run without a usable result, or a run that did not finish."""

    arm: str
    seed: Optional[int]
    lr_scale: float
    path: str
    reason: str
    stage: Optional[StageDescriptor] = None
    run: Optional[Run] = None  # the run's records when it failed (its curves stop where it stopped)
    failure: Optional[dict] = None  # its "failed" record

    def describe(self) -> str:
        return f"{run_name(self.arm, self.seed, self.lr_scale)}: {self.reason}"


def _read_json(path: str):
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None


def plan_stage(plan: Plan) -> StageDescriptor:
    """The stage of a plan's runs; raises ValueError when the plan neither describes nor names a known stage."""
    stage = stage_of(plan.stage, plan.stage_description)
    if stage is None:
        raise ValueError(f"{plan.base}/experiment.json: stage {plan.stage!r} is not described in the plan and no "
                         "stage of that name is known")
    return stage


def _stage_in_records(records: List[dict]) -> Optional[StageDescriptor]:
    names = [r["stage"] for r in records if r.get("stage")]
    return stage_of(names[-1]) if names else None


def load_run(path: str, stage: Optional[StageDescriptor] = None) -> Run:
    """Read one run directory; ``stage``: its plan's stage (default: the one its records name). Raises ValueError
    when its files are unreadable or its arm unknown."""
    records = ResultsFile(path).records()
    arm_report_path = os.path.join(path, ARM_REPORT_FILENAME)
    arm_report = _read_json(arm_report_path) if os.path.isfile(arm_report_path) else {}
    ident = arm_report.get("run") if isinstance(arm_report.get("run"), dict) else None
    arm = (ident or {}).get("arm", arm_report.get("arm"))
    # Without a "run" section (older arm reports) the top-level seed is the run's seed.
    seed = ident.get("seed") if ident is not None else arm_report.get("seed")
    lr_scale = (ident or {}).get("lr_scale")
    stage = stage or _stage_in_records(records)
    # The evaluation records' training seed identifies the repetition (data order and every
    # non-attention weight); they are read last so that they win.
    ordered = [r for r in records if stage is None or r["kind"] != stage.eval_kind]
    ordered += [r for r in records if stage is not None and r["kind"] == stage.eval_kind]
    for r in ordered:
        arm = r["arm"] if r.get("arm") is not None else arm
        seed = r["seed"] if r.get("seed") is not None else seed
        lr_scale = r["lr_scale"] if r.get("lr_scale") is not None else lr_scale
    if not isinstance(arm, str):
        raise ValueError(
            f"Cannot tell the arm of run {path}: neither {ARM_REPORT_FILENAME} nor the records "
            f"of {RESULTS_FILENAME} name it."
        )
    return Run(path=path, arm=arm, seed=None if seed is None else int(seed),
               lr_scale=1.0 if lr_scale is None else float(lr_scale), records=records, stage=stage)


def _is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RESULTS_FILENAME))


def _within(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def find_expected(paths: Sequence[str]) -> List[ExpectedRun]:
    """The planned runs whose directories lie under ``paths`` (from every plan found there)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out, seen = [], set()
    for p in map(os.fspath, paths):
        for base in find_plans(p):
            plan = read_plan(base)
            stage = plan_stage(plan)
            for spec in plan.runs:
                run_path = spec.path(base)
                real = os.path.realpath(run_path)
                if _within(run_path, p) and real not in seen:
                    seen.add(real)
                    out.append(ExpectedRun(spec, run_path, base, stage))
    return out


def find_runs(paths: Sequence[str]) -> List[Run]:
    """
    Runs found under ``paths``: each path is a run directory or a directory searched
    recursively for run directories. Raises ValueError for a path without any run.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs, seen = [], set()
    for p in map(os.fspath, paths):
        if not os.path.isdir(p):
            raise ValueError(f"{p} is not a directory; expected a run or experiment directory.")
        bases = find_plans(p)
        stages = {base: plan_stage(read_plan(base)) for base in bases}
        found = []
        for root, dirs, _files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if not is_set_aside(d))
            if _is_run_dir(root):
                found.append(root)
        if not found:
            raise ValueError(
                f"No runs under {p}: a run directory contains {RESULTS_FILENAME} "
                f"(written by the training tools); an experiment directory contains run directories."
            )
        for path in found:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            owners = [b for b in bases if _within(path, b)]
            owner = max(owners, key=len) if owners else None
            run = load_run(path, stages[owner] if owner else None)
            run.root = os.path.realpath(owner or p)
            runs.append(run)
    return runs
