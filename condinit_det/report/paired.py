"""The comparisons of one section, paired by training seed: every arm against default, contrasts A vs B (those asked
for, and :data:`DEFAULT_CONTRASTS` wherever both ran) and the structure x scale design's effects. Per headline metric
an interval, the verdict within its question's family, P(arm run > reference run) and a seed plan; per headline metric
and the loss, the censored speed-up (docs/statistics.md, "Verdicts and their families")."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from condinit_det.records.per_image import read_classification_eval
from condinit_det.stage import Metric, StageDescriptor
from condinit_det.utils.fileio import atomic_write

from . import statistics
from .discovery import Run
from .factorial import CELLS, EFFECT_LABELS, FACTORIAL, JOINT_EFFECTS

ALPHA = 0.05  # family-wise error of each family of verdicts
# The questions, each with its own family of comparisons: arms against default, contrasts, the design's main effects
# and interaction (its simple effects are rows of the first two).
AGAINST_DEFAULT, BETWEEN_ARMS, STRUCTURE_SCALE = "against default", "between two arms", "structure × scale"
DEFAULT = "default"  # the arm every other arm is compared with
METRIC, SPEEDUP = "metric", "speedup"
DEFAULT_CONTRASTS: Tuple[Tuple[str, str], ...] = (
    ("conditioned", "scale_matched"),
    ("conditioned", "mimetic"),
    ("conditioned", "structured"),
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COCO = re.compile(r"(^|[^a-z])coco")  # a plan's dataset on COCO: coco_2017_train, /data/coco/train2017
_ACCEPTED = (
    "two different arms other than default, as A:B (e.g. conditioned:scale_matched, conditioned:mimetic, "
    "mimetic:scale_matched)"
)


@dataclass
class Comparison:
    """``arm`` minus ``reference`` on one metric (``kind`` :data:`METRIC`, in its question's family) or the speed-up to
    the reference's final value (:data:`SPEEDUP`), paired by training seed."""

    arm: str
    reference: str
    metric: str  # display name: "AP^b", "speed-up AP^b (%)"
    key: str  # "bbox", "bbox_speedup", "loss_speedup"
    lr_scale: float
    kind: str = METRIC
    values: Dict[Optional[int], float] = field(default_factory=dict)  # seed -> the arm's value
    mean: float = float("nan")  # of the arm's values
    std: float = float("nan")
    n: int = 0  # the arm's runs (speed-ups: the seeds that reached it)
    paired_seeds: List[int] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)  # "seed 2 (no default run)"
    differences: List[float] = field(default_factory=list)
    family: str = ""  # the question whose family holds a metric row: AGAINST_DEFAULT, BETWEEN_ARMS, STRUCTURE_SCALE
    family_size: int = 0  # the comparisons in that family
    interval: Optional[statistics.Interval] = None  # 95%, unadjusted
    adjusted: Optional[statistics.Interval] = None  # the verdict's: the same method at the family's level
    t: Optional[statistics.Interval] = None  # beside them: the paired t over seeds (the evaluation set held fixed)
    percentile: Optional[statistics.Interval] = None  # and the two-level percentile interval
    method: str = ""
    note: str = ""  # why an interval or a source of variance is missing
    p_adjusted: float = float("nan")  # min(1, family_size x p)
    verdict: str = ""
    improvement: Optional[statistics.Improvement] = None
    plan: Optional[statistics.SeedPlan] = None
    speedup: Optional[statistics.SpeedupSummary] = None

    @property
    def label(self) -> str:
        """``"conditioned"`` (against default), ``"conditioned vs scale_matched"`` (a contrast) or ``"scale (main
        effect)"`` (an effect of the structure x scale design, :mod:`.factorial`)."""
        if self.reference == FACTORIAL:
            return EFFECT_LABELS[self.arm]
        return self.arm if self.reference == DEFAULT else f"{self.arm} vs {self.reference}"

    @property
    def mean_difference(self) -> float:
        return float(np.mean(self.differences)) if self.differences else float("nan")

    @property
    def level(self) -> float:
        """The confidence level of the adjusted interval: 1 - ALPHA / the family's comparisons (Bonferroni)."""
        return 1.0 - ALPHA / self.family_size

    def reversed(self) -> "Comparison":
        """The same comparison read as ``reference`` minus ``arm``: the differences, every interval, P(improvement) and
        the verdict turned; the arm's own values, spread and speed-up, which do not turn, left out."""

        def turn(iv):
            return None if iv is None else dataclasses.replace(iv, estimate=-iv.estimate, low=-iv.high, high=-iv.low)

        imp, turned = self.improvement, {statistics.BETTER: statistics.WORSE, statistics.WORSE: statistics.BETTER}
        if imp is not None:  # P(B > A) = 1 - P(A > B), ties counting half: both intervals turn with it
            imp = statistics.Improvement(
                1.0 - imp.estimate, 1.0 - imp.boot_high, 1.0 - imp.boot_low, 1.0 - imp.exact_high, 1.0 - imp.exact_low
            )
        return dataclasses.replace(
            self,
            arm=self.reference,
            reference=self.arm,
            values={},
            mean=float("nan"),
            std=float("nan"),
            n=0,
            differences=[-d for d in self.differences],
            **{name: turn(getattr(self, name)) for name in ("interval", "adjusted", "t", "percentile")},
            improvement=imp,
            verdict=turned.get(self.verdict, self.verdict),
            speedup=None,
        )


