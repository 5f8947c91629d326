"""Grouping runs into (stage, arm, lr scale) and summarizing each group over its seeds."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from condinit_det.records.failures import describe_failure
from condinit_det.stage import DETECTION, StageDescriptor, known_stages

from .contrasts import resolve_contrasts
from .curves import Curve, first_reach, kappa_curve, kappa_heads_curve, seed_mean, speedup
from .discovery import ExpectedRun, Missing, Run
from .paired import PairedStat, paired_statistics
from .statistics import mean_std

__all__ = ["ARM_ORDER", "LOSS", "ArmSummary", "ArmsReport", "StageReport", "summarize_runs"]

# Report order; "scale_matched" is the norm-matched control (the default init rescaled to the conditioned norms).
ARM_ORDER = ("default", "mimetic", "conditioned", "scale_matched")
LOSS = "loss"  # convergence key of the training loss


def arm_sort_key(arm: str):
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


@dataclass
class ArmSummary:
    """One arm at one learning-rate scale in one stage, aggregated over its seeds."""

    stage: StageDescriptor
    arm: str
    lr_scale: float
    runs: List[Run]
    final: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # table header -> (mean, std)
    final_x: List[int] = field(default_factory=list)
    curves: Dict[str, Curve] = field(default_factory=dict)  # metric key -> seed-mean curve
    loss: Optional[Curve] = None  # seed mean of the smoothed training loss (None: not logged)
    reach: Dict[str, Optional[int]] = field(default_factory=dict)  # convergence key -> first x
    speedup: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def seeds(self) -> List[Optional[int]]:
        return [r.seed for r in self.runs]

    @property
    def final_iterations(self) -> List[int]:
        """Final x of every run (iterations for detection, epochs for classification)."""
        return self.final_x

    def value(self, header: str) -> float:
        return self.final[header][0]


@dataclass
class StageReport:
    """Every group of one stage, the main comparison at one lr scale, and what is missing."""

    stage: StageDescriptor
    groups: List[ArmSummary]
    scale: float  # learning-rate scale of the main comparison (1 unless there is no such run)
    target: Dict[str, Tuple[Optional[int], float]] = field(default_factory=dict)  # default's final (x, value)
    missing: List[Missing] = field(default_factory=list)
    kappa: Dict[str, tuple] = field(default_factory=dict)
    kappa_heads: Dict[str, tuple] = field(default_factory=dict)  # arm -> (iterations, median over heads)
    stats: List[PairedStat] = field(default_factory=list)
    has_plan: bool = False
    contrasts: List[Tuple[str, str]] = field(default_factory=list)  # (A, B) compared as A minus B
    contrast_notes: List[str] = field(default_factory=list)  # requested contrasts not made here, and why

    @property
    def family(self) -> List[PairedStat]:
        """The comparisons whose verdicts share the stage's Holm–Bonferroni family (with default, then the
        contrasts)."""
        return [s for s in self.stats if s.in_family]

    @property
    def seeds_per_arm(self) -> Dict[str, int]:
        """Arm -> number of seeds (main comparison)."""
        return {g.arm: len(g.runs) for g in self.arms}

    @property
    def arms(self) -> List[ArmSummary]:
        """The groups of the main comparison (one per arm)."""
        return [g for g in self.groups if g.lr_scale == self.scale]

    @property
    def scales(self) -> List[float]:
        return sorted({g.lr_scale for g in self.groups} | {m.lr_scale for m in self.failed})

    @property
    def failed(self) -> List[Missing]:
        """Runs that diverged or failed (never averaged; shown where they would have been)."""
        return [m for m in self.missing if m.failure is not None]

    def failed_at(self, arm: str, lr_scale: float) -> List[Missing]:
        return [m for m in self.failed if m.arm == arm and m.lr_scale == lr_scale]

    def arm(self, name: str, lr_scale: Optional[float] = None) -> ArmSummary:
        scale = self.scale if lr_scale is None else float(lr_scale)
        for g in self.groups:
            if g.arm == name and g.lr_scale == scale:
                return g
        raise KeyError(f"No {self.stage.name} runs of arm {name!r} at lr scale {scale:g}; "
                       f"present: {[(g.arm, g.lr_scale) for g in self.groups]}")

    def best_scale(self, arm: str) -> Optional[float]:
        """The arm's lr scale with the highest seed-mean first headline metric."""
        header = self.stage.headline[0].header
        cands = [(g.value(header), g.lr_scale) for g in self.groups if g.arm == arm and math.isfinite(g.value(header))]
        return max(cands)[1] if cands else None


