"""Paired statistics of every arm against the default arm, with their units and family-wise control.

Runs with the same training seed share data order and every non-attention weight, and every run is
evaluated on the same images, so each arm is compared with the default arm through per-seed
differences over the seeds both ran. Per headline metric (:mod:`.statistics` defines the intervals):

- one paired seed, per-image data kept: image bootstrap (percentile) — *this one trained model* on
  *these images*; never a verdict on the initialization;
- two or more, per-image data kept for every paired run: the two-level bootstrap (seeds x images),
  t-scaled: training runs and evaluation images; the paired t-interval over seeds and the two-level
  percentile interval are shown beside it;
- two or more without per-image data: the paired t-interval over seeds (training runs, the evaluation
  set held fixed), saying why the images are not included.

Planned contrasts between two other arms (A vs B, :mod:`.contrasts`) get the same machinery with B in
the default arm's place: A minus B per seed over the seeds both ran, the same intervals, P(A > B) and the
speed-up of A to B's final value. Each row names its reference (:attr:`PairedStat.reference`).

Verdicts are Holm-adjusted over the stage's family of (arm x headline metric) comparisons with default
and (contrast x headline metric) comparisons (:mod:`.multiplicity`). Each comparison also gets the
probability of improvement over its seeds (:mod:`.improvement`) and a seed plan (:mod:`.planning`).
Speed-ups (headline metrics and the training loss) keep runs that never reach the reference's final
value as censored (:mod:`.speedup`); they are descriptive and not in the family.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from condinit_det.stage import Metric, StageDescriptor

from .discovery import Run
from .image_data import NoImageData, RunImages, paired_images
from .improvement import Improvement, probability_of_improvement
from .multiplicity import holm_adjust
from .planning import PAPER_DELTA, PRIOR_DIFFERENCE_STD, SeedPlan, plan_seeds
from .speedup import SpeedupSummary, image_bootstrap_speedup, reach_of, summarize_reaches
from .statistics import (
    BOTH,
    IMAGE_BOOTSTRAP,
    IMAGES,
    PAIRED_T,
    Interval,
    mean_std,
    percentile_interval,
    report_method,
    t_interval,
    two_level_bootstrap,
    verdict,
)

__all__ = ["ALPHA", "DEFAULT", "METRIC", "REFERENCE", "SPEEDUP", "PairedStat", "family_of", "paired_statistics"]

ALPHA = 0.05  # family-wise error of the verdicts
DEFAULT = "default"  # the arm every other arm is compared with
REFERENCE = "reference"
METRIC, SPEEDUP = "metric", "speedup"


@dataclass
class PairedStat:
    """One arm x one metric (or speed-up): spread over seeds and the paired comparison with the reference arm
    (``reference``: "default", or the other arm of a contrast ``arm`` vs ``reference``)."""

    arm: str
    metric: str  # display name
    key: str
    lr_scale: float
    values: Dict[Optional[int], float]  # seed -> value (speed-ups: the seeds that reached the target)
    mean: float
    std: float
    n: int
    paired_seeds: List[int] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)  # "seed 2 (no default run)"
    differences: List[float] = field(default_factory=list)
    interval: Optional[Interval] = None  # the interval the verdict uses
    method: str = ""
    verdict: str = ""
    higher_is_better: bool = True
    kind: str = METRIC  # METRIC (in the family) or SPEEDUP (descriptive)
    others: List[Interval] = field(default_factory=list)  # shown beside it (t over seeds, percentile)
    note: str = ""  # why an interval or a source of variance is missing
    in_family: bool = False
    p_holm: float = float("nan")
    improvement: Optional[Improvement] = None
    plan: Optional[SeedPlan] = None
    speedup: Optional[SpeedupSummary] = None
    reference: str = DEFAULT

    @property
    def is_contrast(self) -> bool:
        """A comparison between two arms other than default."""
        return self.reference != DEFAULT

    @property
    def label(self) -> str:
        """``"conditioned"`` (against default) or ``"conditioned vs scale_matched"`` (a contrast)."""
        return f"{self.arm} vs {self.reference}" if self.is_contrast else self.arm

    @property
    def mean_difference(self) -> float:
        return float(np.mean(self.differences)) if self.differences else float("nan")

    @property
    def unit(self) -> str:
        return self.interval.unit if self.interval is not None else ""


def _by_seed(runs: List[Run]) -> Dict[int, Run]:
    return {r.seed: r for r in runs if r.seed is not None}


def _pair(arm_runs: Dict[int, Run], ref_runs: Dict[int, Run], ref_name: str, arm: str,
          why: Dict[Tuple[str, int], str]) -> Tuple[List[int], List[str]]:
    """Seeds with both runs, and the dropped ones named with what became of the missing run (``why``:
    (arm, seed) -> e.g. "diverged at iteration 40")."""
    paired = sorted(set(arm_runs) & set(ref_runs))
    dropped = [f"seed {s} ({arm} run {why[(arm, s)]})" if (arm, s) in why else f"seed {s} (no {arm} run)"
               for s in sorted(set(ref_runs) - set(arm_runs))]
    dropped += [f"seed {s} ({ref_name} run {why[(ref_name, s)]})" if (ref_name, s) in why else
                f"seed {s} (no {ref_name} run)" for s in sorted(set(arm_runs) - set(ref_runs))]
    return paired, dropped


class _Context:
    """What every comparison of one stage shares: per-image data of the runs and the image resamples."""

    def __init__(self, stage: StageDescriptor, bootstrap: int, seed: int):
        self.stage, self.bootstrap, self.seed = stage, int(bootstrap), int(seed)
        self._images: Dict[str, RunImages] = {}
        self._draws: Dict[int, np.ndarray] = {}
        self._resampled: Dict[Tuple[str, int, str], np.ndarray] = {}

    def images(self, run: Run) -> RunImages:
        if run.path not in self._images:
            self._images[run.path] = RunImages(run)
        return self._images[run.path]

    def draws(self, num_images: int) -> np.ndarray:
        """The stage's image resamples [B, N]: the same for every seed, arm and metric (crossed design)."""
        if num_images not in self._draws:
            from condinit_det.evaluation.bootstrap import image_draws

            self._draws[num_images] = image_draws(np.random.default_rng(self.seed), num_images, self.bootstrap)
        return self._draws[num_images]

    def rng(self, *keys: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *keys])

    def resampled(self, run: Run, x: int, metric: Metric) -> np.ndarray:
        """[B] the run's metric at x on the stage's image resamples; kept (the default runs serve every arm)."""
        key = (run.path, int(x), metric.key)
        if key not in self._resampled:
            images = self.images(run)
            self._resampled[key] = images.resampled(x, metric, self.draws(images.num_images(x)))
        return self._resampled[key]