def check_contrast(arm: str, reference: str) -> Tuple[str, str]:
    """(A, B) when it names two different arms other than default; raises ValueError saying what is accepted."""
    arm, reference = str(arm).strip(), str(reference).strip()
    bad = [n for n in (arm, reference) if not _NAME.match(n)]
    problem = (
        f"{bad[0]!r} is not an arm name"
        if bad
        else "every arm is already compared with default"
        if DEFAULT in (arm, reference)
        else "an arm against itself"
        if arm == reference
        else ""
    )
    if problem:
        raise ValueError(f"contrast {arm}:{reference}: {problem}; expected {_ACCEPTED}")
    return arm, reference


def parse_contrast(text: str) -> Tuple[str, str]:
    """``"conditioned:scale_matched"`` -> ("conditioned", "scale_matched"); raises ValueError otherwise."""
    parts = str(text).split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ValueError(f"contrast {text!r}: expected {_ACCEPTED}")
    return check_contrast(*parts)


def resolve_contrasts(
    present: Iterable[str], requested: Sequence[Tuple[str, str]] = ()
) -> Tuple[List[Tuple[str, str]], List[str]]:
    """The contrasts of one stage whose arms ``present`` ran, and a note for each requested one that cannot be made:
    the default ones first (where both arms ran), then those requested (a pair of the arms of a default one replaces
    it, in the direction asked for); repeats are made once."""
    present = set(present)
    requested = [check_contrast(a, b) for a, b in requested]
    pairs = [c for c in DEFAULT_CONTRASTS if set(c) <= present and frozenset(c) not in map(frozenset, requested)]
    notes, seen = [], {frozenset(c) for c in pairs}
    for a, b in requested:
        new, missing = frozenset((a, b)) not in seen, [x for x in (a, b) if x not in present]
        if new and missing:
            notes.append(
                f"contrast {a} vs {b} not made: no finished {' or '.join(missing)} run in this stage "
                f"(arms here: {', '.join(sorted(present)) or 'none'})"
            )
        elif new:
            pairs.append((a, b))
        seen.add(frozenset((a, b)))
    return pairs, notes


class NoImageData(Exception):
    """Raised with the reason an evaluation has no usable per-image data."""


def _bootstrap():
    try:
        from condinit_det.evaluation import bootstrap
    except ImportError as e:  # faster-coco-eval missing
        raise NoImageData(f"the image bootstrap is unavailable ({e})") from None
    return bootstrap


