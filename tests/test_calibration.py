"""Calibration of the report's intervals and verdicts on simulated experiments with a known effect.

Each cell is simulated experiments run through the report's own functions (vectorized), with fixed generators;
docs/statistics.md has the tables (``python bench/calibration.py``, 2000 each).
"""

import os
import sys

import numpy as np
import pytest
from table_text import unpadded

from condinit_det.records.per_image import write_classification_eval
from condinit_det.records.results import ResultsFile
from condinit_det.report import compare_arms

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from calibration import (  # noqa: E402  (bench/calibration.py: the simulation study)
    DESIGNS,
    ROWS,
    SCENARIOS,
    SETUPS,
    TWO_LEVEL_PERCENTILE,
    calibrate,
    contrast_coverage,
    families_calibration,
    holm_adjust,
    key,
    poi_coverage,
    report_coverage,
)

from condinit_det.report.paired import AGAINST_DEFAULT, BETWEEN_ARMS
from condinit_det.report.statistics import IMAGE_BOOTSTRAP, PAIRED_T, TWO_LEVEL_T, report_method

SEEDS = (1, 2, 3, 5, 10)
# Realistic regimes: the tests hold the report's interval to [0.93, 0.97]. The stress regimes (image effects
# shared by every training run as large as the seed spread, or larger) make the two-level t-scaled interval
# conservative at 2-3 seeds (the fiducial side of the Behrens–Fisher problem): there it is held to >= 0.93.
REALISTIC = ("COCO-like", "small evaluation set")


@pytest.fixture(scope="module")
def results():
    return calibrate(num_sims=1000, seeds=SEEDS)


def test_the_report_uses_a_calibrated_interval_at_every_number_of_seeds(results):
    assert {sc.name for sc in SCENARIOS} >= set(REALISTIC)
    for sc in SCENARIOS:
        for n in SEEDS:
            measured = report_coverage(results[sc.name], n)
            assert measured >= 0.93, (sc.name, n, measured)
            if sc.name in REALISTIC or n >= 5:
                assert measured <= 0.97, (sc.name, n, measured)
            # without per-image data the report's interval is the t over seeds: exact for the evaluation set
            if n >= 2:
                assert report_method(n, per_image=False) == PAIRED_T
                assert 0.93 <= results[sc.name][n][key(PAIRED_T, "evaluation set")] <= 0.97, (sc.name, n)


def test_one_seed_is_an_image_level_statement(results, tmp_path):
    assert report_method(1, per_image=True) == IMAGE_BOOTSTRAP and report_method(1, per_image=False) is None
    for sc in SCENARIOS:
        # it covers this trained pair on the population of images ...
        assert 0.93 <= results[sc.name][1][key(IMAGE_BOOTSTRAP, "images")] <= 0.97, sc.name
    # ... not the initialization's effect when seeds vary more than images (COCO-like: far below 0.93)
    assert results["COCO-like"][1][key(IMAGE_BOOTSTRAP, "population")] < 0.8

    # and the report words it that way: a one-seed comparison with per-image data and a clear difference
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=400)
    for arm, p in (("default", 0.5), ("conditioned", 0.7)):
        run = tmp_path / arm / "seed0"
        correct = rng.uniform(size=labels.size) < p
        path = write_classification_eval(
            str(run), 4, labels=labels, top1=np.where(correct, labels, (labels + 1) % 5), top5_hit=np.ones(labels.size)
        )
        ResultsFile(str(run)).add(
            {
                "kind": "cls",
                "stage": "pretrain",
                "iteration": 40,
                "epoch": 4,
                "top1": 100 * correct.mean(),
                "top5": 100.0,
                "arm": arm,
                "seed": 0,
                "per_image": os.path.relpath(path, str(run)),
            }
        )
    report, text = compare_arms([str(tmp_path)], bootstrap=1000)
    row = report.primary.comparisons[0]
    assert row.interval.replication == "images" and row.interval.low > 0 and row.verdict == "too few seeds"
    assert (
        f"| conditioned | top-1 | {row.mean_difference:+.1f} | | too few seeds | | 1 | one seed: no interval over "
        "training runs |" in unpadded(text)
    )


