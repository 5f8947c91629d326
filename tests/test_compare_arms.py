"""The comparison report read as its reader reads it: report.md and the files beside it."""

import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from coco_bootstrap_helpers import coco_ap
from table_text import unpadded

from condinit_det.evaluation.bootstrap import match_predictions, save_matches
from condinit_det.records.layout import plan_runs, write_plan
from condinit_det.records.per_image import write_classification_eval
from condinit_det.records.results import ResultsFile
from condinit_det.report import compare_arms, find_runs, summarize_runs
from condinit_det.report.statistics import seeds_needed, t_interval
from condinit_det.stage import DETECTION, PRETRAIN

T_975_2 = 4.302652729911275  # Student t quantile 0.975, 2 degrees of freedom

ITERS = (100, 200, 300, 400)
# arm -> seed -> (box AP curve, mask AP curve)
CURVES = {
    "default": {0: ([10, 20, 30, 40], [8, 16, 24, 32]), 1: ([12, 22, 32, 42], [10, 18, 26, 34])},
    "conditioned": {0: ([15, 30, 41.5, 45], [12, 25, 33, 36]), 1: ([17, 32, 40.5, 47], [14, 27, 35, 38])},
    "mimetic": {0: ([5, 10, 20, 30], [4, 8, 16, 24])},
}
PNG = b"\x89PNG\r\n\x1a\n"
ENVIRONMENT = {
    "kind": "environment",
    "iteration": 0,
    "cpu": "AMD EPYC 7B13",
    "gpu": None,
    "gpus": 0,
    "threads": 2,
    "python": "3.11.9",
    "torch": "2.4.1",
    "detectron2": "0.6",
    "timm": "1.0.15",
    "condinit_det": "0.1.0",
    "commit": "d233e55",
}


def _write_run(path, arm, seed, box, mask, kappa=None, iters=ITERS, lr_scale=None, environment=None, **extra):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "condinit_arm_report.json"), "w") as f:
        json.dump(
            {"run": {"arm": arm, "seed": seed, "arm_seed": seed, "lr_scale": lr_scale or 1.0}, "arm": arm, "sites": []},
            f,
        )
    rf = ResultsFile(path)
    if environment is not None:
        rf.add(environment)
    for i, (it, b, m) in enumerate(zip(iters, box, mask)):
        rec = {
            "kind": "ap",
            "stage": "detection",
            "iteration": it,
            "arm": arm,
            "seed": seed,
            "config": "cfg.py",
            "bbox": {"AP": b, "AP50": b + 20, "AP75": b + 5, "APs": float("nan"), "APm": b, "APl": b},
            "segm": {"AP": m, "AP50": m + 20, "AP75": m + 5, "APs": m, "APm": m, "APl": m},
        }
        if lr_scale is not None:
            rec["lr_scale"] = lr_scale
        if i == len(box) - 1:
            rec.update(extra)
        rf.add(rec)
        if kappa is not None:
            rf.extend(
                {
                    "kind": "conditioning",
                    "iteration": it,
                    "site": f"blocks.{i}.attn",
                    "kappa": kappa * (i + 1) * it,
                    "arm": arm,
                    "seed": seed,
                }
                for i in range(2)
            )


def _write_cls_run(path, arm, seed, top1, epochs=(2, 4, 6, 8, 10), steps_per_epoch=10, lr_scale=1.0, **final):
    os.makedirs(path, exist_ok=True)
    rf = ResultsFile(path)
    rf.extend(
        {
            "kind": "cls",
            "stage": "pretrain",
            "iteration": e * steps_per_epoch,
            "epoch": e,
            "top1": t,
            "top5": min(t + 20, 100.0),
            "train_loss": 1.0 / e,
            "eval_loss": 1.0 / e,
            "lr": 0.001,
            "arm": arm,
            "seed": seed,
            "lr_scale": lr_scale,
        }
        for e, t in zip(epochs, top1)
    )
    if final:
        rf.add({**rf.records("cls")[-1], **final})


def _write_metrics(path, losses, period=5, epoch_every=None):
    with open(os.path.join(path, "metrics.json"), "w") as f:
        for k, loss in enumerate(losses):
            it = (k + 1) * period - 1
            line = {"iteration": it, "total_loss": loss, "lr": 0.001}
            if epoch_every:
                line["epoch"] = (it + 1) / epoch_every
            f.write(json.dumps(line) + "\n")


def _summarize(paths, **kwargs):
    found = find_runs(paths)
    return summarize_runs(found.runs, found.expected, skipped=found.skipped, **kwargs)