class _Context:
    """What every comparison of one section shares: :func:`compare_stage`'s settings, the image resamples, and each
    run's per-image data of its final evaluation (COCO matches by iou type, or top-1 / top-5 correctness), read once;
    with ``cache_dir``, a run's resamples are kept there, named by what they are computed from."""

    def __init__(self, bootstrap: int, seed: int, cache_dir: Optional[str], delta, std, dataset: Optional[str]):
        self.bootstrap, self.seed, self.cache_dir = int(bootstrap), int(seed), cache_dir
        self.delta, self.std, self.dataset = delta, std, dataset
        self._images, self._draws, self._resampled = {}, {}, {}  # by run; by number of images; by (run, metric)

    def images(self, run: Run) -> Tuple[dict, str, int, str]:
        """(data, digest of the evaluation images, number of images, its file); raises :class:`NoImageData`."""
        if run.path not in self._images:
            self._images[run.path] = self._load(run)
        return self._images[run.path]

    @staticmethod
    def _load(run: Run) -> Tuple[dict, str, int, str]:
        named = [r["per_image"] for r in run.evaluations() if r.get("per_image") and r[run.stage.unit] == run.final_x]
        path = os.path.join(run.path, named[-1]) if named else None
        if path is None or not os.path.isfile(path):
            raise NoImageData(f"{run.name} kept no per-image data of its {run.stage.unit} {run.final_x}")
        try:
            if run.stage.per_image == "coco":
                matches = _bootstrap().load_matches(path)
                if not matches:
                    raise NoImageData(f"{path} holds no matches")
                first = next(iter(matches.values()))
                return matches, first.images_sha1, first.num_images, path
            ev = read_classification_eval(path)
        except ValueError as e:
            raise NoImageData(str(e)) from None
        return {"top1": ev.top1, "top5": ev.top5}, ev.labels_sha1, int(ev.top1.size), path

    def resampled(self, run: Run, metric: Metric) -> np.ndarray:
        """[B] the run's final metric (percent) on the image resamples, the same for every seed, arm and metric."""
        key = (run.path, metric.key)
        if key in self._resampled:
            return self._resampled[key]
        (data, _, num_images, path), boot, coco = self.images(run), _bootstrap(), run.stage.per_image == "coco"
        digest = hashlib.sha1(f"{metric.key} {self.bootstrap} {self.seed}".encode())
        for name in (path, boot.__file__):  # the per-image file and the resampling code
            with open(name, "rb") as f:
                digest.update(f.read())
        cached = os.path.join(self.cache_dir or "", f"resampled-{digest.hexdigest()}.float64")
        if self.cache_dir is not None and os.path.isfile(cached):
            self._resampled[key] = np.fromfile(cached)
            if self._resampled[key].size == self.bootstrap:  # else unreadable: computed again
                return self._resampled[key]
        section = metric.section if coco else metric.key
        if section not in data:
            raise NoImageData(f"{run.name} has no per-image {metric.header} data")
        if num_images not in self._draws:
            self._draws[num_images] = boot.image_draws(np.random.default_rng(self.seed), num_images, self.bootstrap)
        draws = self._draws[num_images]
        self._resampled[key] = (
            boot.resampled_ap(data[section], draws)[metric.name]
            if coco
            else boot.resampled_mean(100.0 * data[section], draws)
        )
        if self.cache_dir is not None:
            os.makedirs(self.cache_dir, exist_ok=True)
            atomic_write(cached, self._resampled[key].astype(np.float64).tobytes())
        return self._resampled[key]


