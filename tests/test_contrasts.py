"""Contrasts between two arms other than default (A vs B, paired by seed, a family of their own), and how the report
shows them, speed-ups no seed reached and the seeds each question needs."""

import csv
import importlib.util
import json
import math
import os

import numpy as np
import pytest
from scipy import stats as scipy_stats
from table_text import unpadded

from condinit_det.evaluation.bootstrap import image_draws, resampled_mean
from condinit_det.records.per_image import write_classification_eval
from condinit_det.records.results import ResultsFile
from condinit_det.report import DEFAULT_CONTRASTS, compare_arms, find_runs, summarize_runs
from condinit_det.report.paired import parse_contrast, resolve_contrasts
from condinit_det.report.statistics import seeds_needed, t_interval, two_level_bootstrap

T_975_2 = 4.302652729911275  # Student t quantile 0.975, 2 degrees of freedom
ITERS = (100, 200, 300, 400)

# Final box AP per arm and seed; mask AP is box AP - 2 + MASK_SHIFT[arm][seed]
BOX = {
    "default": [40.0, 41.0, 42.0],
    "mimetic": [39.0, 40.0, 41.0],  # 1 below default in every seed: never reaches its final value
    "conditioned": [42.0, 43.5, 44.0],  # default + 2, 2.5, 2
    "scale_matched": [41.5, 43.0, 44.2],
}  # conditioned - scale_matched: 0.5, 0.5, -0.2
MASK_SHIFT = {
    "default": [0.0, 0.0, 0.0],
    "mimetic": [0.0, 0.5, 0.0],
    "conditioned": [0.3, 0.0, 0.0],
    "scale_matched": [0.0, 0.0, 0.6],
}