def _resampled_differences(ctx: _Context, runs: Dict[int, Run], refs: Dict[int, Run], seeds: List[int],
                           metric: Metric) -> Tuple[np.ndarray, int]:
    """[n, B] per-seed differences of the final evaluations on the shared image resamples, and N."""
    first = ctx.images(runs[seeds[0]])
    num_images = first.num_images(first.run.final_x)
    out = [ctx.resampled(runs[s], runs[s].final_x, metric) - ctx.resampled(refs[s], refs[s].final_x, metric)
           for s in seeds]
    return np.stack(out), num_images


def _fill_metric(row: PairedStat, ctx: _Context, runs, refs, metric: Metric, image_reason: Optional[str],
                 key: int) -> None:
    n = len(row.differences)
    reps = num_images = None
    if image_reason is None and n:
        try:
            reps, num_images = _resampled_differences(ctx, runs, refs, row.paired_seeds, metric)
        except NoImageData as e:
            image_reason = str(e)
    method = report_method(n, per_image=reps is not None)
    if method is None:
        row.method = "no paired seeds" if n == 0 else "one paired seed: " + image_reason
        row.note = image_reason or ""
    elif method == IMAGE_BOOTSTRAP:
        row.interval = percentile_interval(
            row.differences[0], reps[0], method=f"image bootstrap over {num_images} evaluation images, "
                                                f"B={ctx.bootstrap}, percentile", replication=IMAGES, num_seeds=1)
        row.method = row.interval.method
    elif method == PAIRED_T:
        row.interval = t_interval(row.differences)
        row.method = row.interval.method
        row.note = f"evaluation-image variance not included: {image_reason}"
    else:
        two = two_level_bootstrap(np.asarray(row.differences), reps, ctx.rng(1, key), num_images=num_images)
        row.interval = two.interval(t_scaled=True)
        row.method = row.interval.method + f", B={ctx.bootstrap}"
        row.others = [t_interval(row.differences), two.interval(t_scaled=False)]
        row.note = f"shared image variance {float(two.var_images):.3g}, seed variance / n {float(two.var_seeds):.3g}"