def _fill_metric(
    row: Comparison, ctx: _Context, terms: List[List[Tuple[float, Run]]], metric: Metric, key: int
) -> None:
    """The row's intervals by the method its seeds and per-image data allow, its verdict within its family and its
    seed plan; ``terms``: per paired seed, the (weight, run) pairs whose weighted sum is the row's difference
    (``[(1, run), (-1, reference)]`` for two arms)."""
    reps, image_reason = None, "bootstrap off" if ctx.bootstrap <= 0 else None
    runs = [run for seed in terms for _, run in seed]
    if image_reason is None and terms:
        try:  # every paired run's final evaluation with per-image data, on the same images
            if len({ctx.images(r)[1] for r in runs}) > 1:
                raise NoImageData("the runs were evaluated on different images")
            reps = np.stack([sum(w * ctx.resampled(run, metric) for w, run in seed) for seed in terms])
            num_images = ctx.images(runs[0])[2]
        except NoImageData as e:
            image_reason = str(e)
    method = statistics.report_method(len(terms), per_image=reps is not None)
    if method is None:
        row.method, row.note = "one paired seed: " + image_reason if terms else "no paired seeds", image_reason or ""
    elif method == statistics.IMAGE_BOOTSTRAP:
        row.interval = statistics.percentile_interval(
            row.differences[0],
            reps[0],
            f"image bootstrap over {num_images} evaluation images, B={ctx.bootstrap}, percentile",
        )
    elif method == statistics.PAIRED_T:
        row.interval = row.t = statistics.t_interval(row.differences)
        row.adjusted = statistics.t_interval(row.differences, row.level)
        row.note = f"evaluation-image variance not included: {image_reason}"
    else:
        two = statistics.two_level_bootstrap(row.differences, reps, np.random.default_rng([ctx.seed, 1, key]))
        row.interval, row.adjusted, row.percentile = two.interval(), two.interval(row.level), two.percentile()
        row.t = statistics.t_interval(row.differences)
        row.note = f"shared image variance {float(two.var_images):.3g}, seed variance / n {float(two.var_seeds):.3g}"
    if row.interval is not None:
        row.method = row.interval.method + (f", B={ctx.bootstrap}" if method == statistics.TWO_LEVEL_T else "")
        row.p_adjusted = min(1.0, row.family_size * row.interval.p_value)
    row.verdict = statistics.verdict(row.adjusted)
    row.plan = _plan(row, metric, ctx)


def _given(value, metric: Metric) -> Optional[float]:
    """A number given for every metric, or for this one (by key or header) in a mapping."""
    if isinstance(value, Mapping):
        value = value.get(metric.key, value.get(metric.header))
    return None if value is None else float(value)


def _plan(row: Comparison, metric: Metric, ctx: _Context) -> Optional[statistics.SeedPlan]:
    """The seeds the row's question needs at its family's level: for the given Δ, else the paper's gain (not for an
    effect of the structure x scale design: it is no figure for one), else the observed difference; with the given
    std, else the measured one, else (one seed on COCO only) detectron2's COCO seed spread."""
    observed = abs(row.mean_difference) if math.isfinite(row.mean_difference) else 0.0
    if _given(ctx.delta, metric) is not None:
        value, delta_source = _given(ctx.delta, metric), "given"
    elif metric.key in statistics.PAPER_DELTA and row.reference != FACTORIAL:
        value, delta_source = statistics.PAPER_DELTA[metric.key], "the paper's claimed gain"
    elif observed > 0:
        value, delta_source = observed, f"the observed {'effect' if row.reference == FACTORIAL else 'difference'}"
    else:
        return None
    n, shared = len(row.differences), 0.0
    if _given(ctx.std, metric) is not None:
        spread, std_source = _given(ctx.std, metric), "given"
    elif n >= 2:
        spread, std_source = float(np.std(row.differences, ddof=1)), f"observed over {n} seeds"
        if row.interval is not None and row.interval.replication == statistics.BOTH:
            shared = max(row.interval.se**2 - spread**2 / n, 0.0)
    elif metric.key in statistics.COCO_DIFFERENCE_STD and ctx.dataset and _COCO.search(ctx.dataset.lower()):
        spread = statistics.COCO_DIFFERENCE_STD[metric.key]
        std_source = "assumed: sqrt(2) x the 0.10 AP seed std detectron2 reports for ViTDet on COCO"
    else:
        return None
    return statistics.plan_seeds(
        value,
        spread,
        delta_source=delta_source,
        std_source=std_source,
        comparisons=row.family_size,
        level=ALPHA,
        shared_variance=shared,
    )