def _write_run(path, arm, seed, final_box, final_mask):
    """A detection run whose AP climbs to its final value: v - 15, v - 8, v - 1, v at ITERS."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "condinit_arm_report.json"), "w") as f:
        json.dump({"run": {"arm": arm, "seed": seed, "arm_seed": seed, "lr_scale": 1.0}, "arm": arm, "sites": []}, f)
    rf = ResultsFile(path)
    for it, step in zip(ITERS, (15.0, 8.0, 1.0, 0.0)):
        b, m = final_box - step, final_mask - step
        rf.add(
            {
                "kind": "ap",
                "stage": "detection",
                "iteration": it,
                "arm": arm,
                "seed": seed,
                "config": "cfg.py",
                "bbox": {"AP": b, "AP50": b + 20, "AP75": b + 5, "APs": b, "APm": b, "APl": b},
                "segm": {"AP": m, "AP50": m + 20, "AP75": m + 5, "APs": m, "APm": m, "APl": m},
            }
        )


def _experiment(root, box=BOX, mask_shift=MASK_SHIFT):
    for arm, values in box.items():
        for seed, v in enumerate(values):
            _write_run(str(root / arm / f"seed{seed}"), arm, seed, v, v - 2.0 + mask_shift[arm][seed])
    return root


def _mask(arm):
    return [v - 2.0 + s for v, s in zip(BOX[arm], MASK_SHIFT[arm])]


def _row(report, arm, metric, reference="default"):
    return next(s for s in report.primary.stats if (s.arm, s.metric, s.reference) == (arm, metric, reference))


def test_contrast_interval_p_and_family_known_answer(tmp_path):
    report, text = compare_arms([str(_experiment(tmp_path / "exp"))], bootstrap=0)
    det = report.primary
    assert list(dict.fromkeys(s.label for s in det.comparisons if s.reference != "default")) == [
        "conditioned vs scale_matched",
        "conditioned vs mimetic",
    ]
    c = _row(report, "conditioned", "AP^b", "scale_matched")
    assert c.label == "conditioned vs scale_matched" and c.kind == "metric"
    assert c.paired_seeds == [0, 1, 2] and c.differences == pytest.approx([0.5, 0.5, -0.2])
    d = np.array([0.5, 0.5, -0.2])
    half = T_975_2 * d.std(ddof=1) / math.sqrt(3)
    assert (c.interval.low, c.interval.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert c.interval.unit == "training runs" and c.method == "paired t-interval over 3 seeds"
    assert c.interval.p_value == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue)
    # P(conditioned run > scale_matched run, same seed): 2 of 3 seeds
    assert float(c.improvement.estimate) == pytest.approx(2 / 3)

    # two families: 3 arms x {AP^b, AP^m} against default (6), then 2 contrasts x {AP^b, AP^m} between two arms (4)
    assert [(f.label, f.metric, f.family, f.family_size) for f in det.comparisons] == [
        ("mimetic", "AP^b", "against default", 6),
        ("mimetic", "AP^m", "against default", 6),
        ("conditioned", "AP^b", "against default", 6),
        ("conditioned", "AP^m", "against default", 6),
        ("scale_matched", "AP^b", "against default", 6),
        ("scale_matched", "AP^m", "against default", 6),
        ("conditioned vs scale_matched", "AP^b", "between two arms", 4),
        ("conditioned vs scale_matched", "AP^m", "between two arms", 4),
        ("conditioned vs mimetic", "AP^b", "between two arms", 4),
        ("conditioned vs mimetic", "AP^m", "between two arms", 4),
    ]
    by_hand = []
    for f in det.comparisons:
        ref = f.reference
        a = BOX[f.arm] if f.metric == "AP^b" else _mask(f.arm)
        b = BOX[ref] if f.metric == "AP^b" else _mask(ref)
        diffs = np.subtract(a, b)
        assert f.differences == pytest.approx(diffs)
        by_hand.append(
            1.0
            if np.all(diffs == diffs[0]) and diffs[0] == 0
            else (0.0 if np.all(diffs == diffs[0]) else scipy_stats.ttest_1samp(diffs, 0.0).pvalue)
        )
    for f, p in zip(det.comparisons, by_hand):
        # Bonferroni within the row's family: p times its size, the interval at 1 - 0.05 / its size, which the
        # verdict reads and which excludes 0 exactly where the adjusted p is at most 0.05
        assert f.p_adjusted == pytest.approx(min(1.0, f.family_size * p))
        wide = t_interval(f.differences, 1 - 0.05 / f.family_size)
        assert (f.adjusted.low, f.adjusted.high) == pytest.approx((wide.low, wide.high)), f.label
        assert (f.verdict in ("better", "worse")) == (f.p_adjusted <= 0.05) == (wide.low > 0 or wide.high < 0)
    assert c.p_adjusted == 1.0 and c.verdict == "no difference shown"
    # conditioned vs mimetic: +3, +3.5, +3 box AP, p = 0.0028: 4 p <= 0.05, its 98.75% interval clear of 0
    cm = _row(report, "conditioned", "AP^b", "mimetic")
    assert cm.differences == pytest.approx([3.0, 3.5, 3.0]) and cm.adjusted.low > 0 and cm.adjusted.level == 0.9875
    assert cm.p_adjusted == pytest.approx(4 * cm.interval.p_value) and cm.verdict == "better"

    # each plan counts its own family
    assert c.plan.comparisons == 4 and c.plan.delta_source == "the paper's claimed gain"
    assert (
        "  - between two arms: conditioned vs scale_matched × {AP^b, AP^m}; conditioned vs mimetic × {AP^b, AP^m} (4 "
        "comparisons, intervals at 98.75%)" in text
    )

    # the censored speed-up of conditioned to scale_matched's final value: seeds 0 and 1 reach it at the last
    # evaluation (0 %), seed 2 never does (censored: below 0 %); Kaplan–Meier median of 3: 0.0
    sp = _row(report, "conditioned", "speed-up AP^b (%)", "scale_matched")
    assert sp.values == {0: 0.0, 1: 0.0} and (sp.speedup.n, sp.speedup.reached) == (3, 2)
    assert sp.speedup.estimate.speedup == 0.0 and not sp.speedup.estimate.censored
    assert sp.speedup.low.censored and sp.speedup.coverage == pytest.approx(0.75)
    assert sp.kind == "speedup" and sp.verdict == ""


def _first_table(text):
    """The rows of report.md's first table, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start:end] if not line.startswith("|:")]