def _given(value, metric: Metric) -> Optional[float]:
    """A number given for every metric, or for this one (by key or header) in a mapping."""
    if isinstance(value, Mapping):
        value = value.get(metric.key, value.get(metric.header))
    return None if value is None else float(value)


def _delta_for(metric: Metric, row: PairedStat, delta) -> Tuple[Optional[float], str]:
    given = _given(delta, metric)
    if given is not None:
        return float(given), "given"
    if metric.key in PAPER_DELTA:
        return PAPER_DELTA[metric.key], "the paper's claimed gain"
    observed = abs(row.mean_difference)
    if math.isfinite(observed) and observed > 0:
        return observed, "the observed difference"
    return None, ""


def _plan(row: PairedStat, metric: Metric, delta, std_given, comparisons: int) -> Optional[SeedPlan]:
    value, source = _delta_for(metric, row, delta)
    if value is None:
        return None
    n = len(row.differences)
    shared = 0.0
    if _given(std_given, metric) is not None:
        std, std_source = _given(std_given, metric), "given"
    elif n >= 2:
        std, std_source = float(np.std(row.differences, ddof=1)), f"observed over {n} seeds"
        if row.interval is not None and row.interval.replication == BOTH:
            shared = max(row.interval.se ** 2 - std ** 2 / n, 0.0)
    elif metric.key in PRIOR_DIFFERENCE_STD:
        std = PRIOR_DIFFERENCE_STD[metric.key]
        std_source = "assumed: sqrt(2) x the 0.10 AP seed std detectron2 reports for ViTDet on COCO"
    else:
        return None
    return plan_seeds(value, std, delta_source=source, std_source=std_source, comparisons=comparisons,
                      level=ALPHA, shared_variance=shared, seeds_now=n)


def _reaches(runs, refs, seeds, metric: Optional[Metric]):
    """Per seed the :class:`Reach` of the arm's run to the same seed's default final value (None when undefined)."""
    out = {}
    for s in seeds:
        run, ref = runs[s], refs[s]
        if metric is None:  # the smoothed training loss
            its, _, sm = run.loss()
            ref_its, _, ref_sm = ref.loss()
            out[s] = reach_of(s, its, sm, float(ref_sm[-1]), int(ref_its[-1]), lower_is_better=True) \
                if len(its) and len(ref_its) else None
        else:
            x, y = run.curve(metric)
            out[s] = reach_of(s, x, y, metric.value(ref.final), ref.final_x)
    return out