def test_the_percentile_interval_of_the_two_level_bootstrap_undercovers_at_few_seeds(results):
    # the reason the report t-scales it: with 2 seeds (3 distinct resamples) it misses far more than 5%
    assert results["COCO-like"][2][key(TWO_LEVEL_PERCENTILE, "population")] < 0.93
    # and the t over seeds misses the image effects every run shares once they matter
    assert results["shared image effects dominate"][10][key(PAIRED_T, "population")] < 0.5
    assert results["shared image effects dominate"][10][key(TWO_LEVEL_T, "population")] >= 0.93


def test_a_contrast_between_two_arms_is_calibrated():
    # conditioned vs scale_matched in simulation: two arms sharing the default runs, effects 0.5 and 0.2 over
    # default; the report's interval of their per-seed difference (the same image resamples for every run) covers
    # the known difference 0.3
    cov = contrast_coverage(SCENARIOS[0], 3, effects=(0.5, 0.2), num_sims=1000, rng=np.random.default_rng([11, 0, 3]))
    assert report_method(3, per_image=True) == TWO_LEVEL_T
    assert 0.93 <= cov[key(TWO_LEVEL_T, "population")] <= 0.97, cov
    assert 0.93 <= cov[key(PAIRED_T, "population")] <= 0.97, cov  # COCO-like: shared image effects are small


def test_probability_of_improvement_intervals():
    cov = poi_coverage(10, num_sims=2000, rng=np.random.default_rng([9, 10]))
    assert cov["exact"] >= 0.95  # Clopper-Pearson: at least the level by construction
    assert cov["bootstrap"] < 0.93  # rliable's percentile interval over 10 seeds: shown, never a verdict


def test_each_question_is_a_family_of_its_own_whose_intervals_agree_with_its_verdicts():
    # No effect anywhere, 3 seeds, the four arms of --arm factorial and two metrics (as box and mask AP): in every
    # family (against default, between two arms, structure x scale) a false verdict at most 5% of the time and
    # every interval covering its effect together at least 95%; no verdict against its adjusted p.
    null = families_calibration(
        SCENARIOS[0], 3, DESIGNS["no effect"], num_sims=400, bootstrap=100, rng=np.random.default_rng([13, 0, 0, 3])
    )
    for setup, rows in SETUPS.items():
        for family in {f for f, _, _ in rows}:
            assert null[f"{setup}/{family}/false claims"] <= 0.05, (setup, family, null)
            assert null[f"{setup}/{family}/coverage"] >= 0.95, (setup, family, null)
            assert null[f"{setup}/{family}/disagreements"] == 0, (setup, family, null)
    assert null["sentence wrong"] <= 0.05
    # asking more takes no answer away: the design's section leaves the other families' verdicts as they were ...
    scale = families_calibration(
        SCENARIOS[0], 3, DESIGNS["scale only"], num_sims=200, bootstrap=100, rng=np.random.default_rng([13, 0, 1, 3])
    )
    for result in (null, scale):
        for k in [k for k in result if k.startswith("4 arms/") and "one Holm family" not in k]:
            assert result[k] == result[k.replace("4 arms/", "4 arms, factorial/")], k
    with_, without = f"4 arms, factorial/{AGAINST_DEFAULT}/", f"4 arms/{AGAINST_DEFAULT}/"
    assert scale[with_ + "power"] == scale[without + "power"] > 0.2
    # ... where one Holm family over the stage lost power to it
    assert scale[with_ + "power, one Holm family"] < scale[without + "power, one Holm family"]
    assert scale["sentence wrong"] <= 0.05 and scale["sentence right"] > 0.1
    assert {label for f, label, _ in ROWS if f == BETWEEN_ARMS} == {
        "conditioned vs scale_matched",
        "conditioned vs structured",
    }


def test_holm_known_answer():
    # sorted p 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06, 0.5 (step-down, monotone); one family per row
    assert holm_adjust([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert np.allclose(holm_adjust([[0.01, 0.04], [0.3, 0.6]]), [[0.02, 0.04], [0.6, 0.6]])
