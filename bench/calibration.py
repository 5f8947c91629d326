"""Calibration of the report's intervals and verdicts on simulated experiments with a known effect (docs/statistics.md).

    python bench/calibration.py --sims 2000     # the tables of docs/statistics.md

A simulated experiment has n seeds, two arms (default and one other) and N evaluation images; image i of seed s
scores ``y[a, s, i] = b_i + c_s + effect[a] + seed_part[a, s] + image_part[a, i] + noise[a, s, i]``, every part
normal, a scenario giving their sizes as standard deviations of the difference arm - default. The truths an
interval is scored against: ``population`` (the effect), ``evaluation set`` (effect + the mean image effect of
these N images) and ``images`` (effect + seed 0's seed part). Every interval comes from the report's own
functions, on arrays of simulated experiments at once; tests/test_calibration.py runs its cells with fewer.
:func:`families_calibration` runs the report's families of verdicts (one per question) on the structure x scale
design's four arms.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from tabulate import tabulate

from condinit_det.evaluation.bootstrap import image_draws, resampled_mean
from condinit_det.report.factorial import JOINT_EFFECTS, carried_by
from condinit_det.report.paired import AGAINST_DEFAULT, ALPHA, BETWEEN_ARMS, DEFAULT_CONTRASTS, STRUCTURE_SCALE
from condinit_det.report.statistics import (
    BETTER,
    IMAGE_BOOTSTRAP,
    NO_DIFFERENCE,
    PAIRED_T,
    TWO_LEVEL_T,
    WORSE,
    Interval,
    paired_t,
    probability_of_improvement,
    report_method,
    two_level_bootstrap,
    verdict,
)

# The two-level percentile interval (shown beside the verdict's, never its own) and the two-level interval with
# Welch–Satterthwaite degrees of freedom (calibrated for comparison only).
TWO_LEVEL_PERCENTILE, SATTERTHWAITE = "two-level percentile", "two-level Satterthwaite"
# The truth each interval's 95% covers: what its calibration scores it against.
METHOD_TRUTH = {IMAGE_BOOTSTRAP: "images", PAIRED_T: "evaluation set", TWO_LEVEL_T: "population"}


def satterthwaite_half_width(two, num_images: int) -> np.ndarray:
    """t(0.975, ν) sqrt(s^2 / n + v), ν = (s^2 / n + v)^2 / ((s^2 / n)^2 / (n - 1) + v^2 / (N - 1))."""
    from scipy import stats

    var, n = two.var_seeds + two.var_images, two.num_seeds
    with np.errstate(divide="ignore", invalid="ignore"):
        df = var**2 / (two.var_seeds**2 / (n - 1) + two.var_images**2 / max(num_images - 1, 1))
    return stats.t.ppf(0.975, np.where(var > 0, df, n - 1.0)) * np.sqrt(var)


def holm_adjust(p_values) -> np.ndarray:
    """Holm-adjusted p-values of families [..., m] (the report's verdicts before each question had its family: the
    power table compares them): the i-th smallest p becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    return np.take_along_axis(adjusted, np.argsort(order, axis=-1), axis=-1)


@dataclass(frozen=True)
class Scenario:
    """Sizes of the parts of a simulated difference (arm - default), in metric points."""

    name: str
    effect: float  # the known population difference
    seed_std: float  # std over training runs of a seed's difference on the image population
    image_shared_se: float  # std of the mean over the N images of the image effects common to all runs
    image_seed_se: float  # std of the mean over the N images of the image-by-run variation
    num_images: int = 100
    image_spread: float = 20.0  # std of the image difficulties b_i (cancels in the difference)

    def describe(self) -> str:
        return (
            f"{self.name}: effect {self.effect:g}, seed std {self.seed_std:g}, shared image SE "
            f"{self.image_shared_se:g}, per-run image SE {self.image_seed_se:g}, {self.num_images} images"
        )