def _image_speedup(ctx: _Context, run: Run, ref: Run, metric: Metric, reach) -> Tuple[Optional[SpeedupSummary], str]:
    """One seed: the speed-up's image bootstrap, or why there is none."""
    if ctx.bootstrap <= 0:
        return None, "bootstrap off"
    a, b = ctx.images(run), ctx.images(ref)
    if not a.has_every_evaluation():
        return None, (f"{run.name} kept per-image data of {len(a.evaluated)} of its {len(run.evaluations())} "
                      "evaluations (the speed-up's image bootstrap needs every one)")
    try:
        num_images = b.num_images(ref.final_x)
        if a.digest(a.evaluated[-1]) != b.digest(ref.final_x):
            return None, "the runs were evaluated on different images"
        draws = ctx.draws(num_images)
        targets = ctx.resampled(ref, ref.final_x, metric)
        x = [int(r[ctx.stage.unit]) for r in run.evaluations()]
        summary = image_bootstrap_speedup(reach, x, lambda e, rows: a.resampled(x[e], metric, draws[rows]), targets)
    except NoImageData as e:
        return None, str(e)
    return summary, ""


def _speedup_rows(ctx, g, runs, refs, paired, dropped, metrics, reference: str = DEFAULT) -> List[PairedStat]:
    conv: List[Tuple[Optional[Metric], str, str]] = [(m, f"{m.key}_speedup", f"speed-up {m.header} (%)")
                                                     for m in metrics]
    if g.loss is not None and all(len(refs[s].loss()[0]) for s in paired) and paired:
        conv.append((None, "loss_speedup", "speed-up loss (%)"))
    rows = []
    for m, key, name in conv:
        per_seed = _reaches(runs, refs, paired, m)
        defined = [r for r in per_seed.values() if r is not None]
        reached = {r.seed: r.speedup for r in defined if not r.censored}
        mean, std = mean_std(list(reached.values()))
        row = PairedStat(g.arm, name, key, g.lr_scale, reached, mean, std, len(reached), paired_seeds=paired,
                         dropped=dropped, kind=SPEEDUP, reference=reference)
        if not defined:
            row.method = "no paired seeds" if not paired else f"no {reference} final value to reach"
        else:
            row.speedup = summarize_reaches(defined)
            row.method = row.speedup.method
            if len(defined) == 1 and m is not None:
                image, why = _image_speedup(ctx, runs[defined[0].seed], refs[defined[0].seed], m, defined[0])
                if image is not None:
                    row.speedup, row.method = image, image.method
                else:
                    row.note = f"no image bootstrap: {why}"
            elif len(defined) == 1:
                row.note = "the training loss has no per-image data"
        censored = sorted(r.seed for r in defined if r.censored)
        if censored:
            row.note = ("; ".join(filter(None, [row.note, "not reached (censored at the last evaluation) for seed "
                                                + ", ".join(map(str, censored))])))
        rows.append(row)
    return rows


def family_of(rows: List[PairedStat]) -> List[PairedStat]:
    """The comparisons of a stage's Holm family: arm x headline metric against default, and contrast x headline
    metric."""
    return [r for r in rows if r.in_family]


def _comparison_rows(ctx: _Context, g, ref, why, metrics: List[Metric], start: int) -> List[PairedStat]:
    """Arm ``g`` against the reference group ``ref`` (default, or the other arm of a contrast), paired by seed:
    a row per headline metric (in the family), then the speed-up rows. ``start``: the rows' first index in the
    stage's list (keys of their generators)."""
    runs, refs = _by_seed(g.runs), _by_seed(ref.runs)
    paired, dropped = _pair(runs, refs, ref.arm, g.arm, why)
    image_reason = "bootstrap off" if ctx.bootstrap <= 0 else None
    if image_reason is None and paired:
        image_reason = paired_images({s: ctx.images(runs[s]) for s in paired},
                                     {s: ctx.images(refs[s]) for s in paired}, paired)
    rows: List[PairedStat] = []
    for m in metrics:
        finals = [m.value(r.final) for r in g.runs]
        values = {r.seed: v for r, v in zip(g.runs, finals) if r.seed is not None}
        mean, std = mean_std(finals)
        row = PairedStat(g.arm, m.header, m.key, g.lr_scale, values, mean, std, len(finals), reference=ref.arm)
        row.paired_seeds, row.dropped, row.in_family = paired, dropped, True
        row.differences = [values[s] - m.value(refs[s].final) for s in paired]
        key = start + len(rows)
        _fill_metric(row, ctx, runs, refs, m, image_reason, key=key)
        if len(row.differences) >= 2:
            row.improvement = probability_of_improvement(row.differences, ctx.rng(2, key), ctx.bootstrap)
        rows.append(row)
    return rows + _speedup_rows(ctx, g, runs, refs, paired, dropped, metrics, reference=ref.arm)


