"""Grouping runs into sections (stage and setup) and arms (arm and lr scale), each summarized over its seeds (seed-mean
curves, κ over sites). Runs pool only when their setups match (the plan's ``setup`` and ``dataset``); runs whose plan
recorded none (older plans, or no plan) pool with the one setup of their stage."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from condinit_det.records.environment import ENVIRONMENT_FIELDS
from condinit_det.records.failures import describe_failure
from condinit_det.records.layout import Plan
from condinit_det.stage import StageDescriptor, known_stages

from .discovery import ExpectedRun, Run, run_name
from .factorial import CELLS, EFFECTS, FACTORIAL, design_problem
from .paired import METRIC, Comparison, compare_stage, resolve_contrasts
from .statistics import first_reach, mean_std

# Report order; then the conditioned arm's controls: "scale_matched" (the default init rescaled to the conditioned
# norms) and "structured" (the conditioned blocks rescaled to the default init's norms).
ARM_ORDER = ("default", "mimetic", "conditioned", "scale_matched", "structured")
LOSS = "loss"  # convergence key of the training loss


def arm_sort_key(arm: str):
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


class Curve(NamedTuple):
    """A seed-averaged curve: x [N], mean [N], sample std [N] (0 for one seed)."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @property
    def final(self) -> Tuple[Optional[int], float]:
        return (int(self.x[-1]), float(self.mean[-1])) if len(self.x) else (None, float("nan"))


def seed_mean(curves: Sequence[Tuple[np.ndarray, np.ndarray]], interpolate: bool = False) -> Curve:
    """Mean ± std over seeds at the x every seed has. ``interpolate`` (the training loss, logged at possibly different
    iterations): seeds without two common points are interpolated onto the first seed's x inside the common range."""
    curves = [(np.asarray(x), np.asarray(y, dtype=np.float64)) for x, y in curves]
    if not curves or any(len(x) == 0 for x, _ in curves):
        empty = np.zeros(0)
        return Curve(np.zeros(0, dtype=np.int64), empty, empty)
    common = np.asarray(sorted(set.intersection(*[set(x.tolist()) for x, _ in curves])), dtype=np.int64)
    if interpolate and len(common) < 2 and len(curves) > 1:
        lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
        grid = curves[0][0][(curves[0][0] >= lo) & (curves[0][0] <= hi)]
        vals = np.stack([np.interp(grid, x, y) for x, y in curves])
        common = grid.astype(np.int64)
    else:
        vals = np.stack([y[np.searchsorted(x, common)] for x, y in curves])
    std = vals.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(common))
    return Curve(common, vals.mean(axis=0), std)


def kappa_curve(records_per_run: Sequence[List[dict]], unit: str = "iteration"):
    """(x, median, min, max) of κ over sites and seeds per ``unit`` (the x axis), from the "conditioning" records."""
    by_x: Dict[int, List[float]] = {}
    for r in (r for records in records_per_run for r in records):
        k = float(r["kappa"]) if r["kind"] == "conditioning" and r.get("kappa") is not None else math.nan
        if math.isfinite(k) and k > 0:
            by_x.setdefault(r[unit], []).append(k)
    xs = np.asarray(sorted(by_x), dtype=np.int64)
    return (xs, *(np.asarray([reduce(by_x[x]) for x in xs]) for reduce in (np.median, np.min, np.max)))


@dataclass
class ArmSummary:
    """One arm at one learning-rate scale in one section, aggregated over its seeds."""

    arm: str
    lr_scale: float
    runs: List[Run]
    final: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # table header -> (mean, std)
    curves: Dict[str, Curve] = field(default_factory=dict)  # metric key -> seed-mean curve
    loss: Optional[Curve] = None  # seed mean of the smoothed training loss (None: not logged)
    reach: Dict[str, Optional[int]] = field(default_factory=dict)  # convergence key -> first x at default's final
    speedup: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def seeds(self) -> List[Optional[int]]:
        return [r.seed for r in self.runs]

    @property
    def final_iterations(self) -> List[int]:
        """The final x of every run (iterations or epochs)."""
        return [r.final_x for r in self.runs]

    def value(self, header: str) -> float:
        return self.final[header][0]