def _reach(run: Run, ref: Run, seed: int, metric: Optional[Metric]) -> Optional[statistics.Reach]:
    """When the run first reaches the same seed's reference final value of ``metric`` (None: the smoothed loss)."""
    if metric is not None:
        return statistics.reach_of(seed, *run.curve(metric), metric.value(ref.final), ref.final_x)
    (its, _, smoothed), (ref_its, _, ref_smoothed) = run.loss(), ref.loss()  # both logged (_speedup_rows)
    return statistics.reach_of(seed, its, smoothed, float(ref_smoothed[-1]), int(ref_its[-1]), lower_is_better=True)


def _speedup_rows(
    g, pairs: Dict[int, Tuple[Run, Run]], dropped: List[str], metrics: List[Metric], reference: str
) -> List[Comparison]:
    """Per headline metric (and the training loss when every paired run logged it): the censored speed-up of each
    seed's run to the same seed's reference final value."""
    targets: List[Optional[Metric]] = list(metrics)
    if pairs and g.loss is not None and all(len(ref.loss()[0]) for _, ref in pairs.values()):
        targets.append(None)  # the smoothed training loss
    rows = []
    for m in targets:
        defined = [r for r in (_reach(*pair, s, m) for s, pair in pairs.items()) if r is not None]
        reached = {r.seed: r.speedup for r in defined if not r.censored}
        name, key = ("loss", "loss") if m is None else (m.header, m.key)
        row = Comparison(
            g.arm,
            reference,
            f"speed-up {name} (%)",
            f"{key}_speedup",
            g.lr_scale,
            SPEEDUP,
            reached,
            *statistics.mean_std(list(reached.values())),
            len(reached),
            list(pairs),
            dropped,
        )
        row.speedup = statistics.summarize_reaches(defined) if defined else None
        row.method = (
            row.speedup.method if defined else f"no {reference} final value to reach" if pairs else "no paired seeds"
        )
        censored = sorted(r.seed for r in defined if r.censored)
        if censored:
            row.note = "not reached (censored at the last evaluation) for seed " + ", ".join(map(str, censored))
        rows.append(row)
    return rows


def _comparisons(
    ctx: _Context, g, ref, why: Dict[Tuple[str, int], str], metrics: List[Metric], start: int, family: Tuple[str, int]
) -> List[Comparison]:
    """Group ``g`` against the reference group ``ref``: a row per headline metric, then the speed-up rows.
    ``why``: (arm, seed) -> what became of a failed run; ``start``: the first row's generator key; ``family``: the
    metric rows' question and its number of comparisons."""
    runs = {r.seed: r for r in g.runs if r.seed is not None}
    refs = {r.seed: r for r in ref.runs if r.seed is not None}
    pairs = {s: (runs[s], refs[s]) for s in sorted(set(runs) & set(refs))}
    dropped = [
        f"seed {s} ({name} run {why[(name, s)]})" if (name, s) in why else f"seed {s} (no {name} run)"
        for name, seeds in ((g.arm, set(refs) - set(runs)), (ref.arm, set(runs) - set(refs)))
        for s in sorted(seeds)
    ]
    rows = []
    for m in metrics:
        values = {r.seed: m.value(r.final) for r in g.runs if r.seed is not None}
        row = Comparison(
            g.arm,
            ref.arm,
            m.header,
            m.key,
            g.lr_scale,
            METRIC,
            values,
            *statistics.mean_std([m.value(r.final) for r in g.runs]),
            len(g.runs),
            list(pairs),
            dropped,
            [values[s] - m.value(refs[s].final) for s in pairs],
            *family,
        )
        key = start + len(rows)
        _fill_metric(row, ctx, [[(1.0, run), (-1.0, ref)] for run, ref in pairs.values()], m, key)
        if len(row.differences) >= 2:
            rng = np.random.default_rng([ctx.seed, 2, key])
            row.improvement = statistics.probability_of_improvement(row.differences, rng, ctx.bootstrap)
        rows.append(row)
    return rows + _speedup_rows(g, pairs, dropped, metrics, ref.arm)