def _first_table(text):
    """The rows of report.md's first table, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start:end] if not line.startswith("|:")]


def _section(text, heading, until="\n## "):
    return text.split(heading, 1)[1].split(until, 1)[0]


@pytest.fixture
def experiment(tmp_path):
    exp = tmp_path / "exp"
    for arm, seeds in CURVES.items():
        for seed, (box, mask) in seeds.items():
            _write_run(
                str(exp / f"{arm}_s{seed}"),
                arm,
                seed,
                box,
                mask,
                kappa=1.0 if arm == "conditioned" else (10.0 if arm == "default" else None),
            )
    return exp


def test_table_numbers_and_convergence(experiment):
    report = _summarize([str(experiment)], bootstrap=0)
    assert [s.stage.name for s in report.stages] == ["detection"]
    det = report.stage("detection")
    assert [a.arm for a in det.arms] == ["default", "mimetic", "conditioned"]
    d, m, c = (report.arm(a) for a in ("default", "mimetic", "conditioned"))
    assert d.seeds == [0, 1] and m.seeds == [0] and c.seeds == [0, 1]
    assert d.final["AP^b"] == pytest.approx((41.0, math.sqrt(2)))
    assert d.final["AP^b_50"] == pytest.approx((61.0, math.sqrt(2)))
    assert c.final["AP^b_75"] == pytest.approx((51.0, math.sqrt(2)))
    assert m.final["AP^m_50"] == pytest.approx((44.0, 0.0))
    assert d.final_iterations == [400, 400]
    assert det.target["bbox"] == (400, pytest.approx(41.0)) and det.target["segm"] == (400, pytest.approx(33.0))
    assert det.target["loss"][0] is None  # no metrics.json
    # seed-averaged conditioned box curve [16, 31, 41, 46] first reaches 41 at 300
    assert c.reach == {"bbox": 300, "segm": 300, "loss": None}
    assert c.speedup["bbox"] == pytest.approx(25.0) and c.speedup["segm"] == pytest.approx(25.0)
    assert d.reach["bbox"] == 400 and d.speedup["bbox"] == pytest.approx(0.0)
    assert m.reach["bbox"] is None and m.speedup["bbox"] is None
    its, mean, std = c.curves["bbox"]
    assert list(its) == list(ITERS) and list(mean) == pytest.approx([16, 31, 41, 46])
    assert list(std) == pytest.approx([math.sqrt(2), math.sqrt(2), math.sqrt(0.5), math.sqrt(2)])
    # κ: median over sites and seeds per iteration
    k_its, k_med, k_lo, k_hi = det.kappa["conditioned"]
    assert list(k_its) == list(ITERS)
    assert k_med[0] == pytest.approx(150.0) and k_lo[0] == 100.0 and k_hi[0] == 200.0
    assert "mimetic" not in det.kappa
    # paired: conditioned - default = [5, 5] on seeds 0, 1 (zero spread: a zero-width interval)
    box = next(s for s in det.stats if s.arm == "conditioned" and s.metric == "AP^b" and s.reference == "default")
    assert box.paired_seeds == [0, 1] and box.differences == pytest.approx([5.0, 5.0])
    assert (box.interval.low, box.interval.high) == pytest.approx((5.0, 5.0))
    assert box.verdict == "better"
    mim = next(s for s in det.stats if s.arm == "mimetic" and s.metric == "AP^b" and s.reference == "default")
    assert mim.paired_seeds == [0] and mim.dropped == ["seed 1 (no mimetic run)"]
    assert mim.interval is None and mim.method == "one paired seed: bootstrap off" and mim.verdict == "too few seeds"


def test_written_files(experiment, tmp_path):
    out = tmp_path / "report"
    _, text = compare_arms([str(experiment)], output_dir=str(out), bootstrap=0)
    assert sorted(os.listdir(out)) == sorted(
        [".cache", "report.md", "summary.csv", "stats.csv", "effects.png", "bbox_ap.png", "segm_ap.png", "kappa.png"]
    )
    assert os.listdir(out / ".cache") == ["figures.json"]  # B = 0: no image resamples
    assert (out / "report.md").read_text() == text
    table = unpadded(_section(text, "## Detection", "### Convergence"))
    rows = {r[0]: r for r in [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]}
    assert rows["| default"][1:4] == ["41.0 ± 1.4", "61.0 ± 1.4", "46.0 ± 1.4"]
    assert rows["| mimetic"][1] == "30.0"  # one seed: no ±
    assert rows["| conditioned"][1:] == [
        "46.0 ± 1.4",
        "66.0 ± 1.4",
        "51.0 ± 1.4",
        "37.0 ± 1.4",
        "57.0 ± 1.4",
        "42.0 ± 1.4",
        "2",
        "400 |",
    ]  # seeds: a count
    assert "| AP^b | 41.0 at iteration 400 | 400 (0.0%) | not reached | 300 (25.0%) |" in unpadded(text)
    assert "- mimetic: dropped from the pairing: seed 1 (no mimetic run)" in text
    assert "None found (no experiment plan" in text

    with open(out / "summary.csv") as f:
        summary = {r["arm"]: r for r in csv.DictReader(f)}
    assert float(summary["conditioned"]["AP^b"]) == pytest.approx(46.0)
    assert float(summary["conditioned"]["AP^b_std"]) == pytest.approx(math.sqrt(2))
    assert float(summary["conditioned"]["bbox_speedup_percent"]) == pytest.approx(25.0)
    assert summary["conditioned"]["bbox_reach_iteration"] == "300"
    assert summary["mimetic"]["bbox_reach_iteration"] == ""
    assert summary["default"]["num_seeds"] == "2" and summary["default"]["final_x"] == "400"
    assert summary["default"]["stage"] == "detection" and summary["default"]["x_axis"] == "iteration"
    with open(out / "stats.csv") as f:
        stats = list(csv.DictReader(f))
    row = next(r for r in stats if (r["arm"], r["metric"], r["reference"]) == ("conditioned", "AP^b", "default"))
    assert float(row["mean_difference"]) == pytest.approx(5.0) and row["verdict"] == "better"
    assert row["paired_seeds"] == "0 1" and row["method"] == "paired t-interval over 2 seeds"
    for name in ("bbox_ap.png", "segm_ap.png", "kappa.png", "effects.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_report_opens_with_one_table_of_every_stage(tmp_path):
    pre, det = tmp_path / "pretrain", tmp_path / "finetune"
    write_plan(
        str(pre),
        plan_runs(["default", "conditioned"], [0, 1, 2]),
        stage=PRETRAIN,
        config=None,
        length=10,
        setup={"train.epochs": "10"},
        dataset="embedded:digits-cls",
    )
    write_plan(
        str(det),
        plan_runs(["default", "conditioned"], [0, 1, 2]),
        stage=DETECTION,
        config=None,
        length=400,
        setup={"train.max_iter": "400"},
        dataset="embedded:digits-det",
    )
    for seed in range(3):
        _write_cls_run(str(pre / "default" / f"seed{seed}"), "default", seed, [10, 20, 30, 40, 50 + seed])
        _write_cls_run(str(pre / "conditioned" / f"seed{seed}"), "conditioned", seed, [20, 30, 40, 50, 60 + 2 * seed])
        for arm, shift in (("default", 0.0), ("conditioned", -1.0 + 0.3 * seed)):
            v = 40.0 + seed + shift
            _write_run(str(det / arm / f"seed{seed}"), arm, seed, [v - 5, v], [v - 7, v - 2], iters=(200, 400))
    out = tmp_path / "report"
    _, text = compare_arms([str(pre), str(det)], output_dir=str(out), bootstrap=0)
    lines = text.splitlines()
    # the title names the stages and the datasets the runs used; the table follows it
    assert (
        lines[0] == "# Initialization arms: classification pretraining on embedded:digits-cls; detection on "
        "embedded:digits-det"
    )
    # the question each verdict answers, then the table
    assert lines[2].startswith("Each verdict answers one question, at family-wise error 0.05 over that question's")
    assert "is the arm better or worse than default" in lines[2] and "is A better or worse than B" not in lines[2]
    assert lines[4].startswith("| stage ")
    header, *rows = _first_table(text)
    assert header == [
        "stage",
        "arm",
        "metric",
        "Δ, interval at the family's level",
        "level",
        "verdict",
        "95% interval, unadjusted",
        "seeds",
        "unit of the intervals",
    ]
    top1, box, mask = rows
    assert top1[:3] == ["Classification pretraining on embedded:digits-cls", "conditioned", "top-1"]
    # a family of one (top-1 against default): its interval is the 95% one
    assert top1[3].startswith("+11.0 [") and top1[3].endswith(top1[6]) and top1[4:6] == ["95%", "better"]
    assert box[:3] == ["Detection on embedded:digits-det", "conditioned", "AP^b"]
    d = np.array([-1.0, -0.7, -0.4])
    half = T_975_2 * d.std(ddof=1) / math.sqrt(3)
    wide = t_interval(d, 1 - 0.05 / 2)  # AP^b and AP^m against default
    assert box[3] == f"{d.mean():+.1f} [{wide.low:+.1f}, {wide.high:+.1f}]" and box[4] == "97.5%"
    assert box[6] == f"[{d.mean() - half:+.1f}, {d.mean() + half:+.1f}]"
    assert box[5] in ("worse", "no difference shown") and box[7:] == ["3", "training runs"]
    # the method, the families and the seed plan come after it; no section is titled with COCO on these data
    order = [
        text.index(h)
        for h in (
            "| stage ",
            "## Classification pretraining on",
            "## Detection on",
            "## Seed plan",
            "## Method",
            "### Environment",
        )
    ]
    assert order == sorted(order)
    assert "COCO" not in text and "Families of Detection on embedded:digits-det" in text


def test_forest_plot_has_a_panel_per_stage_and_a_line_at_zero(tmp_path, monkeypatch):
    from condinit_det.report import plots

    pre, det = tmp_path / "pre", tmp_path / "det"
    for seed in range(2):
        _write_cls_run(str(pre / "default" / f"seed{seed}"), "default", seed, [10, 20, 30, 40, 50])
        _write_cls_run(str(pre / "mimetic" / f"seed{seed}"), "mimetic", seed, [10, 20, 30, 40, 52 + seed])
        for arm in ("default", "conditioned", "mimetic"):
            _write_run(
                str(det / arm / f"seed{seed}"), arm, seed, [30, 40 + seed], [28, 38 + len(arm)], iters=(200, 400)
            )
    drawn = []
    monkeypatch.setattr(plots, "_write", lambda path, fig: drawn.append((os.path.basename(path), fig.get_axes())))
    _, text = compare_arms([str(pre), str(det)], output_dir=str(tmp_path / "r"), bootstrap=0)
    (axes,) = [a for name, a in drawn if name == "effects.png"]
    assert [ax.get_title(loc="left") for ax in axes] == [
        "Classification pretraining (dataset not recorded)",
        "Detection (dataset not recorded)",
    ]
    # every arm x metric of the table: the pretraining panel 1, the detection panel 2 arms x 2 + 1 contrast x 2
    assert [len(ax.get_yticks()) for ax in axes] == [1, 6]
    labels = [t.get_text() for t in axes[1].get_yticklabels()]
    assert "conditioned vs mimetic · AP^m" in labels and "mimetic · AP^b" in labels
    for ax in axes:
        assert any(list(line.get_xdata()) == [0.0, 0.0] for line in ax.get_lines())  # the vertical line at zero
    # linked right under the table, before any other figure
    table_end = text.index("\n\n", text.index("| stage "))
    assert text.index("![effects.png](effects.png)") < text.index("![", table_end + 2) + 1


def test_every_figure_is_linked_with_what_to_read_from_it(experiment, tmp_path):
    for arm, seeds in CURVES.items():
        for seed in seeds:
            _write_metrics(str(experiment / f"{arm}_s{seed}"), np.linspace(3.0, 1.0 + 0.1 * seed, 40), period=10)
    out = tmp_path / "r"
    _, text = compare_arms([str(experiment)], output_dir=str(out), bootstrap=0)
    figures = sorted(n for n in os.listdir(out) if n.endswith(".png"))
    assert figures == ["bbox_ap.png", "effects.png", "kappa.png", "loss.png", "segm_ap.png"]
    for name in figures:
        assert f"![{name}]({name})" in text
        sentence = re.search(rf"^`{re.escape(name)}`: (.+)$", text, re.MULTILINE)
        assert sentence and sentence.group(1).endswith(".") and len(sentence.group(1).split()) >= 8, name
    # κ appears with its plot: its numbers in the section that links it
    kappa = _section(text, "### Attention conditioning κ", "\n### ")
    assert (
        "- conditioned: median κ over sites 150 at iteration 100, 600 at iteration 400 (4 measured points)" in kappa
        and "![kappa.png](kappa.png)" in kappa
    )
    assert "- default: median κ over sites" in kappa and "mimetic" not in kappa


def test_the_title_names_the_data_the_numbers_come_from(tmp_path):
    """A user's dataset registered as nuclei_train / nuclei_val: the AP is measured on nuclei_val."""
    exp = tmp_path / "exp"
    runs = plan_runs(["default", "conditioned"], [0])
    write_plan(
        str(exp), runs, stage=DETECTION, config=None, length=400, dataset="nuclei_train", evaluation="nuclei_val"
    )
    _write_run(str(exp / "default" / "seed0"), "default", 0, [10, 20], [10, 18], iters=(200, 400))
    _write_run(str(exp / "conditioned" / "seed0"), "conditioned", 0, [20, 40], [15, 30], iters=(200, 400))
    _, text = compare_arms([str(exp)], bootstrap=0)
    assert text.startswith("# Initialization arms: detection on nuclei_val (trained on nuclei_train)\n")
    assert "## Detection on nuclei_val (trained on nuclei_train)" in text