@dataclass
class Missing:
    """A planned run without a usable result, or a run that did not finish (``run``: its records when it failed)."""

    arm: str
    seed: Optional[int]
    lr_scale: float
    path: str
    reason: str
    stage: Optional[StageDescriptor] = None
    run: Optional[Run] = None
    plan: Optional[Plan] = None

    @property
    def failure(self) -> Optional[dict]:
        """The failed run's "failed" record (its curves stop where it stopped)."""
        return None if self.run is None else self.run.failure

    def describe(self) -> str:
        return f"{run_name(self.arm, self.seed, self.lr_scale)}: {self.reason}"


@dataclass
class StageReport:
    """One section: the runs of one stage and setup, the main comparison at one lr scale, and what is missing."""

    stage: StageDescriptor
    groups: List[ArmSummary]
    scale: float  # learning-rate scale of the main comparison (1 unless there is no such run)
    dataset: Optional[str] = None  # the training data
    evaluation: Optional[str] = None  # the data the metrics are measured on
    label: str = ""  # the setup, when one stage has several sections: "train.max_iter = 400"
    prefix: str = ""  # of the section's file names, when one stage has several sections
    target: Dict[str, Tuple[Optional[int], float]] = field(default_factory=dict)  # default's final (x, value)
    missing: List[Missing] = field(default_factory=list)
    kappa: Dict[str, tuple] = field(default_factory=dict)  # arm -> (x, median, min, max) over sites
    stats: List[Comparison] = field(default_factory=list)
    has_plan: bool = False
    contrast_notes: List[str] = field(default_factory=list)  # requested contrasts not made here, and why
    # the structure x scale design: why its four arms give no effects here (None: they do, or not all four ran)
    factorial_problem: Optional[str] = None

    @property
    def title(self) -> str:
        """``"Detection on coco_2017_val (trained on coco_2017_train)"``: the data the metrics are measured on, and
        the training data beside it (only one of them in older plans); and the setup, when the stage has several."""
        if self.evaluation and self.evaluation != self.dataset:
            data = f"on {self.evaluation} (trained on {self.dataset or 'data not recorded'})"
        else:
            data = f"on {self.dataset}" if self.dataset else "(dataset not recorded)"
        return f"{self.stage.title.split(':')[0]} {data}" + (f", {self.label}" if self.label else "")

    @property
    def comparisons(self) -> List[Comparison]:
        """The rows with a verdict: arm x headline metric against default, then the contrasts, then the structure x
        scale design's main effects and interaction."""
        return [s for s in self.stats if s.kind == METRIC]

    @property
    def families(self) -> Dict[str, List[Comparison]]:
        """:attr:`comparisons` by the question whose family holds them."""
        return {
            f: [s for s in self.comparisons if s.family == f] for f in dict.fromkeys(s.family for s in self.comparisons)
        }

    @property
    def has_factorial(self) -> bool:
        """Whether every arm of the structure x scale design has finished runs at the main scale."""
        return set(CELLS.values()) <= {g.arm for g in self.arms}

    def effects(self, metric_key: str) -> Dict[str, Comparison]:
        """The design's effects on one headline metric, by name (:data:`~.factorial.EFFECTS`): the simple ones are
        the section's rows of two arms (read as the effect's A - B), the others rows of their own."""
        rows = {}
        for effect in EFFECTS:
            for s in self.comparisons:
                if s.key != metric_key:
                    continue
                if (s.arm, s.reference) == (effect.pair or (effect.name, FACTORIAL)):
                    rows[effect.name] = s
                elif effect.pair and (s.reference, s.arm) == effect.pair:
                    rows[effect.name] = s.reversed()
        return rows

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

    @property
    def runs(self) -> List[Run]:
        """Every run of the section, finished or failed."""
        return [r for g in self.groups for r in g.runs] + [m.run for m in self.failed]

    def failed_at(self, arm: str, lr_scale: float) -> List[Missing]:
        return [m for m in self.failed if m.arm == arm and m.lr_scale == lr_scale]

    def arm(self, name: str, lr_scale: Optional[float] = None) -> ArmSummary:
        scale = self.scale if lr_scale is None else float(lr_scale)
        found = next((g for g in self.groups if g.arm == name and g.lr_scale == scale), None)
        if found is None:
            raise KeyError(
                f"No {self.stage.name} runs of arm {name!r} at lr scale {scale:g}; "
                f"present: {[(g.arm, g.lr_scale) for g in self.groups]}"
            )
        return found

    def best_scale(self, arm: str) -> Optional[float]:
        """The arm's lr scale with the highest seed-mean first headline metric."""
        header = self.stage.headline[0].header
        cands = [(g.value(header), g.lr_scale) for g in self.groups if g.arm == arm and math.isfinite(g.value(header))]
        return max(cands)[1] if cands else None