SCENARIOS = (
    # COCO-like: the seed std of a paired difference ~0.14 AP (detectron2's ViTDet seeds: ~0.10 AP per
    # run); per-run image noise of a 5000-image evaluation below it; small image effects shared by runs.
    Scenario("COCO-like", effect=0.5, seed_std=0.15, image_shared_se=0.03, image_seed_se=0.1),
    # A small evaluation set (the demo's 64 images): per-run image noise dominates the seed spread.
    Scenario("small evaluation set", effect=0.5, seed_std=0.5, image_shared_se=0.5, image_seed_se=1.7),
    # Stress: image effects shared by every training run as large as the seed spread.
    Scenario("shared image effects", effect=0.5, seed_std=0.3, image_shared_se=0.3, image_seed_se=0.2),
    # Stress: shared image effects dominate.
    Scenario("shared image effects dominate", effect=0.5, seed_std=0.2, image_shared_se=1.0, image_seed_se=0.4),
)


@dataclass
class Simulated:
    """Per-image scores of many simulated experiments and their truths (of the first arm)."""

    default: np.ndarray  # [S, n, N]
    arms: np.ndarray  # [A, S, n, N]: arms that share the default runs (and image difficulties, seed shifts)
    population: float
    evaluation_set: np.ndarray  # [S]
    images: np.ndarray  # [S]: seed 0's pair on the image population

    @property
    def arm(self) -> np.ndarray:
        return self.arms[0]


def simulate(
    scenario: Scenario,
    num_seeds: int,
    num_sims: int,
    rng: np.random.Generator,
    num_arms: int = 1,
    effects: Optional[Sequence[float]] = None,
) -> Simulated:
    """``num_sims`` experiments of ``num_seeds`` paired seeds on ``scenario.num_images`` images; every arm
    beside the default has the scenario's effect, or its own from ``effects`` (one per arm)."""
    sc, half = scenario, np.sqrt(0.5)
    shape = (num_sims, num_seeds, sc.num_images)
    sigma_shared = sc.image_shared_se * np.sqrt(sc.num_images) * half
    sigma_noise = sc.image_seed_se * np.sqrt(sc.num_images) * half
    common = rng.normal(50.0, sc.image_spread, size=(num_sims, 1, sc.num_images)) + rng.normal(
        0.0, 1.0, size=(num_sims, num_seeds, 1)
    )
    effects = [sc.effect] * num_arms if effects is None else [float(e) for e in effects]
    if len(effects) != num_arms:
        raise ValueError(f"effects: one per arm beside the default ({num_arms}); got {len(effects)}")
    seed_parts, image_parts, scores = [], [], []
    for a in range(num_arms + 1):  # the default first
        seed_parts.append(rng.normal(0.0, sc.seed_std * half, size=(num_sims, num_seeds, 1)))
        image_parts.append(rng.normal(0.0, sigma_shared, size=(num_sims, 1, sc.num_images)))
        scores.append(
            common
            + seed_parts[-1]
            + image_parts[-1]
            + rng.normal(0.0, sigma_noise, size=shape)
            + (effects[a - 1] if a else 0.0)
        )
    seed_diff = (seed_parts[1] - seed_parts[0])[:, :, 0]
    image_diff = (image_parts[1] - image_parts[0])[:, 0, :]
    return Simulated(
        scores[0], np.stack(scores[1:]), effects[0], effects[0] + image_diff.mean(axis=-1), effects[0] + seed_diff[:, 0]
    )


def _replicates(sim: Simulated, rng: np.random.Generator, bootstrap: int) -> np.ndarray:
    """[A, S, n, B] per-seed differences of every arm on B image resamples, the same resample for every
    seed and arm (the default's included)."""
    num_sims, _, num_images = sim.default.shape
    draws = np.stack([image_draws(rng, num_images, bootstrap) for _ in range(num_sims)])[None, :, None]
    scores = resampled_mean(np.concatenate([sim.default[None], sim.arms]), draws)  # [A + 1, S, n, B]
    return scores[1:] - scores[:1]


def _covered(low, high, truth) -> float:
    return float(np.mean((low <= truth) & (truth <= high)))


def key(method: str, truth: str) -> str:
    """Coverage key ``"<method>/<truth>"``, e.g. ``"two-level t/population"``."""
    return f"{method}/{truth}"