def test_contrasts_in_the_first_table_and_their_question(tmp_path):
    _, text = compare_arms([str(_experiment(tmp_path / "nd"))], bootstrap=0)
    rows = {(r[0], r[1]): r[2:] for r in _first_table(text)[1:]}
    # the same rows as the comparisons with default, A minus B: the interval at the family's level (4 comparisons),
    # then the unadjusted one
    wide = t_interval([0.5, 0.5, -0.2], 0.9875)
    assert rows[("conditioned vs scale_matched", "AP^b")] == [
        f"+0.3 [{wide.low:+.1f}, {wide.high:+.1f}]",
        "98.75%",
        "no difference shown",
        "[-0.7, +1.3]",
        "3",
        "training runs",
    ]
    assert rows[("conditioned vs mimetic", "AP^b")][1:] == ["98.75%", "better", "[+2.4, +3.9]", "3", "training runs"]
    assert "conditioned vs scale_matched asks whether the conditioning adds anything to the weights' scale" in text
    # the detail table: p, the adjusted p and P(A run > B run) beside the interval
    table = unpadded(text.split("### Paired statistics")[1].split("\n### ")[0])
    p = scipy_stats.ttest_1samp([0.5, 0.5, -0.2], 0.0).pvalue  # 0.371, x 4 (module test above)
    assert (
        f"| conditioned vs scale_matched | AP^b | 43.2 ± 1.0 | {p:.3f} | 1.000 | [-0.7, +1.3] | | 0.67 "
        "(bootstrap off; exact [" in table
    )

    # the other direction, asked for: the same test from scale_matched's side
    box = {**BOX, "scale_matched": [39.0, 40.4, 41.1]}  # conditioned - scale_matched: 3.0, 3.1, 2.9
    report, text = compare_arms(
        [str(_experiment(tmp_path / "better", box=box))], bootstrap=0, contrasts=[("scale_matched", "conditioned")]
    )
    r = _row(report, "scale_matched", "AP^b", "conditioned")
    assert r.differences == pytest.approx([-3.0, -3.1, -2.9]) and r.verdict == "worse"
    assert [s.label for s in report.primary.comparisons if s.reference != "default"][::2] == [
        "conditioned vs mimetic",
        "scale_matched vs conditioned",
    ]
    row = ["scale_matched vs conditioned", "AP^b", "98.75%", "worse", "[-3.2, -2.8]", "3", "training runs"]
    assert [r[:2] + r[3:] for r in _first_table(text)].count(row) == 1


def test_contrast_with_per_image_data_gets_the_two_level_interval(tmp_path):
    rng = np.random.default_rng(5)
    num_images, bootstrap, seed = 200, 300, 4
    labels = rng.integers(0, 5, size=num_images)
    correct = {}
    for arm, p in (("default", 0.5), ("conditioned", 0.62), ("scale_matched", 0.58)):
        for s in range(3):
            hit = rng.uniform(size=num_images) < p + 0.03 * s
            correct[(arm, s)] = hit
            run = tmp_path / "pre" / arm / f"seed{s}"
            path = write_classification_eval(
                str(run), 4, labels=labels, top1=np.where(hit, labels, (labels + 1) % 5), top5_hit=np.ones(num_images)
            )
            ResultsFile(str(run)).add(
                {
                    "kind": "cls",
                    "stage": "pretrain",
                    "iteration": 40,
                    "epoch": 4,
                    "top1": 100 * hit.mean(),
                    "top5": 100.0,
                    "arm": arm,
                    "seed": s,
                    "per_image": os.path.relpath(path, str(run)),
                }
            )
    report, text = compare_arms([str(tmp_path / "pre")], bootstrap=bootstrap, seed=seed)
    sr = report.stage("pretrain")
    # no mimetic runs: that default contrast is left out
    assert [s.label for s in sr.comparisons if s.reference != "default"] == ["conditioned vs scale_matched"]
    row = next(s for s in sr.stats if s.reference != "default" and s.metric == "top-1")
    diffs = [100 * (correct[("conditioned", s)].mean() - correct[("scale_matched", s)].mean()) for s in range(3)]
    assert row.differences == pytest.approx(diffs)
    assert row.interval.unit == "training runs and evaluation images"
    # by hand: the stage's image resamples, the same for every run; A minus B on each; the row's generator
    draws = image_draws(np.random.default_rng(seed), num_images, bootstrap)
    reps = np.stack(
        [
            resampled_mean(100.0 * correct[("conditioned", s)], draws)
            - resampled_mean(100.0 * correct[("scale_matched", s)], draws)
            for s in range(3)
        ]
    )
    two = two_level_bootstrap(np.asarray(diffs), reps, np.random.default_rng([seed, 1, sr.stats.index(row)]))
    assert (row.interval.low, row.interval.high) == pytest.approx((two.interval().low, two.interval().high))
    assert row.interval.p_value == pytest.approx(float(two.p_value))
    # families: 2 arms against default, top-1 each; the contrast alone in its own, at 95%
    assert [(f.label, f.metric, f.family_size) for f in sr.comparisons] == [
        ("conditioned", "top-1", 2),
        ("scale_matched", "top-1", 2),
        ("conditioned vs scale_matched", "top-1", 1),
    ]
    assert (
        "  - against default: conditioned × {top-1}; scale_matched × {top-1} (2 comparisons, intervals at 97.5%)"
        in text
    )
    assert "  - between two arms: conditioned vs scale_matched × {top-1} (1 comparison, intervals at 95%)" in text
    iv = two.interval()
    assert row.adjusted == row.interval and [
        "conditioned vs scale_matched",
        "top-1",
        f"{row.mean_difference:+.1f} [{iv.low:+.1f}, {iv.high:+.1f}]",
        "95%",
        row.verdict,
        f"[{iv.low:+.1f}, {iv.high:+.1f}]",
        "3",
        "training runs and evaluation images",
    ] in _first_table(text)