@dataclass
class ArmsReport:
    """The comparison of every section found, and the files that could not be read."""

    stages: List[StageReport]
    missing: List[Missing]  # every missing or unfinished run (also listed per section when its stage is known)
    skipped: List[str] = field(default_factory=list)  # "<path>: <what is wrong>"
    bootstrap: int = 1000
    seed: int = 0

    def stage(self, name: str) -> StageReport:
        """The (first) section of stage ``name``."""
        for s in self.stages:
            if s.stage.name == name:
                return s
        raise KeyError(f"No {name} runs; stages present: {[s.stage.name for s in self.stages]}")

    @property
    def primary(self) -> StageReport:
        """Detection when present (the stage the paper's tables end with), else the first section."""
        return next((s for s in self.stages if s.stage.name == "detection"), self.stages[0])

    def arm(self, name: str, stage: Optional[str] = None) -> ArmSummary:
        """An arm's summary in the main comparison of ``stage`` (default: :attr:`primary`)."""
        return (self.stage(stage) if stage else self.primary).arm(name)


def environment(runs: Sequence[Run]) -> Dict[str, List[object]]:
    """Environment field -> the distinct values the runs recorded (runs without the record are left out)."""
    values: Dict[str, List[object]] = {f: [] for f in ENVIRONMENT_FIELDS}
    for record in (e for r in runs for e in r.environments):
        for f in ENVIRONMENT_FIELDS:
            if record.get(f) not in values[f]:
                values[f].append(record.get(f))
    return values


def _summarize_group(stage: StageDescriptor, arm: str, scale: float, runs: List[Run]) -> ArmSummary:
    runs = sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.path))
    seeds = [r.seed for r in runs]
    dup = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
    if dup:
        raise ValueError(
            f"Arm {arm!r} ({stage.name}, lr scale {scale:g}) has several runs with seed {dup}: "
            f"{[r.path for r in runs if r.seed in dup]}"
        )
    g = ArmSummary(arm=arm, lr_scale=scale, runs=runs)
    g.final = {m.header: mean_std([m.value(r.final) for r in runs]) for m in stage.table}
    g.curves = {m.key: seed_mean([r.curve(m) for r in runs]) for m, _ in stage.plots}
    losses = [r.loss() for r in runs]
    if all(len(its) for its, _, _ in losses):
        g.loss = seed_mean([(its, smoothed) for its, _, smoothed in losses], interpolate=True)
    return g


def _convergence(groups: List[ArmSummary], stage: StageDescriptor) -> Dict[str, Tuple[Optional[int], float]]:
    """Each group's first x where its seed-mean curve reaches default's final value, and speed-up; returns targets."""
    default = next((g for g in groups if g.arm == "default"), None)
    if default is None:
        return {}
    target = {m.key: default.curves[m.key].final for m in stage.headline}
    target[LOSS] = default.loss.final if default.loss is not None else (None, float("nan"))
    for g in groups:
        curves = {m.key: (g.curves[m.key].x, g.curves[m.key].mean, False) for m in stage.headline}
        curves[LOSS] = (g.loss.x, g.loss.mean, True) if g.loss is not None else ([], [], True)
        for key, (x, values, lower_is_better) in curves.items():
            g.reach[key], final = first_reach(x, values, target[key][1], lower_is_better), target[key][0]
            g.speedup[key] = None if g.reach[key] is None or not final else (1.0 - g.reach[key] / final) * 100.0
    return target