def coverage(
    scenario: Scenario,
    num_seeds: int,
    *,
    num_sims: int = 1000,
    bootstrap: int = 400,
    rng: Optional[np.random.Generator] = None,
    chunk: int = 100,
) -> Dict[str, float]:
    """
    Coverage of the 95% intervals over ``num_sims`` simulated experiments, keyed by :func:`key`. One seed:
    the image bootstrap against the image truth and the population. Two or more: the paired t over seeds
    (against the evaluation-set truth and the population), the two-level bootstrap (percentile,
    Welch–Satterthwaite and t-scaled, against the population).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    hits: Dict[str, float] = {}
    for done in range(0, num_sims, chunk):
        size = min(chunk, num_sims - done)
        sim = simulate(scenario, num_seeds, size, rng)
        rep = _replicates(sim, rng, bootstrap)[0]
        per_seed = sim.arm.mean(axis=-1) - sim.default.mean(axis=-1)  # [S, n]
        found = {}
        if num_seeds == 1:
            low, high = np.quantile(rep[:, 0], [0.025, 0.975], axis=-1)
            found[key(IMAGE_BOOTSTRAP, "images")] = _covered(low, high, sim.images)
            found[key(IMAGE_BOOTSTRAP, "population")] = _covered(low, high, sim.population)
        else:
            _, low, high, _, _ = paired_t(per_seed)
            found[key(PAIRED_T, "evaluation set")] = _covered(low, high, sim.evaluation_set)
            found[key(PAIRED_T, "population")] = _covered(low, high, sim.population)
            two = two_level_bootstrap(per_seed, rep, rng)
            found[key(TWO_LEVEL_PERCENTILE, "population")] = _covered(
                two.percentile_low, two.percentile_high, sim.population
            )
            welch = satterthwaite_half_width(two, scenario.num_images)
            found[key(SATTERTHWAITE, "population")] = _covered(
                two.estimate - welch, two.estimate + welch, sim.population
            )
            half = two.half_width()
            found[key(TWO_LEVEL_T, "population")] = _covered(two.estimate - half, two.estimate + half, sim.population)
        for k, v in found.items():
            hits[k] = hits.get(k, 0.0) + v * size
    return {k: v / num_sims for k, v in hits.items()}


def contrast_coverage(
    scenario: Scenario,
    num_seeds: int,
    *,
    effects: Tuple[float, float] = (0.5, 0.2),
    num_sims: int = 1000,
    bootstrap: int = 400,
    rng: Optional[np.random.Generator] = None,
    chunk: int = 100,
) -> Dict[str, float]:
    """
    Coverage of a contrast between two arms A and B (n >= 2 seeds): both share the default runs (image
    difficulties and seed shifts), A has effect ``effects[0]`` and B ``effects[1]`` over default, and the
    interval is of A minus B per seed, on the same image resamples for every run (the report's pairing of a
    contrast), against the known population difference ``effects[0] - effects[1]``. Keys as :func:`coverage`:
    the paired t over seeds and the two-level bootstrap (percentile and t-scaled, the report's).
    """
    if num_seeds < 2:
        raise ValueError(f"a contrast's calibration needs >= 2 seeds; got {num_seeds}")
    rng = np.random.default_rng(3) if rng is None else rng
    truth = float(effects[0] - effects[1])
    hits: Dict[str, float] = {}
    for done in range(0, num_sims, chunk):
        size = min(chunk, num_sims - done)
        sim = simulate(scenario, num_seeds, size, rng, num_arms=2, effects=effects)
        rep = _replicates(sim, rng, bootstrap)  # [2, S, n, B] each arm minus default
        contrast_rep = rep[0] - rep[1]  # A minus B: the default's scores cancel
        per_seed = sim.arms[0].mean(axis=-1) - sim.arms[1].mean(axis=-1)  # [S, n]
        _, low, high, _, _ = paired_t(per_seed)
        two = two_level_bootstrap(per_seed, contrast_rep, rng)
        half = two.half_width()
        found = {
            key(PAIRED_T, "population"): _covered(low, high, truth),
            key(TWO_LEVEL_PERCENTILE, "population"): _covered(two.percentile_low, two.percentile_high, truth),
            key(TWO_LEVEL_T, "population"): _covered(two.estimate - half, two.estimate + half, truth),
        }
        for k, v in found.items():
            hits[k] = hits.get(k, 0.0) + v * size
    return {k: v / num_sims for k, v in hits.items()}


# Planted structure x scale designs: name -> the effects of scale_matched, structured and conditioned over default.
DESIGNS = {
    "no effect": (0.0, 0.0, 0.0),
    "scale only": (0.5, 0.0, 0.5),
    "structure only": (0.0, 0.5, 0.5),
    "interaction": (0.0, 0.0, 0.5),
}
_DESIGN_ARMS = ("scale_matched", "structured", "conditioned")  # the order of a design's effects


def _weights(terms) -> np.ndarray:
    """A row's weights on the differences of scale_matched, structured and conditioned to default (a row's weights
    sum to zero over the four arms, so the default's drops out)."""
    terms = dict(terms)
    return np.asarray([terms.get(arm, 0.0) for arm in _DESIGN_ARMS])


# The report's rows on the design's four arms, by question: (family, label, weights).
ROWS = (
    [(AGAINST_DEFAULT, arm, _weights({arm: 1.0})) for arm in _DESIGN_ARMS]
    + [(BETWEEN_ARMS, f"{a} vs {b}", _weights({a: 1.0, b: -1.0})) for a, b in DEFAULT_CONTRASTS if b in _DESIGN_ARMS]
    + [(STRUCTURE_SCALE, e.name, _weights(e.weights)) for e in JOINT_EFFECTS]
)
# The experiments the families are calibrated on, and the rows each compares: default and conditioned; the four arms
# of --arm factorial without the design's section (no structure x scale family); the four arms with it.
SETUPS = {
    "2 arms": [r for r in ROWS if r[1] == "conditioned"],
    "4 arms": [r for r in ROWS if r[0] != STRUCTURE_SCALE],
    "4 arms, factorial": list(ROWS),
}


def _expected_reading(truths: Dict[str, float]) -> str:
    """What the sentence should say when every non-zero effect is shown (:func:`carried_by`'s words)."""
    if truths["interaction"] != 0:
        return "interaction"
    shown = [name for name in ("structure", "scale") if truths[name] != 0]
    return {0: "neither", 2: "both"}.get(len(shown)) or shown[0]


def families_calibration(
    scenario: Scenario,
    num_seeds: int,
    cells: Tuple[float, float, float],
    *,
    num_metrics: int = 2,
    correlation: float = 0.7,
    num_sims: int = 1000,
    bootstrap: int = 400,
    rng: Optional[np.random.Generator] = None,
    chunk: int = 100,
) -> Dict[str, float]:
    """
    The report's verdicts, one family per question, on simulated experiments of the structure x scale design's four
    arms with the effects ``cells`` of scale_matched, structured and conditioned over default (n >= 2 seeds; the
    arms share the default's image difficulties and seed shifts; a metric after the first is ``correlation`` x the
    first + sqrt(1 - correlation^2) x an independent experiment, as box and mask AP share the detections). Every
    family holds its rows x metrics, its intervals at 1 - ALPHA / that many; a row's verdict is the report's
    (:func:`verdict` on that interval). Keys ``"<setup>/<family>/<measure>"`` for each setup of :data:`SETUPS`:

    - ``false claims``: P(a verdict better or worse on a row whose effect is 0, or of the wrong sign), the family-wise
      error;
    - ``coverage``: P(every interval of the family covers its row's effect), the simultaneous coverage;
    - ``disagreements``: the rows whose verdict and adjusted p (min(1, m p) <= ALPHA) disagree, a count;
    - ``power`` (rows with an effect): the mean P(a verdict of the right sign); ``power, Holm``: Holm over the
      family instead; ``power, one Holm family``: Holm over every row of the setup (the report before each question
      had its own family).

    Then ``coverage/<row>``: each row's 95% interval covering its effect (first metric); ``sentence wrong`` and
    ``sentence right``: the design's sentence on the first metric (:func:`carried_by` on the structure x scale
    family's verdicts), naming a factor or interaction whose effect is 0 (or with the wrong sign), or saying exactly
    what the planted effects are made of.
    """
    if num_seeds < 2:
        raise ValueError(f"the families' calibration needs >= 2 seeds; got {num_seeds}")
    rng = np.random.default_rng(5) if rng is None else rng
    weights = np.stack([w for _, _, w in ROWS])  # [R, 3]
    mix = np.sqrt(1.0 - correlation**2)
    scale = np.asarray([1.0] + [correlation + mix] * (num_metrics - 1))  # a later metric's effect
    truth = (weights @ np.asarray(cells, dtype=np.float64))[:, None, None] * scale[None, :, None]  # [R, M, 1]
    effect = {label: float(truth[r, 0, 0]) for r, (_, label, _) in enumerate(ROWS)}
    expected = _expected_reading(effect)
    hits: Dict[str, float] = {}
    for done in range(0, num_sims, chunk):
        size = min(chunk, num_sims - done)
        first = simulate(scenario, num_seeds, size, rng, num_arms=3, effects=cells)
        est, reps = [], []
        for m in range(num_metrics):
            sim = first
            if m:
                other = simulate(scenario, num_seeds, size, rng, num_arms=3, effects=cells)
                sim = Simulated(
                    correlation * first.default + mix * other.default,
                    correlation * first.arms + mix * other.arms,
                    0.0,
                    first.evaluation_set,
                    first.images,
                )
            est.append(np.einsum("ra,asn->rsn", weights, sim.arms.mean(axis=-1) - sim.default.mean(axis=-1)))
            reps.append(np.einsum("ra,asnb->rsnb", weights, _replicates(sim, rng, bootstrap)))
        two = two_level_bootstrap(np.stack(est, axis=1), np.stack(reps, axis=1), rng)  # [R, M, S]
        half, halves = two.half_width(), {}
        found = {
            f"coverage/{label}": _covered(two.estimate[r, 0] - half[r, 0], two.estimate[r, 0] + half[r, 0], truth[r, 0])
            for r, (_, label, _) in enumerate(ROWS)
        }
        for setup, rows in SETUPS.items():
            every = [ROWS.index(row) for row in rows]
            for family in dict.fromkeys(f for f, _, _ in rows):
                idx = [i for i in every if ROWS[i][0] == family]
                m = len(idx) * num_metrics
                halves[m] = halves[m] if m in halves else two.half_width(1.0 - ALPHA / m)
                est_f, h, t, p = two.estimate[idx], halves[m][idx], truth[idx], two.p_value[idx]
                said = np.vectorize(lambda e, w: verdict(Interval(e, e - w, e + w, "", num_seeds=num_seeds)))(est_f, h)
                claim, right = said != NO_DIFFERENCE, said == np.where(t > 0, BETTER, WORSE)
                name = f"{setup}/{family}"
                found[f"{name}/false claims"] = float(np.mean((claim & ((t == 0) | ~right)).any(axis=(0, 1))))
                found[f"{name}/coverage"] = float(np.mean((np.abs(est_f - t) <= h).all(axis=(0, 1))))
                # a count, not a rate: it is multiplied by the chunk's size below
                found[f"{name}/disagreements"] = np.sum(claim != (np.minimum(1.0, m * p) <= ALPHA)) / size
                real = np.broadcast_to(t != 0, est_f.shape)
                if family == AGAINST_DEFAULT and real.any():
                    right_sign = np.sign(est_f) == np.sign(t)
                    stage = _holm_over(two.p_value[every])[[every.index(i) for i in idx]]
                    found[f"{name}/power"] = float(np.mean(right[real]))
                    found[f"{name}/power, Holm"] = float(np.mean(((_holm_over(p) <= ALPHA) & right_sign)[real]))
                    found[f"{name}/power, one Holm family"] = float(np.mean(((stage <= ALPHA) & right_sign)[real]))
                if family == STRUCTURE_SCALE:
                    by_name = {ROWS[i][1]: said[k, 0] for k, i in enumerate(idx)}
                    wrong = right_hit = 0
                    for s in range(size):
                        shown = {name: v[s] for name, v in by_name.items()}
                        reading = carried_by(shown["structure"], shown["scale"], shown["interaction"])
                        claims = {"both": ["structure", "scale"], "neither": []}.get(reading, [reading])
                        bad = any(effect[c] == 0 or (effect[c] > 0) != (shown[c] == BETTER) for c in claims)
                        wrong, right_hit = wrong + bad, right_hit + (reading == expected and not bad)
                    found["sentence wrong"], found["sentence right"] = wrong / size, right_hit / size
        for k, v in found.items():
            hits[k] = hits.get(k, 0.0) + float(v) * size
    return {k: v if k.endswith("disagreements") else v / num_sims for k, v in hits.items()}


def _holm_over(p: np.ndarray) -> np.ndarray:
    """Holm over the rows x metrics [r, M, S] of each simulated experiment."""
    flat = np.moveaxis(p, -1, 0)  # [S, r, M]
    return np.moveaxis(holm_adjust(flat.reshape(len(flat), -1)).reshape(flat.shape), 0, -1)


def poi_coverage(
    num_seeds: int,
    *,
    num_sims: int = 2000,
    bootstrap: int = 400,
    effect_over_std: float = 0.5,
    rng: Optional[np.random.Generator] = None,
) -> Dict[str, float]:
    """Coverage of P(arm run > default run with the same seed) = Φ(effect / std) by the seed-bootstrap
    percentile interval and the exact (Clopper–Pearson) interval, normal per-seed differences."""
    from scipy import stats

    rng = np.random.default_rng(2) if rng is None else rng
    d = rng.normal(effect_over_std, 1.0, size=(num_sims, num_seeds))
    truth = float(stats.norm.cdf(effect_over_std))
    poi = probability_of_improvement(d, rng, bootstrap)
    return {
        "bootstrap": _covered(poi.boot_low, poi.boot_high, truth),
        "exact": _covered(poi.exact_low, poi.exact_high, truth),
    }


def report_coverage(results: Dict[int, Dict[str, float]], num_seeds: int, per_image: bool = True) -> Optional[float]:
    """The measured coverage of the interval the report uses at ``num_seeds`` (:func:`report_method`), of its truth."""
    method = report_method(num_seeds, per_image)
    return None if method is None else results[num_seeds].get(key(method, METHOD_TRUTH[method]))


COLUMNS = (
    key(IMAGE_BOOTSTRAP, "images"),
    key(IMAGE_BOOTSTRAP, "population"),
    key(PAIRED_T, "evaluation set"),
    key(PAIRED_T, "population"),
    key(TWO_LEVEL_PERCENTILE, "population"),
    key(SATTERTHWAITE, "population"),
    key(TWO_LEVEL_T, "population"),
)


def _pipe(rows: List[List[str]], header: List[str], left: int) -> str:
    """A Markdown table, its first ``left`` columns left-aligned."""
    align = ["left"] * left + ["right"] * (len(header) - left)
    return tabulate(rows, header, tablefmt="pipe", disable_numparse=True, colalign=align)


def format_table(results: Dict[str, Dict[int, Dict[str, float]]], seeds: Sequence[int]) -> str:
    """Markdown: one row per scenario and n, one column per method/truth; the report's interval in bold."""
    rows = []
    for name, by_n in results.items():
        for n in seeds:
            row, used = by_n[n], report_method(n, True)
            cells = []
            for k in COLUMNS:
                text = f"{row[k]:.3f}" if k in row else ""
                cells.append(f"**{text}**" if used and k == key(used, METHOD_TRUTH[used]) else text)
            rows.append([name, str(n), *cells])
    return _pipe(rows, ["scenario", "n", *COLUMNS], 1)


# The families of the families' table (those of "4 arms" are the same with or without the design's section).
FAMILY_COLUMNS = (
    ("2 arms", AGAINST_DEFAULT),
    ("4 arms", AGAINST_DEFAULT),
    ("4 arms", BETWEEN_ARMS),
    ("4 arms, factorial", STRUCTURE_SCALE),
)


def format_families_tables(results: Dict[Tuple[str, str, int], Dict[str, float]]) -> str:
    """Markdown, one row per scenario, design and n: per family its false-claim rate (family-wise error) and
    simultaneous coverage, and the rows whose verdict and adjusted p disagree; then the power of the 4 arms'
    against-default family, and the design's sentence and each row's 95% coverage."""
    families, power, design = [], [], []
    for (scenario, name, n), r in results.items():
        head = [scenario, name, str(n)]
        cells = [f"{r[f'{s}/{f}/false claims']:.3f} / {r[f'{s}/{f}/coverage']:.3f}" for s, f in FAMILY_COLUMNS]
        count = sum(v for k, v in r.items() if k.endswith("/disagreements"))
        families.append(head + cells + [f"{count:.0f}"])
        if f"4 arms/{AGAINST_DEFAULT}/power" in r:
            with_, without = (f"4 arms, factorial/{AGAINST_DEFAULT}/", f"4 arms/{AGAINST_DEFAULT}/")
            power.append(
                head
                + [f"{r[without + 'power']:.3f}", f"{r[with_ + 'power']:.3f}", f"{r[without + 'power, Holm']:.3f}"]
                + [f"{r[without + 'power, one Holm family']:.3f}", f"{r[with_ + 'power, one Holm family']:.3f}"]
            )
        design.append(head + [f"{r[f'coverage/{label}']:.3f}" for _, label, _ in ROWS])
        design[-1] += [f"{r['sentence wrong']:.3f}", f"{r['sentence right']:.3f}"]
    header = ["scenario", "design", "n"]
    tables = [
        _pipe(families, header + [f"{s}: {f}" for s, f in FAMILY_COLUMNS] + ["rows disagreeing"], 2),
        _pipe(
            power,
            header
            + ["per question (the report)", "with the design's section", "Holm per question"]
            + ["one Holm family", "one Holm family, with the design's section"],
            2,
        ),
        _pipe(design, header + [label for _, label, _ in ROWS] + ["sentence wrong", "sentence right"], 2),
    ]
    return "\n\n".join(tables)


def calibrate(
    *,
    num_sims: int = 1000,
    bootstrap: int = 400,
    one_seed_bootstrap: int = 1000,
    seeds: Sequence[int] = (1, 2, 3, 5, 10),
    scenarios: Sequence[Scenario] = SCENARIOS,
) -> Dict[str, Dict[int, Dict[str, float]]]:
    """
    Scenario name -> n -> :func:`coverage`, each cell with its own fixed generator (reproducible). One seed
    uses ``one_seed_bootstrap`` resamples (the report's default B: a percentile interval's 2.5% tails need
    them); two or more use ``bootstrap`` (the t-scaled interval needs only the variances).
    """
    return {
        sc.name: {
            n: coverage(
                sc,
                n,
                num_sims=num_sims,
                bootstrap=one_seed_bootstrap if n == 1 else bootstrap,
                rng=np.random.default_rng([k, n]),
            )
            for n in seeds
        }
        for k, sc in enumerate(scenarios)
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="The report's intervals and verdicts on simulated experiments.")
    parser.add_argument("--sims", type=int, default=2000, help="simulated experiments per cell (default 2000)")
    parser.add_argument(
        "--bootstrap", type=int, default=400, help="resamples per interval, two or more seeds (default 400)"
    )
    parser.add_argument(
        "--one-seed-bootstrap",
        type=int,
        default=1000,
        help="resamples per interval, one seed (default 1000, the report's)",
    )
    parser.add_argument("--seeds", default="1,2,3,5,10", help="seed counts (default 1,2,3,5,10)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.time()
    results = calibrate(
        num_sims=args.sims, bootstrap=args.bootstrap, one_seed_bootstrap=args.one_seed_bootstrap, seeds=seeds
    )
    print(format_table(results, seeds))
    print()
    for k, sc in enumerate(SCENARIOS[:2]):
        for n in (3, 10):
            con = contrast_coverage(
                sc, n, num_sims=args.sims, bootstrap=args.bootstrap, rng=np.random.default_rng([11, k, n])
            )
            print(
                f"contrast A - B (effects 0.5, 0.2), {sc.name}, n = {n}: two-level t "
                f"{con[key(TWO_LEVEL_T, 'population')]:.3f}, two-level percentile "
                f"{con[key(TWO_LEVEL_PERCENTILE, 'population')]:.3f}, "
                f"paired t {con[key(PAIRED_T, 'population')]:.3f}"
            )
    print()
    families = {
        (sc.name, design, n): families_calibration(
            sc, n, cells, num_sims=args.sims, bootstrap=args.bootstrap, rng=np.random.default_rng([13, k, d, n])
        )
        for k, sc in enumerate(SCENARIOS[:2])
        for d, (design, cells) in enumerate(DESIGNS.items())
        for n in (3, 5, 10)
    }
    print("families of verdicts (false claims / simultaneous coverage), power, the design (effects 0.5 where planted):")
    print(format_families_tables(families))
    print()
    for n in (3, 5, 10):
        poi = poi_coverage(n, num_sims=args.sims, rng=np.random.default_rng([9, n]))
        print(f"P(improvement) interval coverage, n = {n}: bootstrap {poi['bootstrap']:.3f}, exact {poi['exact']:.3f}")
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