@dataclass
class ArmsReport:
    """The comparison of every stage found."""

    stages: List[StageReport]
    runs: List[Run]
    missing: List[Missing]  # every missing or unfinished run (also listed per stage when known)
    bootstrap: int = 1000
    seed: int = 0
    delta: Optional[object] = None  # the planning difference asked for (None: per-metric defaults)

    def stage(self, name: str) -> StageReport:
        for s in self.stages:
            if s.stage.name == name:
                return s
        raise KeyError(f"No {name} runs; stages present: {[s.stage.name for s in self.stages]}")

    @property
    def primary(self) -> Optional[StageReport]:
        """Detection when present (the stage the paper's tables end with), else the first stage."""
        names = [s.stage.name for s in self.stages]
        if DETECTION.name in names:
            return self.stage(DETECTION.name)
        return self.stages[0] if self.stages else None

    @property
    def arms(self) -> List[ArmSummary]:
        return self.primary.arms if self.primary else []

    def arm(self, name: str, stage: Optional[str] = None) -> ArmSummary:
        """An arm's summary in the main comparison of ``stage`` (default: :attr:`primary`)."""
        s = self.stage(stage) if stage else self.primary
        if s is None:
            raise KeyError(f"No runs of arm {name!r}")
        return s.arm(name)


def _summarize_group(stage: StageDescriptor, arm: str, scale: float, runs: List[Run]) -> ArmSummary:
    runs = sorted(runs, key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.path))
    seeds = [r.seed for r in runs]
    dup = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
    if dup:
        paths = [r.path for r in runs if r.seed in dup]
        raise ValueError(f"Arm {arm!r} ({stage.name}, lr scale {scale:g}) has several runs with seed {dup}: {paths}")
    g = ArmSummary(stage=stage, arm=arm, lr_scale=scale, runs=runs)
    g.final_x = [r.final_x for r in runs]
    for m in stage.table:
        g.final[m.header] = mean_std([m.value(r.final) for r in runs])
    for m, _ in stage.plots:
        g.curves[m.key] = seed_mean([r.curve(m) for r in runs])
    losses = [r.loss() for r in runs]
    if all(len(its) for its, _, _ in losses):
        g.loss = seed_mean([(its, sm) for its, _, sm in losses], interpolate=True)
    return g


def _convergence(groups: List[ArmSummary], stage: StageDescriptor) -> Dict[str, Tuple[Optional[int], float]]:
    """Fill reach / speed-up of every group against the default arm's final values; returns the targets."""
    default = next((g for g in groups if g.arm == "default"), None)
    if default is None:
        return {}
    target = {m.key: default.curves[m.key].final for m in stage.headline}
    target[LOSS] = default.loss.final if default.loss is not None else (None, float("nan"))
    for g in groups:
        for m in stage.headline:
            c = g.curves[m.key]
            g.reach[m.key] = first_reach(c.x, c.mean, target[m.key][1])
            g.speedup[m.key] = speedup(g.reach[m.key], target[m.key][0])
        if g.loss is not None:
            g.reach[LOSS] = first_reach(g.loss.x, g.loss.mean, target[LOSS][1], lower_is_better=True)
            g.speedup[LOSS] = speedup(g.reach[LOSS], target[LOSS][0])
        else:
            g.reach[LOSS] = g.speedup[LOSS] = None
    return target


def _main_scale(groups: List[ArmSummary]) -> float:
    """1 when any group has it; else the scale run by the most arms (then the closest to 1, then the smaller)."""
    scales = {g.lr_scale for g in groups}
    if 1.0 in scales:
        return 1.0
    return max(scales, key=lambda s: (sum(g.lr_scale == s for g in groups), -abs(math.log(s)), -s))


def _collect_missing(expected: Sequence[ExpectedRun], runs: List[Run]) -> Tuple[List[Missing], set]:
    """
    Planned runs without results, runs without any evaluation, and runs whose last evaluation
    comes before the last one of their schedule (runs of one stage under one root). Also returns
    the names of the stages that have a plan.
    """
    by_path = {os.path.realpath(r.path): r for r in runs}
    out, planned_stage = [], {}
    for e in expected:
        planned_stage[os.path.realpath(e.path)] = e.stage
        if os.path.realpath(e.path) not in by_path:
            out.append(Missing(e.spec.arm, e.spec.seed, e.spec.lr_scale, e.path, "no results (failed or not run)",
                               e.stage))
    end: Dict[Tuple[str, str], int] = {}
    for r in runs:
        if r.final_x is not None and r.failure is None:
            key = (r.root, r.stage.name)
            end[key] = max(end.get(key, r.final_x), r.final_x)
    for r in runs:
        failure = r.failure
        if failure is not None:
            stage = r.stage or planned_stage.get(os.path.realpath(r.path))
            out.append(Missing(r.arm, r.seed, r.lr_scale, r.path, describe_failure(failure), stage, r, failure))
        elif r.stage is None or not r.evaluations():
            out.append(Missing(r.arm, r.seed, r.lr_scale, r.path, "no evaluation recorded (unfinished or failed)",
                               r.stage or planned_stage.get(os.path.realpath(r.path))))
        elif r.final_x < end.get((r.root, r.stage.name), r.final_x):
            out.append(Missing(r.arm, r.seed, r.lr_scale, r.path,
                               f"unfinished (last evaluation at {r.stage.unit} {r.final_x}; "
                               f"other runs reach {end[(r.root, r.stage.name)]})", r.stage))
    return out, {s.name for s in planned_stage.values()}