def test_unreached_speedup_reads_as_such(tmp_path):
    report, text = compare_arms([str(_experiment(tmp_path / "exp"))], bootstrap=0)
    sp = _row(report, "mimetic", "speed-up AP^b (%)")
    assert (sp.speedup.n, sp.speedup.reached) == (3, 0) and sp.values == {} and math.isnan(sp.mean)
    assert sp.note == "not reached (censored at the last evaluation) for seed 0, 1, 2"
    # report.md: the seed-mean curve never reaches default's final value either
    assert "| AP^b | 41.0 at iteration 400 | 400 (0.0%) | not reached |" in unpadded(text)
    # the same in stats.csv: nothing reached, every bound censored
    out = tmp_path / "r"
    compare_arms([str(tmp_path / "exp")], output_dir=str(out), bootstrap=0)
    with open(out / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["arm"] == "mimetic" and r["metric"] == "speed-up AP^b (%)")
    assert row["reference"] == "default" and row["speedup_reached"] == "0"
    assert row["speedup_estimate_below"] == "1" and row["speedup_low_below"] == "1"


def test_seeds_needed_is_one_table(tmp_path):
    report, text = compare_arms([str(_experiment(tmp_path / "exp"))], bootstrap=0)
    summary = unpadded(text.split("## Seed plan")[1].split("## Method")[0])
    assert (
        "seeds per arm for 80% power (two-sided paired t-test over seeds at level 0.05 / the comparisons of the "
        "row's family, the level its verdict needs):" in summary
    )
    assert "| arm | metric | family | effect Δ | std of the paired differences | seeds needed | seeds now |" in summary
    c = _row(report, "conditioned", "AP^b", "scale_matched")
    std = np.std([0.5, 0.5, -0.2], ddof=1)
    assert c.plan.std == pytest.approx(std) and c.plan.needed == seeds_needed(0.6, std, comparisons=4)
    assert (
        f"| conditioned vs scale_matched | AP^b | between two arms (4) | 0.6 (the paper's claimed gain) | {std:.3g} "
        f"(observed over 3 seeds) | {c.plan.needed} | 3 |"
    ) in summary
    assert "| mimetic | AP^b | against default (6) | 0.6 (the paper's claimed gain) |" in summary


def test_stats_csv_names_the_reference(tmp_path):
    out = tmp_path / "r"
    compare_arms([str(_experiment(tmp_path / "exp"))], output_dir=str(out), bootstrap=0)
    with open(out / "stats.csv") as f:
        header = next(csv.reader(f))
    assert header[:7] == ["stage", "arm", "lr_scale", "kind", "metric", "reference", "mean"]
    with open(out / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if (r["arm"], r["metric"], r["reference"]) == ("conditioned", "AP^b", "scale_matched"))
    assert row["kind"] == "metric" and row["family"] == "between two arms" and row["paired_seeds"] == "0 1 2"
    assert float(row["mean_difference"]) == pytest.approx(0.8 / 3)
    assert row["verdict"] == "no difference shown" and row["unit"] == "training runs"
    assert row["replication"] == "runs" and float(row["poi"]) == pytest.approx(2 / 3)
    p = scipy_stats.ttest_1samp([0.5, 0.5, -0.2], 0.0).pvalue
    assert float(row["p_value"]) == pytest.approx(p) and float(row["p_adjusted"]) == 1.0  # 4 p > 1
    assert (row["family_size"], float(row["level"])) == ("4", 0.9875)
    assert float(row["ci_low"]) == pytest.approx(0.8 / 3 - T_975_2 * np.std([0.5, 0.5, -0.2], ddof=1) / math.sqrt(3))
    assert float(row["adjusted_low"]) == pytest.approx(t_interval([0.5, 0.5, -0.2], 0.9875).low)
    assert {r["reference"] for r in rows if r["arm"] == "conditioned" and r["metric"] == "AP^b"} == {
        "default",
        "scale_matched",
        "mimetic",
    }
    sp = next(
        r
        for r in rows
        if (r["arm"], r["metric"], r["reference"]) == ("conditioned", "speed-up AP^b (%)", "scale_matched")
    )
    assert sp["speedup_reached"] == "2" and sp["family"] == sp["family_size"] == sp["p_adjusted"] == ""