def test_words_a_reader_expects(tmp_path):
    """One seed per arm, on a dataset that is not COCO."""
    exp = tmp_path / "exp"
    write_plan(
        str(exp),
        plan_runs(["default", "conditioned"], [0]),
        stage=DETECTION,
        config=None,
        length=400,
        setup={"train.max_iter": "400"},
        dataset="condinit_shapes_train",
    )
    _write_run(str(exp / "default" / "seed0"), "default", 0, [10, 20], [10, 18], iters=(200, 400))
    _write_run(str(exp / "conditioned" / "seed0"), "conditioned", 0, [20, 40], [15, 30], iters=(200, 400))
    _, text = compare_arms([str(exp)], output_dir=str(tmp_path / "r"), bootstrap=0)
    assert text.startswith("# Initialization arms: detection on condinit_shapes_train\n")
    _, box, _ = _first_table(text)
    assert box == [
        "conditioned",
        "AP^b",
        "+20.0",
        "",
        "too few seeds",
        "",
        "1",
        "one seed: no interval over training runs",
    ]
    assert "## Detection on condinit_shapes_train" in text and "COCO" not in text
    assert "1 seeds" not in text and re.search(r"\[([-+]?[\d.]+), \1\]", text) is None  # no degenerate interval
    assert "| conditioned | 40.0 | 60.0 | 45.0 | 30.0 | 50.0 | 35.0 | 1 | 400 |" in unpadded(text)  # a count
    # the seed plan borrows no COCO spread: it says how many seeds measure this data's
    plan = _section(text, "## Seed plan")
    assert (
        "- conditioned, AP^b: one seed per arm on condinit_shapes_train: the spread between training runs is not "
        "measured, and no prior one fits this data; run ≥ 3 seeds per arm to measure it." in plan
    )
    assert "0.14" not in plan and "seeds needed" not in plan