def report_stages(present) -> List[StageDescriptor]:
    """The stages among ``present`` (None left out), in report order: the registered ones first (pretraining,
    then detection: the order of the paper's protocol), then any other by name."""
    present = {s.name: s for s in present if s is not None}
    order = [s.name for s in known_stages()]
    return [present[n] for n in sorted(present, key=lambda n: (order.index(n) if n in order else len(order), n))]


def summarize_runs(runs: Sequence[Run], expected: Sequence[ExpectedRun] = (), *, bootstrap: int = 1000,
                   seed: int = 0, delta=None, std=None, contrasts: Sequence[Tuple[str, str]] = ()) -> ArmsReport:
    """
    Group finished runs by (stage, arm, lr scale), aggregate them over seeds, compute the
    convergence metric and the paired statistics, and collect missing or unfinished runs.
    ``bootstrap`` / ``seed``: image resamples and generator seed; ``delta`` / ``std``: the difference the
    seed plans are for and the std of paired differences they assume
    (:func:`condinit_det.report.paired.paired_statistics`); ``contrasts``: (A, B) pairs of arms other than
    default compared as A minus B, beside the default contrasts
    (:func:`condinit_det.report.contrasts.resolve_contrasts`; ValueError for a pair that is not two different
    arms other than default).
    """
    runs = list(runs)
    if not runs:
        raise ValueError("No runs to compare.")
    contrasts = list(contrasts)
    resolve_contrasts((), contrasts)  # a malformed pair fails before any work
    missing, planned = _collect_missing(expected, runs)
    bad = {os.path.realpath(m.path) for m in missing}
    finished = [r for r in runs if r.final_x is not None and os.path.realpath(r.path) not in bad]

    stages = []
    for stage in report_stages([r.stage for r in runs] + [m.stage for m in missing]):
        stage_runs = [r for r in finished if r.stage == stage]
        stage_missing = [m for m in missing if m.stage == stage]
        if not stage_runs and not stage_missing:
            continue
        by_group: Dict[Tuple[str, float], List[Run]] = {}
        for r in stage_runs:
            by_group.setdefault((r.arm, r.lr_scale), []).append(r)
        groups = [_summarize_group(stage, a, s, rs) for (a, s), rs in
                  sorted(by_group.items(), key=lambda kv: (arm_sort_key(kv[0][0]), kv[0][1]))]
        failed_scales = {m.lr_scale for m in stage_missing if m.failure is not None}
        scale = _main_scale(groups) if groups else (1.0 if 1.0 in failed_scales or not failed_scales
                                                    else min(failed_scales))
        sr = StageReport(stage=stage, groups=groups, scale=scale, missing=stage_missing,
                         has_plan=stage.name in planned)
        sr.target = _convergence(sr.arms, stage)
        kappa = {g.arm: kappa_curve([r.records for r in g.runs], stage.unit) for g in sr.arms}
        sr.kappa = {a: k for a, k in kappa.items() if len(k[0])}
        heads = {g.arm: kappa_heads_curve([r.records for r in g.runs], stage.unit) for g in sr.arms}
        sr.kappa_heads = {a: k for a, k in heads.items() if len(k[0])}
        sr.contrasts, sr.contrast_notes = resolve_contrasts([g.arm for g in sr.arms], contrasts)
        sr.stats = paired_statistics(sr, bootstrap=bootstrap, seed=seed, delta=delta, std=std,
                                     contrasts=sr.contrasts)
        stages.append(sr)
    if not any(s.groups or s.failed for s in stages):
        raise ValueError("No finished runs to compare: " + "; ".join(m.describe() for m in missing))
    return ArmsReport(stages=stages, runs=runs, missing=missing, bootstrap=bootstrap, seed=seed, delta=delta)