def _collect_missing(expected: Sequence[ExpectedRun], runs: List[Run]) -> List[Missing]:
    """Planned runs without results, runs without any evaluation, failed runs, and runs whose last evaluation comes
    before the last one of their schedule (the runs of one stage under one root)."""
    found = {os.path.realpath(r.path) for r in runs}
    planned = {os.path.realpath(e.path): e for e in expected}
    out = [
        Missing(
            e.spec.arm, e.spec.seed, e.spec.lr_scale, e.path, "no results (failed or not run)", e.stage, plan=e.plan
        )
        for real, e in planned.items()
        if real not in found
    ]
    end: Dict[Tuple[str, str], int] = {}
    for r in runs:
        if r.final_x is not None and r.failure is None:
            end[(r.root, r.stage.name)] = max(end.get((r.root, r.stage.name), r.final_x), r.final_x)
    for r in runs:
        stage = r.stage or getattr(planned.get(os.path.realpath(r.path)), "stage", None)  # else the plan's
        if r.failure is not None:
            reason = describe_failure(r.failure)
        elif r.stage is None or not r.evaluations():
            reason = "no evaluation recorded (unfinished or failed)"
        elif r.final_x < end.get((r.root, r.stage.name), r.final_x):
            reason = (
                f"unfinished (last evaluation at {r.stage.unit} {r.final_x}; other runs reach "
                f"{end[(r.root, r.stage.name)]})"
            )
        else:
            continue
        out.append(Missing(r.arm, r.seed, r.lr_scale, r.path, reason, stage, r if r.failure else None, r.plan))
    return out


def report_stages(present) -> List[StageDescriptor]:
    """The stages among ``present`` (None left out): the registered ones in their order, then any other by name."""
    present = {s.name: s for s in present if s is not None}
    order = [s.name for s in known_stages()]
    return [present[n] for n in sorted(present, key=lambda n: (order.index(n) if n in order else len(order), n))]


def _setup(plan: Optional[Plan]) -> Optional[Dict[str, str]]:
    """A plan's setup as key -> text, its dataset included; None when the plan recorded neither."""
    if plan is None or (plan.setup is None and plan.dataset is None):
        return None
    setup = {str(k): str(v) for k, v in (plan.setup or {}).items()}
    return setup if plan.dataset is None else {**setup, "dataset": str(plan.dataset)}


def _sections(stage: StageDescriptor, runs: List[Run], missing: List[Missing], group_by_config: bool):
    """[(dataset, label, runs, missing)] of one stage: one section per setup (raising ValueError for several without
    ``group_by_config``); runs without a recorded setup join the only one, or form a section of their own."""
    keyed: Dict[Optional[str], Tuple[Optional[dict], list, list]] = {}
    for item in [*runs, *missing]:
        setup = _setup(item.plan)
        entry = keyed.setdefault(None if setup is None else json.dumps(setup, sort_keys=True), (setup, [], []))
        entry[1 if isinstance(item, Run) else 2].append(item)
    known = [v for k, v in keyed.items() if k is not None]
    if len(known) <= 1:
        return [(known[0][0].get("dataset") if known else None, "", runs, missing)]
    values = {k: [s.get(k, "absent") for s, _, _ in known] for k in sorted(set().union(*[s for s, _, _ in known]))}
    differ = {k: v for k, v in values.items() if len(set(v)) > 1}
    if not group_by_config:
        raise ValueError(
            f"the {stage.name} runs have different setups ("
            + "; ".join(f"{k}: {' vs '.join(v)}" for k, v in differ.items())
            + "); compare them separately, or pass --group-by-config for one section per setup"
        )
    out = [
        (s.get("dataset"), ", ".join(f"{k} = {v[i]}" for k, v in differ.items()), r, m)
        for i, (s, r, m) in enumerate(known)
    ]
    return out + ([(None, "setup not recorded", *keyed[None][1:])] if None in keyed else [])