def test_seed_plan_uses_the_coco_spread_on_coco_only(tmp_path):
    gt_path, preds = _tiny_coco(tmp_path)
    for dataset in ("coco_2017_train", "embedded:digits-det"):
        exp = tmp_path / dataset.replace(":", "_")
        write_plan(
            str(exp),
            plan_runs(["default", "conditioned"], [0]),
            stage=DETECTION,
            config=None,
            length=400,
            setup={"train.max_iter": "400"},
            dataset=dataset,
        )
        for arm in ("default", "conditioned"):
            run = exp / arm / "seed0"
            run.mkdir(parents=True)
            save_matches(str(run / "matches.npz"), match_predictions(gt_path, preds[arm]))
            ap = coco_ap(gt_path, preds[arm])
            _write_run(
                str(run),
                arm,
                0,
                [ap["bbox"] / 2, ap["bbox"]],
                [ap["segm"] / 2, ap["segm"]],
                iters=(200, 400),
                per_image="matches.npz",
            )
        report, text = compare_arms([str(exp)], bootstrap=50)
        box = next(s for s in report.primary.comparisons if s.metric == "AP^b")
        plan = _section(text, "## Seed plan")
        if dataset.startswith("coco"):
            assert box.plan.std == 0.14 and box.plan.needed == seeds_needed(0.6, 0.14, comparisons=2)
            assert "0.14 (assumed: sqrt(2) x the 0.10 AP seed std detectron2 reports for ViTDet on COCO)" in plan
        else:
            assert box.plan is None and "0.14" not in plan
            half = (box.interval.high - box.interval.low) / 2
            assert (
                f"run ≥ 3 seeds per arm to measure it; the image bootstrap alone already bounds the "
                f"evaluation-image part at ±{half:.1f}." in plan
            )


def test_environment_shown_once_and_differences_named(experiment, tmp_path):
    for arm, seeds in CURVES.items():
        for seed in seeds:
            ResultsFile(str(experiment / f"{arm}_s{seed}")).add(ENVIRONMENT)
    _, text = compare_arms([str(experiment)], bootstrap=0)
    env = _section(text, "### Environment")
    assert "| gpu | None |" in unpadded(env) and "| torch | 2.4.1 |" in unpadded(env)
    assert "Every run recorded its environment." in env and "**Warning**" not in text
    # a resumed run on another machine, and a run written before the record existed
    ResultsFile(str(experiment / "conditioned_s1")).add(
        {**ENVIRONMENT, "iteration": 200, "gpu": "NVIDIA H100", "gpus": 1}
    )
    ResultsFile(str(experiment / "mimetic_s0")).remove("environment")
    _, text = compare_arms([str(experiment)], bootstrap=0)
    warnings = [line for line in text.splitlines() if line.startswith("**Warning**")]
    assert warnings == [
        "**Warning**: the runs pooled in Detection (dataset not recorded) ran in different "
        "environments: gpu, gpus differ (see Method)."
    ]
    env = _section(text, "### Environment")
    assert "| gpu | None / NVIDIA H100 |" in unpadded(env) and "1 run without an environment record" in env


def test_predictions_of_each_arm_are_shown(experiment, tmp_path):
    figure = PNG + b"predictions"
    (experiment / "conditioned_s1" / "predictions.png").write_bytes(figure + b"1")
    (experiment / "conditioned_s0" / "predictions.png").write_bytes(figure + b"0")
    (experiment / "default_s1" / "predictions.png").write_bytes(figure + b"d")
    out = tmp_path / "r"
    _, text = compare_arms([str(experiment)], output_dir=str(out), bootstrap=0)
    assert (out / "predictions_conditioned.png").read_bytes() == figure + b"0"  # the first seed's
    assert (out / "predictions_default.png").read_bytes() == figure + b"d"
    assert not (out / "predictions_mimetic.png").exists() and "predictions_mimetic" not in text
    assert "`predictions_conditioned.png`: conditioned seed 0's predictions on a few evaluation images" in text
    assert text.index("![predictions_default.png]") < text.index("### Convergence")


