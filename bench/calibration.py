"""Calibration of the report's intervals on simulated experiments with a known effect (docs/statistics.md).

    python bench/calibration.py --sims 2000     # the tables of docs/statistics.md, then the contrasts

A simulated experiment has n seeds, two arms (default and one other) and N evaluation images; image i of seed s
scores ``y[a, s, i] = b_i + c_s + effect[a] + seed_part[a, s] + image_part[a, i] + noise[a, s, i]``, every part
normal, a scenario giving their sizes as standard deviations of the difference arm - default. The truths an
interval is scored against: ``population`` (the effect), ``evaluation set`` (effect + the mean image effect of
these N images) and ``images`` (effect + seed 0's seed part). Every interval comes from the report's own
functions, on arrays of simulated experiments at once; tests/test_calibration.py runs its cells with fewer.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from tabulate import tabulate

from condinit_det.evaluation.bootstrap import image_draws, resampled_mean
from condinit_det.report.factorial import EFFECTS, carried_by
from condinit_det.report.statistics import (
    BETTER,
    IMAGE_BOOTSTRAP,
    METHOD_TRUTH,
    NO_DIFFERENCE,
    PAIRED_T,
    TWO_LEVEL_PERCENTILE,
    TWO_LEVEL_T,
    WORSE,
    holm_adjust,
    paired_t,
    probability_of_improvement,
    report_method,
    two_level_bootstrap,
)

# The two-level interval with Welch–Satterthwaite degrees of freedom: calibrated for comparison only.
SATTERTHWAITE = "two-level Satterthwaite"


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
            two = two_level_bootstrap(per_seed, rep, rng, num_images=scenario.num_images)
            found[key(TWO_LEVEL_PERCENTILE, "population")] = _covered(
                two.percentile_low, two.percentile_high, sim.population
            )
            found[key(SATTERTHWAITE, "population")] = _covered(
                two.satterthwaite_low, two.satterthwaite_high, sim.population
            )
            found[key(TWO_LEVEL_T, "population")] = _covered(two.low, two.high, sim.population)
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
        two = two_level_bootstrap(per_seed, contrast_rep, rng, num_images=scenario.num_images)
        found = {
            key(PAIRED_T, "population"): _covered(low, high, truth),
            key(TWO_LEVEL_PERCENTILE, "population"): _covered(two.percentile_low, two.percentile_high, truth),
            key(TWO_LEVEL_T, "population"): _covered(two.low, two.high, truth),
        }
        for k, v in found.items():
            hits[k] = hits.get(k, 0.0) + v * size
    return {k: v / num_sims for k, v in hits.items()}


def family_wise_error(
    num_seeds: int,
    *,
    num_arms: int = 2,
    num_metrics: int = 2,
    num_sims: int = 1000,
    bootstrap: int = 400,
    scenario: Scenario = SCENARIOS[0],
    correlation: float = 0.7,
    rng: Optional[np.random.Generator] = None,
    alpha: float = 0.05,
    chunk: int = 100,
) -> Dict[str, float]:
    """
    Probability of at least one false verdict when no arm differs from default (every effect 0), with and
    without Holm, over a family of ``num_arms`` x ``num_metrics`` comparisons. The arms share the default
    runs; a metric after the first is ``correlation`` x the first + sqrt(1 - correlation^2) x an independent
    experiment, as box and mask AP share the detections. p-values: the two-level t-scaled interval's (the
    report's method at n >= 2).
    """
    rng = np.random.default_rng(1) if rng is None else rng
    null = Scenario(
        scenario.name, 0.0, scenario.seed_std, scenario.image_shared_se, scenario.image_seed_se, scenario.num_images
    )
    chunks = []
    for done in range(0, num_sims, chunk):
        size = min(chunk, num_sims - done)
        first = simulate(null, num_seeds, size, rng, num_arms)
        p = []
        for m in range(num_metrics):
            if m == 0:
                sim = first
            else:
                other = simulate(null, num_seeds, size, rng, num_arms)
                w = np.sqrt(1.0 - correlation**2)
                sim = Simulated(
                    correlation * first.default + w * other.default,
                    correlation * first.arms + w * other.arms,
                    0.0,
                    first.evaluation_set,
                    first.images,
                )
            rep = _replicates(sim, rng, bootstrap)  # [A, S, n, B]
            per_seed = sim.arms.mean(axis=-1) - sim.default.mean(axis=-1)  # [A, S, n]
            p.append(two_level_bootstrap(per_seed, rep, rng, num_images=null.num_images).p_value)  # [A, S]
        chunks.append(np.concatenate(p, axis=0).T)  # [S, family]
    p_values = np.concatenate(chunks)
    return {
        "raw": float(np.mean((p_values <= alpha).any(axis=-1))),
        "holm": float(np.mean((holm_adjust(p_values) <= alpha).any(axis=-1))),
    }


# Planted structure x scale designs: name -> the effects of scale_matched, structured and conditioned over default.
DESIGNS = {
    "no effect": (0.0, 0.0, 0.0),
    "scale only": (0.5, 0.0, 0.5),
    "structure only": (0.0, 0.5, 0.5),
    "interaction": (0.0, 0.0, 0.5),
}
_DESIGN_ARMS = ("scale_matched", "structured", "conditioned")  # the order of a design's effects


def _expected_reading(truths: Dict[str, float]) -> str:
    """What the sentence should say when every non-zero effect is shown (:func:`carried_by`'s words)."""
    if truths["interaction"] != 0:
        return "interaction"
    shown = [name for name in ("structure", "scale") if truths[name] != 0]
    return {0: "neither", 2: "both"}.get(len(shown)) or shown[0]


def factorial_calibration(
    scenario: Scenario,
    num_seeds: int,
    cells: Tuple[float, float, float],
    *,
    num_sims: int = 1000,
    bootstrap: int = 400,
    rng: Optional[np.random.Generator] = None,
    alpha: float = 0.05,
    chunk: int = 100,
) -> Dict[str, float]:
    """
    The structure x scale design on simulated experiments whose scale_matched, structured and conditioned arms have
    the effects ``cells`` over default (n >= 2 seeds; the four arms share the default's image difficulties and seed
    shifts). Per effect of :data:`EFFECTS`, the coverage of the report's interval (two-level t-scaled, from the
    effect's per-seed sums and their image resamples) of its known value (``"coverage/<effect>"``). Then the
    section's sentence (:func:`carried_by` on the Holm verdicts of the design's seven effects, the family's part the
    sentence reads): ``"sentence wrong"``, how often it names a factor or an interaction whose effect is zero, or
    gives one the wrong sign; ``"sentence right"``, how often it says exactly what the planted effects are made of.
    """
    if num_seeds < 2:
        raise ValueError(f"the design's calibration needs >= 2 seeds; got {num_seeds}")
    rng = np.random.default_rng(5) if rng is None else rng
    value = dict(zip(_DESIGN_ARMS, map(float, cells)), default=0.0)
    truths = {e.name: sum(w * value[arm] for arm, w in e.weights) for e in EFFECTS}
    expected = _expected_reading(truths)
    names = [e.name for e in EFFECTS]
    weights = np.asarray([[dict(e.weights).get(arm, 0.0) for arm in _DESIGN_ARMS] for e in EFFECTS])  # [7, 3]
    hits: Dict[str, float] = {}
    for done in range(0, num_sims, chunk):
        size = min(chunk, num_sims - done)
        sim = simulate(scenario, num_seeds, size, rng, num_arms=3, effects=cells)
        # every effect's weights sum to zero: its value is the weighted sum of the arms' differences to default
        per_seed = np.einsum("ea,asn->esn", weights, sim.arms.mean(axis=-1) - sim.default.mean(axis=-1))
        rep = np.einsum("ea,asnb->esnb", weights, _replicates(sim, rng, bootstrap))
        two = two_level_bootstrap(per_seed, rep, rng, num_images=scenario.num_images)  # [7, S]
        found = {f"coverage/{n}": _covered(two.low[i], two.high[i], truths[n]) for i, n in enumerate(names)}
        p_holm = holm_adjust(two.p_value.T)  # [S, 7]
        shown = np.where(p_holm <= alpha, np.where(two.estimate.T > 0, BETTER, WORSE), NO_DIFFERENCE)
        wrong = right = 0
        for verdicts in shown:
            by_name = dict(zip(names, verdicts))
            said = carried_by(by_name["structure"], by_name["scale"], by_name["interaction"])
            claims = {"both": ["structure", "scale"], "neither": []}.get(said, [said])
            wrong += any(truths[c] == 0 or (truths[c] > 0) != (by_name[c] == BETTER) for c in claims)
            right += said == expected and not any((truths[c] > 0) != (by_name[c] == BETTER) for c in claims)
        found["sentence wrong"], found["sentence right"] = wrong / size, right / size
        for k, v in found.items():
            hits[k] = hits.get(k, 0.0) + v * size
    return {k: v / num_sims for k, v in hits.items()}


def format_factorial_table(results: Dict[Tuple[str, str, int], Dict[str, float]]) -> str:
    """Markdown: one row per scenario, design and n: each effect's coverage, then the sentence's error and hit rates."""
    effects = [e.name for e in EFFECTS]
    rows = [
        [scenario, design, str(n)]
        + [f"{row[f'coverage/{e}']:.3f}" for e in effects]
        + [f"{row['sentence wrong']:.3f}", f"{row['sentence right']:.3f}"]
        for (scenario, design, n), row in results.items()
    ]
    return tabulate(
        rows,
        ["scenario", "design", "n", *effects, "sentence wrong", "sentence right"],
        tablefmt="pipe",
        disable_numparse=True,
        colalign=["left", "left"] + ["right"] * (len(effects) + 3),
    )


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
    return tabulate(
        rows,
        ["scenario", "n", *COLUMNS],
        tablefmt="pipe",
        disable_numparse=True,
        colalign=["left"] + ["right"] * (len(COLUMNS) + 1),
    )


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
    parser = argparse.ArgumentParser(description="Coverage of the report's 95% intervals on simulated experiments.")
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
    for n in (2, 3, 5, 10):
        fwe = family_wise_error(n, num_sims=args.sims, rng=np.random.default_rng([7, n]))
        print(f"family-wise error, 2 arms x 2 metrics, n = {n}: without Holm {fwe['raw']:.3f}, Holm {fwe['holm']:.3f}")
    print()
    for k, sc in enumerate(SCENARIOS[:2]):
        for n in (3, 10):
            con = contrast_coverage(sc, n, num_sims=args.sims, rng=np.random.default_rng([11, k, n]))
            print(
                f"contrast A - B (effects 0.5, 0.2), {sc.name}, n = {n}: two-level t "
                f"{con[key(TWO_LEVEL_T, 'population')]:.3f}, two-level percentile "
                f"{con[key(TWO_LEVEL_PERCENTILE, 'population')]:.3f}, "
                f"paired t {con[key(PAIRED_T, 'population')]:.3f}"
            )
    print()
    factorial = {
        (sc.name, design, n): factorial_calibration(
            sc, n, cells, num_sims=args.sims, rng=np.random.default_rng([13, k, d, n])
        )
        for k, sc in enumerate(SCENARIOS[:2])
        for d, (design, cells) in enumerate(DESIGNS.items())
        for n in (3, 5, 10)
    }
    print("structure x scale design (effects 0.5 where planted):")
    print(format_factorial_table(factorial))
    print()
    for n in (3, 5, 10):
        poi = poi_coverage(n, num_sims=args.sims, rng=np.random.default_rng([9, n]))
        print(f"P(improvement) interval coverage, n = {n}: bootstrap {poi['bootstrap']:.3f}, exact {poi['exact']:.3f}")
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