def _load_cli():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "compare_arms.py")
    spec = importlib.util.spec_from_file_location("compare_arms_cli", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_contrast_option(tmp_path, capsys):
    cli = _load_cli()
    exp = _experiment(tmp_path / "exp")
    assert (
        cli.main(
            [
                str(exp),
                "--bootstrap",
                "0",
                "--contrast",
                "mimetic:scale_matched",
                "--contrast",
                "conditioned:xcit",
                "--output",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| mimetic vs scale_matched | AP^b |" in unpadded(out)
    assert (
        "  - between two arms: conditioned vs scale_matched × {AP^b, AP^m}; conditioned vs mimetic × {AP^b, AP^m}; "
        in out
    )
    assert "mimetic vs scale_matched × {AP^b, AP^m} (6 comparisons, intervals at 99.17%)" in out
    note = (
        "- contrast conditioned vs xcit not made: no finished xcit run in this stage (arms here: conditioned, "
        "default, mimetic, scale_matched)"
    )
    assert out.count(note) == 1
    for value, message in (
        ("conditioned", "expected two different arms other than default, as A:B"),
        ("conditioned:conditioned", "an arm against itself"),
        ("default:conditioned", "every arm is already compared with default"),
        ("conditioned:", "expected two different arms other than default"),
        ("a:b:c", "expected two different arms other than default"),
    ):
        with pytest.raises(SystemExit) as e:
            cli.main([str(exp), "--contrast", value])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and "argument --contrast" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["--plan-seeds", "--delta", "0.6", "--std", "0.1", "--contrast", "conditioned:scale_matched"])
    assert e.value.code == 2 and "contrasts are a family of their own: --arms C" in capsys.readouterr().err


def test_contrasts_from_python():
    assert DEFAULT_CONTRASTS == (
        ("conditioned", "scale_matched"),
        ("conditioned", "mimetic"),
        ("conditioned", "structured"),
    )
    assert parse_contrast(" conditioned : scale_matched ") == ("conditioned", "scale_matched")
    arms = ["default", "mimetic", "conditioned", "scale_matched"]
    assert resolve_contrasts(arms) == ([("conditioned", "scale_matched"), ("conditioned", "mimetic")], [])
    assert resolve_contrasts(["default", "conditioned"]) == ([], [])  # default contrasts only where both ran
    pairs, notes = resolve_contrasts(arms, [("mimetic", "conditioned"), ("mimetic", "conditioned"), ("a", "b")])
    assert pairs == [("conditioned", "scale_matched"), ("mimetic", "conditioned")] and len(notes) == 1
    assert notes[0].startswith("contrast a vs b not made: no finished a or b run in this stage")
    for bad in ((("default", "conditioned"),), (("mimetic", "mimetic"),)):
        with pytest.raises(ValueError, match="expected two different arms other than default"):
            resolve_contrasts(arms, bad)


def test_summarize_runs_rejects_a_bad_contrast_and_keeps_reports_without_contrasts(tmp_path):
    exp = _experiment(tmp_path / "exp", box={a: BOX[a] for a in ("default", "conditioned")})
    with pytest.raises(ValueError, match="every arm is already compared with default"):
        summarize_runs(find_runs([str(exp)]).runs, bootstrap=0, contrasts=[("conditioned", "default")])
    report, text = compare_arms([str(exp)], bootstrap=0)
    assert not any(s.reference != "default" for s in report.primary.stats)
    assert "  - against default: conditioned × {AP^b, AP^m} (2 comparisons, intervals at 97.5%)" in text
    assert "between two arms" not in text
    assert "vs scale_matched" not in text and "vs mimetic" not in text