def paired_statistics(stage_report, *, bootstrap: int = 1000, seed: int = 0,
                      delta: Union[None, float, Mapping[str, float]] = None,
                      std: Union[None, float, Mapping[str, float]] = None,
                      contrasts: Sequence[Tuple[str, str]] = ()) -> List[PairedStat]:
    """
    Rows of the paired-statistics table of one stage's main comparison (see module doc): per arm its
    headline metrics (against default) and speed-ups, then per contrast the same for A against B.

    Args:
        stage_report: the stage's :class:`~condinit_det.report.summary.StageReport` (groups, failures).
        bootstrap: image resamples B (0: no image bootstrap, only intervals over seeds).
        seed: seed of every resampling generator.
        delta: difference to plan the seeds for (a number, or metric key / header -> number); default:
            the paper's claimed gain where there is one, else the observed difference.
        std: standard deviation of the per-seed paired differences the plans assume (same forms); default:
            the observed one (one seed: an assumed one for detection, none for classification).
        contrasts: (A, B) pairs of arms to compare, A minus B, in the same family
            (:func:`~condinit_det.report.contrasts.resolve_contrasts` gives a stage's); a pair with an arm
            that has no finished run in the stage is skipped.
    """
    stage: StageDescriptor = stage_report.stage
    groups = stage_report.arms
    default = next((g for g in groups if g.arm == DEFAULT), None)
    why = {(m.arm, m.seed): m.reason for m in stage_report.failed if m.lr_scale == stage_report.scale}
    ctx = _Context(stage, bootstrap, seed)
    rows: List[PairedStat] = []
    for g in groups:
        metrics = [m for m in stage.headline if math.isfinite(g.value(m.header))]
        if default is not None and g is not default:
            rows += _comparison_rows(ctx, g, default, why, metrics, len(rows))
            continue
        for m in metrics:
            finals = [m.value(r.final) for r in g.runs]
            mean, spread = mean_std(finals)
            row = PairedStat(g.arm, m.header, m.key, g.lr_scale,
                             {r.seed: v for r, v in zip(g.runs, finals) if r.seed is not None}, mean, spread,
                             len(finals))
            row.method, row.verdict = ("no default arm", "") if default is None else (REFERENCE, REFERENCE)
            rows.append(row)
    by_arm = {g.arm: g for g in groups}
    for a, b in contrasts:
        if a not in by_arm or b not in by_arm or a == b:
            continue
        metrics = [m for m in stage.headline
                   if math.isfinite(by_arm[a].value(m.header)) and math.isfinite(by_arm[b].value(m.header))]
        rows += _comparison_rows(ctx, by_arm[a], by_arm[b], why, metrics, len(rows))
    _holm_verdicts(rows, stage, delta, std)
    return rows


def _holm_verdicts(rows: List[PairedStat], stage: StageDescriptor, delta, std) -> None:
    family = family_of(rows)
    if not family:
        return
    p = [r.interval.p_value if r.interval is not None else float("nan") for r in family]
    for row, p_holm in zip(family, holm_adjust(p)):
        row.p_holm = float(p_holm)
        row.verdict = verdict(row.interval, row.higher_is_better, p_adjusted=row.p_holm, alpha=ALPHA,
                              reference=row.reference) if row.interval is not None else "no interval"
        metric = next(m for m in stage.headline if m.key == row.key)
        row.plan = _plan(row, metric, delta, std, len(family))