def _setup_experiment(root, max_iter, dataset="embedded:digits-det", setup=True):
    write_plan(
        str(root),
        plan_runs(["default", "conditioned"], [0, 1]),
        stage=DETECTION,
        config="c.py",
        length=max_iter,
        setup={"train.max_iter": str(max_iter), "optimizer.lr": "0.0001"} if setup else None,
        dataset=dataset if setup else None,
    )
    for seed in (0, 1):
        for arm, gain in (("default", 0.0), ("conditioned", 2.0 + seed)):
            v = 30.0 + seed + gain + max_iter / 100
            _write_run(
                str(root / arm / f"seed{seed}"), arm, seed, [v - 5, v], [v - 7, v - 2], iters=(max_iter // 2, max_iter)
            )


def test_runs_pool_only_when_their_setups_match(tmp_path, capsys):
    _setup_experiment(tmp_path / "a", 400)
    _setup_experiment(tmp_path / "b", 12)
    cli = _load_cli()
    assert cli.main([str(tmp_path / "a"), str(tmp_path / "b"), "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.max_iter: 400 vs 12" in err[0] and "--group-by-config" in err[0]
    assert "optimizer.lr" not in err[0]
    assert (
        cli.main(
            [
                str(tmp_path / "a"),
                str(tmp_path / "b"),
                "--bootstrap",
                "0",
                "--group-by-config",
                "--output",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    text = (tmp_path / "r" / "report.md").read_text()
    assert "## Detection on embedded:digits-det, train.max_iter = 400" in text
    assert "## Detection on embedded:digits-det, train.max_iter = 12" in text
    header, *rows = _first_table(text)
    assert (
        header[0] == "stage"
        and [r[0] for r in rows]
        == ["Detection on embedded:digits-det, train.max_iter = 400"] * 2
        + ["Detection on embedded:digits-det, train.max_iter = 12"] * 2
    )
    assert (tmp_path / "r" / "bbox_ap.png").is_file() and (tmp_path / "r" / "setup2_bbox_ap.png").is_file()
    assert "![setup2_bbox_ap.png](setup2_bbox_ap.png)" in text
    with open(tmp_path / "r" / "stats.csv") as f:
        assert {r["setup"] for r in csv.DictReader(f)} == {"train.max_iter = 400", "train.max_iter = 12"}
    # another dataset is another setup; plans without a setup (older ones) pool with the one there is
    _setup_experiment(tmp_path / "c", 400, dataset="coco_2017_train")
    with pytest.raises(ValueError, match=r"dataset: embedded:digits-det vs coco_2017_train"):
        compare_arms([str(tmp_path / "a"), str(tmp_path / "c")], bootstrap=0)
    _setup_experiment(tmp_path / "old", 400, setup=False)
    for arm in ("default", "conditioned"):  # seeds 2, 3 of the same experiment, from an older plan
        for seed in (0, 1):
            os.rename(tmp_path / "old" / arm / f"seed{seed}", tmp_path / "old" / arm / f"seed{seed + 2}")
            ResultsFile(str(tmp_path / "old" / arm / f"seed{seed + 2}")).extend(
                {**r, "seed": seed + 2} for r in ResultsFile(str(tmp_path / "old" / arm / f"seed{seed + 2}")).records()
            )
    os.remove(tmp_path / "old" / "experiment.json")
    report, _ = compare_arms([str(tmp_path / "a"), str(tmp_path / "old")], bootstrap=0)
    assert len(report.stages) == 1 and report.arm("conditioned").seeds == [0, 1, 2, 3]
    assert report.primary.dataset == "embedded:digits-det"


def test_bad_records_never_block_the_good_ones(experiment, tmp_path, capsys):
    broken = experiment / "mimetic_s0" / "results.json"
    broken.write_text('{"version": 1, "records": [')
    (experiment / "conditioned_s1" / "results.json").write_text('{"version": 1, "records": [{"kind": "ap"}]}')
    before = broken.read_bytes()
    cli = _load_cli()
    out = tmp_path / "r"
    assert cli.main([str(experiment), "--bootstrap", "0", "--output", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and any(f"skipped {broken} is not valid JSON" in line for line in err)
    assert any("conditioned_s1" in line and "'iteration'" in line for line in err)
    text = (out / "report.md").read_text()
    skipped = [line for line in text.splitlines() if line.startswith("**Skipped**")]
    assert len(skipped) == 2 and str(broken) in skipped[0] + skipped[1]
    assert "| conditioned | AP^b |" in unpadded(text) and "mimetic" not in _first_table(text)[1][0]
    assert broken.read_bytes() == before  # nothing is overwritten
    # a corrupt plan: its runs are read without it, and it is named
    (experiment / "experiment.json").write_text("{not json")
    report, text = compare_arms([str(experiment)], bootstrap=0)
    assert any(p.startswith(str(experiment / "experiment.json")) for p in report.skipped)
    assert report.arm("default").seeds == [0, 1]
    # nothing readable: exit status 2
    for path in experiment.glob("*/results.json"):
        path.write_text("[")
    assert cli.main([str(experiment), "--bootstrap", "0", "--output", str(out)]) == 2
    assert "No runs to compare" in capsys.readouterr().err


def test_run_dirs_can_be_listed_individually(experiment):
    report = _summarize([str(experiment / "default_s0"), str(experiment / "conditioned_s1")], bootstrap=0)
    assert report.arm("conditioned").final["AP^b"] == pytest.approx((47.0, 0.0))
    # 47-seed curve [17, 32, 40.5, 47] vs default final 40: first >= 40 is 300
    assert report.arm("conditioned").reach["bbox"] == 300
    # different seeds: nothing to pair
    row = next(s for s in report.primary.stats if s.arm == "conditioned" and s.metric == "AP^b")
    assert row.paired_seeds == [] and row.method == "no paired seeds" and row.verdict == "too few seeds"
    assert row.dropped == ["seed 0 (no conditioned run)", "seed 1 (no default run)"]


def test_without_default_arm_there_is_no_speedup(experiment):
    report, text = compare_arms([str(experiment / "mimetic_s0")], bootstrap=0)
    assert report.primary.target == {} and report.arm("mimetic").speedup == {}
    assert "No runs of the default arm" in text and "No comparison" in text


def test_paired_t_interval_known_answer(tmp_path):
    exp = tmp_path / "exp"
    finals = {
        "default": [40.0, 41.0, 42.0],
        "conditioned": [41.0, 43.0, 45.0],  # differences 1, 2, 3
        "mimetic": [47.0, 46.0, 47.0],
    }  # differences 7, 5, 5: clearly better
    for arm, values in finals.items():
        for seed, v in enumerate(values):
            _write_run(str(exp / arm / f"seed{seed}"), arm, seed, [v - 10, v], [v - 12, v - 2], iters=(200, 400))
    report, text = compare_arms([str(exp)], bootstrap=0)
    stats = {(s.arm, s.metric): s for s in report.primary.stats if s.reference == "default"}
    c = stats[("conditioned", "AP^b")]
    half = T_975_2 * 1.0 / math.sqrt(3)  # mean 2, sd 1, n 3
    assert c.differences == pytest.approx([1.0, 2.0, 3.0]) and c.mean_difference == pytest.approx(2.0)
    assert (c.interval.low, c.interval.high) == pytest.approx((2.0 - half, 2.0 + half))
    assert c.interval.unit == "training runs" and "bootstrap off" in c.note
    assert c.verdict == "no difference shown"
    m = stats[("mimetic", "AP^b")]
    mhalf = T_975_2 * np.std([7, 5, 5], ddof=1) / math.sqrt(3)
    assert (m.interval.low, m.interval.high) == pytest.approx((17 / 3 - mhalf, 17 / 3 + mhalf))
    # the raw interval excludes 0 (p = 0.014), but the family against default holds 4 comparisons (2 arms x AP^b,
    # AP^m; the contrast conditioned vs mimetic is a family of its own): its interval at 98.75% covers 0, 4 p > 0.05
    assert m.interval.low > 0 and m.interval.p_value == pytest.approx(0.01356, abs=1e-4)
    assert [f.label + " " + f.metric for f in report.primary.comparisons] == [
        "mimetic AP^b",
        "mimetic AP^m",
        "conditioned AP^b",
        "conditioned AP^m",
        "conditioned vs mimetic AP^b",
        "conditioned vs mimetic AP^m",
    ]
    assert m.p_adjusted == pytest.approx(4 * m.interval.p_value) and m.verdict == "no difference shown"
    wide = t_interval([7, 5, 5], 0.9875)
    assert (m.adjusted.low, m.adjusted.high) == pytest.approx((wide.low, wide.high)) and wide.low < 0
    assert f"[{2 - half:+.1f}, {2 + half:+.1f}]" in text  # [-0.5, +4.5]
    assert [
        "mimetic",
        "AP^b",
        f"+5.7 [{wide.low:+.1f}, {wide.high:+.1f}]",
        "98.75%",
        "no difference shown",
        "[+2.8, +8.5]",
        "3",
        "training runs",
    ] in _first_table(text)
    assert (
        "- Families of Detection (dataset not recorded), each at family-wise error 0.05 (Bonferroni: p times the "
        "family's comparisons, intervals at 1 − 0.05 / them; the 95% intervals beside them are unadjusted):\n"
        "  - against default: mimetic × {AP^b, AP^m}; conditioned × {AP^b, AP^m} (4 comparisons, intervals at "
        "98.75%)\n  - between two arms: conditioned vs mimetic × {AP^b, AP^m} (2 comparisons, intervals at 97.5%)"
        in text
    )
    # every seed won: P(improvement) 1, its exact interval [0.025^(1/3), 1]
    assert float(m.improvement.estimate) == 1.0 and float(m.improvement.exact_low) == pytest.approx(0.025 ** (1 / 3))
    # the seeds the question needs: the measured spread of mimetic's differences, the 4 comparisons of its family
    assert m.plan.needed == seeds_needed(0.6, float(np.std([7, 5, 5], ddof=1)), comparisons=4)
    assert m.plan.delta_source == "the paper's claimed gain" and m.plan.std_source == "observed over 3 seeds"
    # convergence per seed: mimetic reaches each default's final value at 400, the default's final iteration
    sp = stats[("mimetic", "speed-up AP^b (%)")]
    assert sp.values == {0: 0.0, 1: 0.0, 2: 0.0} and sp.verdict == "" and sp.kind == "speedup"
    assert (sp.speedup.reached, sp.speedup.estimate.speedup) == (3, 0.0)


def test_missing_runs_are_named_and_dropped_from_pairing(tmp_path):
    exp = tmp_path / "exp"
    write_plan(
        str(exp), plan_runs(["default", "mimetic", "conditioned"], [0, 1, 2]), stage=DETECTION, config=None, length=400
    )
    for arm, offset in (("default", 0.0), ("mimetic", 1.0), ("conditioned", 3.0)):
        for seed in (0, 1, 2):
            if arm == "mimetic" and seed == 2:
                continue  # failed: no results
            v = 40.0 + seed + offset + 0.5 * (seed == 1) * (arm == "conditioned")
            _write_run(str(exp / arm / f"seed{seed}"), arm, seed, [v - 5, v], [v - 7, v - 2], iters=(200, 400))
    found = find_runs([str(exp)])
    assert len(found.expected) == 9 and found.expected[0].stage == DETECTION
    report, text = compare_arms([str(exp)], bootstrap=0)
    det = report.stage("detection")
    assert [m.describe() for m in det.missing] == ["mimetic seed 2: no results (failed or not run)"]
    assert "- mimetic seed 2: no results (failed or not run)" in text
    stats = {(s.arm, s.metric): s for s in det.stats if s.reference == "default"}
    mim = stats[("mimetic", "AP^b")]
    assert mim.paired_seeds == [0, 1] and mim.dropped == ["seed 2 (no mimetic run)"]
    assert mim.differences == pytest.approx([1.0, 1.0]) and mim.n == 2
    con = stats[("conditioned", "AP^b")]
    assert con.paired_seeds == [0, 1, 2] and con.dropped == []
    assert con.differences == pytest.approx([3.0, 3.5, 3.0]) and con.verdict == "better"
    assert report.arm("mimetic").seeds == [0, 1]
    assert "- mimetic: dropped from the pairing: seed 2 (no mimetic run)" in text
    contrast = next(s for s in det.stats if s.label == "conditioned vs mimetic" and s.metric == "AP^b")
    assert contrast.paired_seeds == [0, 1] and contrast.dropped == ["seed 2 (no mimetic run)"]
    assert contrast.differences == pytest.approx([2.0, 2.5])
    assert "- conditioned vs mimetic: dropped from the pairing: seed 2 (no mimetic run)" in text

    # an unfinished run (killed after its first evaluation) is named too, and kept out of the tables
    _write_run(str(exp / "mimetic" / "seed2"), "mimetic", 2, [30.0], [28.0], iters=(200,))
    report, text = compare_arms([str(exp)], bootstrap=0)
    assert [m.describe() for m in report.primary.missing] == [
        "mimetic seed 2: unfinished (last evaluation at iteration 200; other runs reach 400)"
    ]
    assert report.arm("mimetic").seeds == [0, 1]
    # a run directory without any evaluation
    os.rename(exp / "mimetic" / "seed2" / "results.json", exp / "mimetic" / "seed2" / "results.0.json.bak")
    ResultsFile(str(exp / "mimetic" / "seed2")).add(
        {"kind": "conditioning", "iteration": 0, "site": "a", "kappa": 3.0, "arm": "mimetic", "seed": 2}
    )
    report, text = compare_arms([str(exp / "mimetic")], bootstrap=0)  # the plan one level up still applies
    assert [m.describe() for m in report.primary.missing] == [
        "mimetic seed 2: no evaluation recorded (unfinished or failed)"
    ]


def test_epochs_to_default_known_answer(tmp_path):
    exp = tmp_path / "pretrain"
    write_plan(str(exp), plan_runs(["default", "conditioned"], [0, 1]), stage=PRETRAIN, config=None, length=10)
    # default seeds reach 48 / 52 at epoch 10 -> seed mean 50; conditioned's seed mean
    # [21, 36, 51, 56, 61] reaches 50 at epoch 6: speed-up (1 - 6 / 10) = 40 %
    _write_cls_run(str(exp / "default" / "seed0"), "default", 0, [8, 18, 28, 38, 48])
    _write_cls_run(str(exp / "default" / "seed1"), "default", 1, [12, 22, 32, 42, 52])
    _write_cls_run(str(exp / "conditioned" / "seed0"), "conditioned", 0, [20, 35, 50, 55, 60])
    _write_cls_run(str(exp / "conditioned" / "seed1"), "conditioned", 1, [22, 37, 52, 57, 62])
    report, text = compare_arms([str(exp)], bootstrap=0)
    cls = report.stage("pretrain")
    assert report.primary is cls and [g.arm for g in cls.arms] == ["default", "conditioned"]
    assert cls.target["top1"] == (10, pytest.approx(50.0))
    c = cls.arm("conditioned")
    assert c.reach["top1"] == 6 and c.speedup["top1"] == pytest.approx(40.0)
    assert c.final["top-1"] == pytest.approx((61.0, math.sqrt(2)))
    assert "| top-1 | 50.0 at epoch 10 | 10 (0.0%) | 6 (40.0%) |" in unpadded(text)
    assert "| arm | top-1 | top-5 | seeds | final epoch |" in unpadded(text)
    assert "None: every planned run has finished." in text
    stats = {(s.arm, s.metric): s for s in cls.stats}
    # per seed: conditioned seed 0 reaches default seed 0's final 48 at epoch 6 (50), seed 1 its 52 at 6: 40 % each
    sp = stats[("conditioned", "speed-up top-1 (%)")]
    assert sp.values == {0: pytest.approx(40.0), 1: pytest.approx(40.0)}
    assert sp.speedup.reached == 2 and sp.speedup.estimate.speedup == pytest.approx(40.0)
    assert sp.mean == pytest.approx(40.0) and sp.speedup.coverage == pytest.approx(0.5)  # [worst, best] of 2
    assert stats[("conditioned", "top-1")].differences == pytest.approx([12.0, 10.0])


def test_lr_sensitivity(tmp_path):
    exp = tmp_path / "exp"
    runs = plan_runs(["default", "conditioned"], [0], [0.5, 1.0, 2.0])
    write_plan(str(exp), runs, stage=DETECTION, config=None, length=400)
    finals = {
        ("default", 0.5): 38.0,
        ("default", 1.0): 41.0,
        ("default", 2.0): 39.0,
        ("conditioned", 0.5): 40.0,
        ("conditioned", 1.0): 42.0,
        ("conditioned", 2.0): 44.0,
    }
    for spec in runs:
        v = finals[(spec.arm, spec.lr_scale)]
        _write_run(
            spec.path(str(exp)),
            spec.arm,
            spec.seed,
            [v - 10, v],
            [v - 12, v - 2],
            iters=(200, 400),
            lr_scale=spec.lr_scale,
        )
    report, text = compare_arms([str(exp)], bootstrap=0)
    det = report.primary
    assert det.scales == [0.5, 1.0, 2.0] and det.scale == 1.0
    assert [g.arm for g in det.arms] == ["default", "conditioned"]  # the main comparison is at scale 1
    assert det.best_scale("default") == 1.0 and det.best_scale("conditioned") == 2.0
    assert det.arm("conditioned", 2.0).final["AP^b"] == pytest.approx((44.0, 0.0))
    lr = unpadded(_section(text, "### Learning-rate sensitivity", "### Missing"))
    assert "| conditioned | 0.5 | 40.0 | 38.0 | 1 | |" in lr and "| conditioned | 2 | 44.0 | 42.0 | 1 | best |" in lr
    assert "| default | 1 | 41.0 | 39.0 | 1 | best |" in lr

    # only a scan, without scale 1: the main comparison falls back to a scale every arm ran
    for spec in runs:
        if spec.lr_scale == 1.0:
            os.rename(os.path.join(spec.path(str(exp)), "results.json"), os.path.join(spec.path(str(exp)), "old.json"))
    os.remove(os.path.join(exp, "experiment.json"))
    report, text = compare_arms([str(exp)], output_dir=str(tmp_path / "r"), bootstrap=0)
    assert report.primary.scale == 0.5 and report.primary.scales == [0.5, 2.0]
    assert "learning-rate scale 0.5 (no runs at the config's learning rate)" in text
    assert (tmp_path / "r" / "bbox_ap.png").read_bytes()[:8] == PNG


def _tiny_coco(tmp_path):
    """3 images, one box each; the detection records' predictions for each arm."""
    from pycocotools import mask as mask_utils

    def rle(x, y):
        m = np.zeros((32, 32), dtype=np.uint8, order="F")
        m[y : y + 8, x : x + 8] = 1
        r = mask_utils.encode(m)
        r["counts"] = r["counts"].decode()
        return r

    boxes = [(2, 2), (10, 12), (20, 4)]
    gt = {
        "images": [{"id": i + 1, "width": 32, "height": 32, "file_name": f"{i}.png"} for i in range(3)],
        "annotations": [
            {
                "id": i + 1,
                "image_id": i + 1,
                "category_id": 1,
                "bbox": [x, y, 8, 8],
                "area": 64,
                "iscrowd": 0,
                "segmentation": rle(x, y),
            }
            for i, (x, y) in enumerate(boxes)
        ],
        "categories": [{"id": 1, "name": "thing"}],
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(gt))
    preds = {
        "default": [
            {"image_id": i + 1, "category_id": 1, "bbox": [x + 2, y, 8, 8], "score": 0.9, "segmentation": rle(x + 2, y)}
            for i, (x, y) in enumerate(boxes)
        ],
        "conditioned": [
            {"image_id": i + 1, "category_id": 1, "bbox": [x, y, 8, 8], "score": 0.9, "segmentation": rle(x, y)}
            for i, (x, y) in enumerate(boxes)
        ],
    }
    return str(path), preds


def test_combined_report_pretraining_and_detection(tmp_path):
    pre, det = tmp_path / "pretrain", tmp_path / "finetune"
    write_plan(str(pre), plan_runs(["default", "conditioned"], [0]), stage=PRETRAIN, config=None, length=10)
    write_plan(str(det), plan_runs(["default", "conditioned"], [0]), stage=DETECTION, config=None, length=400)
    labels = [i % 4 for i in range(40)]
    for arm, top1, wrong in (("default", [30, 40, 50, 55, 60], 16), ("conditioned", [35, 50, 60, 65, 70], 12)):
        run = pre / arm / "seed0"
        pred = [(c + 1) % 4 if i < wrong else c for i, c in enumerate(labels)]
        per_image = write_classification_eval(str(run), 10, labels=labels, top1=pred, top5_hit=[1] * 40)
        _write_cls_run(str(run), arm, 0, top1, per_image=os.path.relpath(per_image, run))
        _write_metrics(str(run), np.linspace(3.0, 1.0 if arm == "default" else 0.8, 10), period=10, epoch_every=10)
    gt_path, preds = _tiny_coco(tmp_path)
    for arm in ("default", "conditioned"):
        run = det / arm / "seed0"
        run.mkdir(parents=True)
        save_matches(str(run / "matches.npz"), match_predictions(gt_path, preds[arm]))
        ap = coco_ap(gt_path, preds[arm])  # the final record holds the AP of its predictions
        _write_run(
            str(run),
            arm,
            0,
            [ap["bbox"] / 2, ap["bbox"]],
            [ap["segm"] / 2, ap["segm"]],
            iters=(200, 400),
            kappa=1.0,
            per_image="matches.npz",
        )
        _write_metrics(str(run), np.linspace(4.0, 2.0 if arm == "default" else 1.5, 20), period=20)
    out = tmp_path / "report"
    report, text = compare_arms([str(pre), str(det)], output_dir=str(out), bootstrap=25, seed=1)
    assert [s.stage.name for s in report.stages] == ["pretrain", "detection"]
    assert text.count("None: every planned run has finished.") == 2
    for name in ("cls_loss.png", "top1.png", "top5.png", "loss.png", "bbox_ap.png", "segm_ap.png", "kappa.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name

    # one seed: the final evaluation's per-image data are resampled
    cls_row = next(s for s in report.stage("pretrain").stats if s.arm == "conditioned" and s.metric == "top-1")
    assert cls_row.method == "image bootstrap over 40 evaluation images, B=25, percentile"
    assert cls_row.differences == pytest.approx([10.0]) and cls_row.interval.low <= 10.0 <= cls_row.interval.high
    assert cls_row.interval.unit == "evaluation images (one trained model per arm)"
    det_rows = {s.metric: s for s in report.stage("detection").stats if s.arm == "conditioned"}
    box = det_rows["AP^b"]
    assert box.method == "image bootstrap over 3 evaluation images, B=25, percentile"
    # the conditioned predictions are exact, the default ones shifted by 2 px (IoU 0.6): every resample gives the
    # same difference; one trained model per arm is never a verdict on the initialization
    assert box.interval.low == pytest.approx(box.interval.high) and box.differences[0] > 0
    assert box.interval.low <= box.differences[0] <= box.interval.high  # the zero-width interval holds the estimate
    assert box.interval.p_value == pytest.approx(2 / 26) and box.verdict == "too few seeds"
    assert {row[-4] for row in _first_table(text)[1:]} == {"too few seeds"}
    # speed-ups of one seed: its value, no interval
    for key in ("speed-up loss (%)", "speed-up AP^b (%)"):
        assert det_rows[key].n == 1 and det_rows[key].speedup.low is None
        assert det_rows[key].method == "one seed: no interval over seeds"
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert {(r["stage"], r["arm"]) for r in summary} == {
        ("pretrain", "default"),
        ("pretrain", "conditioned"),
        ("detection", "default"),
        ("detection", "conditioned"),
    }
    cls_cond = next(r for r in summary if r["stage"] == "pretrain" and r["arm"] == "conditioned")
    assert cls_cond["top1_reach_epoch"] == "6" and cls_cond["AP^b"] == ""


def test_report_runs_without_detectron2(experiment, tmp_path):
    """The report needs neither detectron2 nor torch: neither the report job of a Slurm experiment (without trackers)
    nor the supervising process of an element loads them."""
    code = (
        "import sys; sys.modules['detectron2'] = None\n"
        "from condinit_det.launch.run import ReportJob\n"
        "from condinit_det.launch.slurm import RunElement\n"
        "from condinit_det.report import compare_arms\n"
        f"r, t = compare_arms([{str(experiment)!r}], output_dir={str(tmp_path / 'r')!r}, bootstrap=0)\n"
        f"assert ReportJob([{str(experiment)!r}], {str(tmp_path / 'r')!r}, bootstrap=0)() == t\n"
        "loaded = {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
        "assert not loaded & {'detectron2', 'torch'}, loaded & {'detectron2', 'torch'}\n"
        "print(r.arm('conditioned').final['AP^b'][0])\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "46.0"


def test_errors(tmp_path, experiment):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="No runs under"):
        find_runs([str(empty)])
    with pytest.raises(ValueError, match="not a directory"):
        find_runs([str(tmp_path / "missing")])
    _write_run(str(tmp_path / "dup"), "default", 0, [1, 2, 3, 4], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="several runs with seed"):
        _summarize([str(experiment), str(tmp_path / "dup")])


def _load_cli():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "compare_arms.py")
    spec = importlib.util.spec_from_file_location("compare_arms_cli", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli(experiment, tmp_path, capsys):
    cli = _load_cli()
    assert cli.main([str(experiment), "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "| AP^b | 41.0 at iteration 400 | 400 (0.0%) | not reached | 300 (25.0%) |" in unpadded(out)
    assert (experiment / "report" / "report.md").is_file()
    # the report dir inside the experiment is not mistaken for a run on a second pass
    assert cli.main([str(experiment), "--output", str(tmp_path / "r2"), "--bootstrap", "0", "--seed", "3"]) == 0
    assert (tmp_path / "r2" / "stats.csv").is_file()
    capsys.readouterr()
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert cli.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert "No runs under" in err and len(err.strip().splitlines()) == 1