def _section(stage: StageDescriptor, runs: List[Run], missing: List[Missing], contrasts, **kwargs) -> StageReport:
    """One section: its groups, convergence, κ and comparisons (kwargs: :func:`compare_stage`'s)."""
    keys = sorted({(r.arm, r.lr_scale) for r in runs}, key=lambda k: (arm_sort_key(k[0]), k[1]))
    groups = [_summarize_group(stage, a, s, [r for r in runs if (r.arm, r.lr_scale) == (a, s)]) for a, s in keys]
    # the main scale: 1 when any run has it (or none ran); else the one most arms ran, then the closest to 1
    scales = [g.lr_scale for g in groups] or [m.lr_scale for m in missing if m.failure is not None]
    scale = (
        1.0 if not scales or 1.0 in scales else max(set(scales), key=lambda s: (scales.count(s), -abs(math.log(s)), -s))
    )
    sr = StageReport(stage=stage, groups=groups, scale=scale, missing=missing)
    sr.target = _convergence(sr.arms, stage)
    kappa = {g.arm: kappa_curve([r.records for r in g.runs], stage.unit) for g in sr.arms}
    sr.kappa = {arm: k for arm, k in kappa.items() if len(k[0])}
    contrasts, sr.contrast_notes = resolve_contrasts([g.arm for g in sr.arms], contrasts)
    if sr.has_factorial:
        sr.factorial_problem = design_problem({g.arm: [r.options for r in g.runs] for g in sr.arms})
    sr.stats = compare_stage(
        stage,
        sr.arms,
        [m for m in sr.failed if m.lr_scale == scale],
        contrasts=contrasts,
        factorial=sr.has_factorial and sr.factorial_problem is None,
        **kwargs,
    )
    return sr


def summarize_runs(
    runs: Sequence[Run],
    expected: Sequence[ExpectedRun] = (),
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    delta=None,
    std=None,
    contrasts: Sequence[Tuple[str, str]] = (),
    group_by_config: bool = False,
    skipped: Sequence[str] = (),
    cache_dir: Optional[str] = None,
) -> ArmsReport:
    """Group finished runs into sections (stage, setup) and arms (arm, lr scale), summarize them over seeds, compare
    the arms and collect the missing, unfinished and failed runs. ``expected`` (the runs the plans list) and
    ``skipped`` (files that could not be read): :func:`find_runs`'; ``cache_dir``: :func:`compare_stage`'s; the other
    arguments: :func:`compare_arms`'."""
    runs = list(runs)
    if not runs:
        raise ValueError("No runs to compare" + (": " + "; ".join(skipped) if skipped else "."))
    contrasts = list(contrasts)
    resolve_contrasts((), contrasts)  # a malformed pair fails before any work
    options = dict(bootstrap=bootstrap, seed=seed, delta=delta, std=std, contrasts=contrasts, cache_dir=cache_dir)
    missing = _collect_missing(expected, runs)
    bad = {os.path.realpath(m.path) for m in missing}
    finished = [r for r in runs if r.final_x is not None and os.path.realpath(r.path) not in bad]
    sections = []
    for stage in report_stages([r.stage for r in runs] + [m.stage for m in missing]):
        for k, (dataset, label, section_runs, section_missing) in enumerate(
            _sections(
                stage,
                [r for r in finished if r.stage == stage],
                [m for m in missing if m.stage == stage],
                group_by_config,
            )
        ):
            sr = _section(stage, section_runs, section_missing, dataset=dataset, **options)
            sr.dataset, sr.label, sr.prefix = dataset, label, f"setup{k + 1}_" if k else ""
            plans = [item.plan for item in [*section_runs, *section_missing] if item.plan is not None]
            sr.has_plan = bool(plans)
            sr.evaluation = next((plan.evaluation for plan in plans if plan.evaluation), None)
            sections.append(sr)
    if not any(s.groups or s.failed for s in sections):
        raise ValueError("No finished runs to compare: " + "; ".join([m.describe() for m in missing] + list(skipped)))
    return ArmsReport(stages=sections, missing=missing, skipped=list(skipped), bootstrap=bootstrap, seed=seed)