def _effect_rows(ctx: _Context, by_arm: Dict[str, object], metrics: List[Metric], start: int) -> List[Comparison]:
    """The structure x scale design's main effects and interaction (:data:`~.factorial.JOINT_EFFECTS`), per headline
    metric, over the seeds every cell ran; ``by_arm``: the section's groups by arm; ``start``: the first row's key."""
    cells = {arm: {r.seed: r for r in by_arm[arm].runs if r.seed is not None} for arm in CELLS.values()}
    seeds = sorted(set.intersection(*(set(runs) for runs in cells.values())))
    dropped = []
    for s in sorted(set().union(*cells.values()) - set(seeds)):
        dropped += [f"seed {s} (no {arm} run)" for arm, runs in cells.items() if s not in runs]
    rows = []
    for m in metrics:
        for effect in JOINT_EFFECTS:
            terms = [[(w, cells[arm][s]) for arm, w in effect.weights] for s in seeds]
            values = {s: float(sum(w * m.value(run.final) for w, run in seed)) for s, seed in zip(seeds, terms)}
            row = Comparison(
                effect.name,
                FACTORIAL,
                m.header,
                m.key,
                by_arm["conditioned"].lr_scale,
                METRIC,
                values,
                *statistics.mean_std(list(values.values())),
                len(seeds),
                seeds,
                dropped,
                list(values.values()),
                STRUCTURE_SCALE,
                len(JOINT_EFFECTS) * len(metrics),
            )
            _fill_metric(row, ctx, terms, m, start + len(rows))
            rows.append(row)
    return rows


def compare_stage(
    stage: StageDescriptor,
    groups,
    failed,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    delta=None,
    std=None,
    contrasts: Sequence[Tuple[str, str]] = (),
    dataset: Optional[str] = None,
    cache_dir: Optional[str] = None,
    factorial: bool = False,
) -> List[Comparison]:
    """Every comparison of the section's ``groups`` (:class:`~.summary.ArmSummary` at its main lr scale, in arm order;
    ``failed``: its failed runs there): per arm against default, per contrast (A minus B), then with ``factorial`` the
    structure x scale design's effects; each metric row with its verdict in its question's family and its seed plan.
    ``dataset``: the runs' (one seed on COCO assumes COCO's seed spread); ``cache_dir``: where image resamples are kept;
    the rest: :func:`~condinit_det.report.compare_arms`'."""
    default = next((g for g in groups if g.arm == DEFAULT), None)
    by_arm = {g.arm: g for g in groups}
    why = {(m.arm, m.seed): m.reason for m in failed}
    ctx = _Context(bootstrap, seed, cache_dir, delta, std, dataset)

    def metrics(*arms) -> List[Metric]:
        return [m for m in stage.headline if all(math.isfinite(g.value(m.header)) for g in arms)]

    questions = {
        AGAINST_DEFAULT: [(g, default) for g in groups if default is not None and g is not default],
        BETWEEN_ARMS: [(by_arm[a], by_arm[b]) for a, b in contrasts],  # both ran: resolve_contrasts
    }
    rows: List[Comparison] = []
    # a row's generator key: its position in the list the earlier versions made (default's rows first)
    key = len(metrics(default)) if default is not None else sum(len(metrics(g)) for g in groups)
    for family, pairs in questions.items():
        size = sum(len(metrics(*pair)) for pair in pairs)
        for g, ref in pairs:
            new = _comparisons(ctx, g, ref, why, metrics(g, ref), key, (family, size))
            rows, key = rows + new, key + len(new)
    if factorial:
        rows += _effect_rows(ctx, by_arm, metrics(*(by_arm[a] for a in CELLS.values())), key)
    return rows
