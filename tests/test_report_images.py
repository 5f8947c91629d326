"""The report on runs that keep per-image data of every evaluation: two-level intervals, the censored speed-up,
fallbacks with their reasons, the per-image file format, seed planning."""

import os

import numpy as np
import pytest
from coco_bootstrap_helpers import coco_ap
from pycocotools import mask as mask_utils
from table_text import unpadded

from condinit_det.commands.compare import main as compare_main
from condinit_det.evaluation.bootstrap import match_predictions, save_matches
from condinit_det.records.per_image import (
    PER_IMAGE_DIRNAME,
    classification_eval_path,
    detection_eval_path,
    labels_digest,
    read_classification_eval,
    write_classification_eval,
)
from condinit_det.records.results import ResultsFile
from condinit_det.report import ARM_COLORS, ARM_ORDER, compare_arms
from condinit_det.report.statistics import seeds_needed, t_interval

EPOCHS = (2, 4, 6, 8)
N_IMAGES = 300


def _cls_run(root, arm, seed, accuracies, labels, rng, per_image=True):
    """A classification run whose per-image correctness at each epoch has exactly the given accuracy."""
    run = os.path.join(root, arm, f"seed{seed}")
    records = []
    for epoch, acc in zip(EPOCHS, accuracies):
        correct = np.zeros(labels.size, dtype=bool)
        correct[rng.permutation(labels.size)[: int(round(acc / 100 * labels.size))]] = True
        record = {
            "kind": "cls",
            "stage": "pretrain",
            "iteration": 10 * epoch,
            "epoch": epoch,
            "top1": 100 * correct.mean(),
            "top5": 90.0,
            "arm": arm,
            "seed": seed,
        }
        if per_image:
            top1 = np.where(correct, labels, (labels + 1) % 7)
            path = write_classification_eval(
                run, epoch, labels=labels, top1=top1, top5_hit=correct | (rng.uniform(size=labels.size) < 0.5)
            )
            record["per_image"] = os.path.relpath(path, run)
        records.append(record)
    ResultsFile(run).extend(records)
    return run


@pytest.fixture
def cls_experiment(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, size=N_IMAGES)
    curves = {
        "default": [[20, 30, 40, 50], [22, 32, 42, 52], [18, 28, 38, 48]],
        # seed 2 never reaches the default's final 48 (censored at epoch 8)
        "conditioned": [[30, 50, 55, 58], [25, 40, 52, 60], [20, 30, 40, 45]],
    }
    for arm, per_seed in curves.items():
        for seed, acc in enumerate(per_seed):
            _cls_run(str(tmp_path / "pre"), arm, seed, acc, labels, rng)
    return tmp_path / "pre"


def test_classification_per_image_file_round_trip(tmp_path):
    labels = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3])
    path = write_classification_eval(
        str(tmp_path), 3, labels=labels, top1=[0, 1, 0, 3, 4, 1, 1, 2, 0], top5_hit=[1, 1, 1, 0, 1, 1, 1, 1, 1]
    )
    assert path == classification_eval_path(str(tmp_path), 3) == str(tmp_path / PER_IMAGE_DIRNAME / "cls_epoch0003.npz")
    ev = read_classification_eval(path)
    assert ev.epoch == 3 and ev.top1.size == 9 and ev.labels_sha1 == labels_digest(labels)
    assert ev.top1.tolist() == [True, True, False, True, True, False, True, True, False]
    assert ev.top5.tolist() == [True, True, True, False, True, True, True, True, True]
    assert os.listdir(tmp_path / PER_IMAGE_DIRNAME) == ["cls_epoch0003.npz"]
    assert detection_eval_path("run", 400) == os.path.join("run", PER_IMAGE_DIRNAME, "ap_iter0000400.npz")
    assert labels_digest([1, 2]) != labels_digest([2, 1])
    (tmp_path / "bad.npz").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a per-image classification file"):
        read_classification_eval(str(tmp_path / "bad.npz"))


def test_several_seeds_with_per_image_data_get_the_two_level_interval(cls_experiment):
    report, text = compare_arms([str(cls_experiment)], bootstrap=300, seed=1)
    stats = {(s.arm, s.metric): s for s in report.stage("pretrain").stats}
    row = stats[("conditioned", "top-1")]
    diffs = [58 - 50, 60 - 52, 45 - 48]
    assert row.differences == pytest.approx(diffs, abs=1e-9)
    iv = row.interval
    assert iv.replication == "both" and iv.unit == "training runs and evaluation images"
    assert iv.method == "two-level bootstrap (seeds x images), t-scaled, 3 seeds"
    assert iv.estimate == pytest.approx(np.mean(diffs)) and iv.low < iv.estimate < iv.high
    # the t-interval over seeds and the two-level percentile interval stay beside it
    t, percentile = row.t, row.percentile
    assert (t.low, t.high) == pytest.approx((t_interval(diffs).low, t_interval(diffs).high))
    assert percentile.replication == "both" and "percentile" in percentile.method
    # the t-scaled interval is at least as wide as the t over seeds (it adds the image part)
    assert iv.high - iv.low >= t.high - t.low - 1e-9
    assert row.p_adjusted == pytest.approx(iv.p_value) and row.adjusted == iv  # a family of one: at 95%
    assert float(row.improvement.estimate) == pytest.approx(2 / 3)
    assert (
        f"| conditioned | top-1 | 54.3 ± 8.1 | {iv.p_value:.3f} | {row.p_adjusted:.3f} | [{t.low:+.1f}, "
        f"{t.high:+.1f}] |" in unpadded(text)
    )

    # speed-up: seed 0 reaches its default's 50 at epoch 4 (50 %), seed 1 its 52 at epoch 6 (25 %); seed 2
    # never reaches 48 and is kept, censored at epoch 8 (speed-up below 0)
    sp = stats[("conditioned", "speed-up top-1 (%)")]
    assert sp.values == {0: pytest.approx(50.0), 1: pytest.approx(25.0)}
    assert (sp.speedup.n, sp.speedup.reached) == (3, 2)
    assert sp.speedup.estimate.speedup == pytest.approx(25.0) and not sp.speedup.estimate.censored  # KM median
    assert sp.speedup.low.censored and sp.speedup.low.speedup == 0.0 and sp.speedup.high.speedup == pytest.approx(50.0)
    assert sp.speedup.coverage == pytest.approx(0.75)
    assert "not reached (censored at the last evaluation) for seed 2" in sp.note
    assert "speed-up top-1" not in text  # report.md shows the seed-mean convergence; the seeds are in stats.csv

    # the same runs without image resampling: the t over seeds, saying why the images are left out
    report, text = compare_arms([str(cls_experiment)], bootstrap=0)
    row = next(s for s in report.stage("pretrain").stats if s.key == "top1" and s.arm == "conditioned")
    assert row.interval.replication == "runs" and row.note == "evaluation-image variance not included: bootstrap off"


def test_missing_per_image_data_falls_back_and_says_why(cls_experiment):
    for path in (cls_experiment / "default" / "seed1" / PER_IMAGE_DIRNAME).glob("cls_epoch*.npz"):
        os.remove(path)
    report, text = compare_arms([str(cls_experiment)], bootstrap=200)
    row = next(s for s in report.stage("pretrain").stats if s.key == "top1" and s.arm == "conditioned")
    assert row.interval.replication == "runs"
    assert row.note == (
        f"evaluation-image variance not included: default seed 1 kept no per-image data of its epoch {EPOCHS[-1]}"
    )
    assert f"- conditioned, top-1: {row.note}" in text


def test_one_seed_speedup_has_no_interval(tmp_path):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 7, size=N_IMAGES)
    _cls_run(str(tmp_path), "default", 0, [20, 30, 40, 50], labels, rng)
    _cls_run(str(tmp_path), "conditioned", 0, [30, 45, 60, 70], labels, rng)
    report, text = compare_arms([str(tmp_path)], bootstrap=400, seed=2)
    stats = {s.metric: s for s in report.stage("pretrain").stats if s.arm == "conditioned"}
    top1 = stats["top-1"]
    assert top1.interval.replication == "images" and top1.verdict == "too few seeds" and top1.interval.low > 0
    sp = stats["speed-up top-1 (%)"]  # reached at epoch 6 (60 >= 50) of 8
    assert sp.speedup.estimate.speedup == pytest.approx(25.0) and (sp.speedup.low, sp.speedup.high) == (None, None)
    assert sp.method == "one seed: no interval over seeds" and sp.verdict == ""
    assert "| top-1 | 50.0 at epoch 8 | 8 (0.0%) | 6 (25.0%) |" in unpadded(text)


def _rle(x, y, size=48):
    m = np.zeros((size, size), dtype=np.uint8, order="F")
    m[y : y + 12, x : x + 12] = 1
    r = mask_utils.encode(m)
    r["counts"] = r["counts"].decode("ascii")
    return r


def _detection_data(num_images=12, seed=0):
    rng = np.random.default_rng(seed)
    anns = []
    for i in range(num_images):
        for c in (1, 2):
            x, y = (int(v) for v in rng.integers(0, 36, size=2))
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": 100 + i,
                    "category_id": c,
                    "bbox": [x, y, 12, 12],
                    "area": 144,
                    "iscrowd": 0,
                    "segmentation": _rle(x, y),
                }
            )
    gt = {
        "images": [{"id": 100 + i, "width": 48, "height": 48, "file_name": f"{i}.png"} for i in range(num_images)],
        "annotations": anns,
        "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
    }
    return gt


def _predictions(gt, jitter, rng):
    preds = []
    for a in gt["annotations"]:
        x, y = a["bbox"][:2]
        dx, dy = (int(v) for v in rng.integers(-jitter, jitter + 1, size=2))
        x, y = min(max(x + dx, 0), 36), min(max(y + dy, 0), 36)
        preds.append(
            {
                "image_id": a["image_id"],
                "category_id": a["category_id"],
                "bbox": [x, y, 12, 12],
                "score": float(rng.uniform(0.2, 1.0)),
                "segmentation": _rle(x, y),
            }
        )
    return preds


def _det_run(root, arm, seed, jitters, gt, rng, iterations=(100, 200, 300)):
    """A detection run whose every evaluation keeps its matches, named in its "ap" record."""
    run = os.path.join(root, arm, f"seed{seed}")
    records = []
    for it, jitter in zip(iterations, jitters):
        preds = _predictions(gt, jitter, rng)
        ap = coco_ap(gt, preds)
        path = detection_eval_path(run, it)
        save_matches(path, match_predictions(gt, preds))
        relpath = os.path.relpath(path, run)
        records.append(
            {
                "kind": "ap",
                "stage": "detection",
                "iteration": it,
                "arm": arm,
                "seed": seed,
                "per_image": relpath,
                "bbox": {"AP": ap["bbox"]},
                "segm": {"AP": ap["segm"]},
            }
        )
    ResultsFile(run).extend(records)
    return run


def test_detection_runs_with_per_evaluation_matches(tmp_path):
    gt = _detection_data()
    rng = np.random.default_rng(3)
    _det_run(str(tmp_path / "one"), "default", 0, (6, 5, 4), gt, rng)
    _det_run(str(tmp_path / "one"), "scale_matched", 0, (5, 2, 1), gt, rng)
    report, text = compare_arms([str(tmp_path / "one")], bootstrap=200)
    det = report.stage("detection")
    assert [g.arm for g in det.arms] == ["default", "scale_matched"]
    stats = {s.metric: s for s in det.stats if s.arm == "scale_matched"}
    box = stats["AP^b"]
    assert box.interval.replication == "images" and box.interval.method.startswith("image bootstrap over 12 ")
    assert [f.arm for f in det.comparisons] == ["scale_matched", "scale_matched"]
    # one seed on data not known to be COCO: no plan from COCO's seed spread
    assert box.plan is None and "run ≥ 3 seeds per arm to measure it" in text
    assert stats["speed-up AP^b (%)"].speedup.n == 1 and stats["speed-up AP^b (%)"].speedup.low is None

    # three seeds: the two-level interval over the saved matches
    for seed in (1, 2):
        _det_run(str(tmp_path / "one"), "default", seed, (6, 5, 4), gt, rng)
        _det_run(str(tmp_path / "one"), "scale_matched", seed, (5, 2, 1), gt, rng)
    report, text = compare_arms([str(tmp_path / "one")], bootstrap=200)
    box = next(s for s in report.primary.stats if s.arm == "scale_matched" and s.metric == "AP^b")
    assert box.interval.replication == "both" and box.n == 3

    # runs evaluated on other images are not paired on images
    other = _detection_data(seed=9)
    other["images"] = [{**im, "id": im["id"] + 1000} for im in other["images"]]
    other["annotations"] = [{**a, "image_id": a["image_id"] + 1000} for a in other["annotations"]]
    _det_run(str(tmp_path / "two"), "default", 0, (6, 5, 4), gt, rng)
    _det_run(str(tmp_path / "two"), "conditioned", 0, (5, 2, 1), other, rng)
    report, _ = compare_arms([str(tmp_path / "two")], bootstrap=50)
    box = next(s for s in report.primary.stats if s.arm == "conditioned" and s.metric == "AP^b")
    assert box.interval is None and box.note == "the runs were evaluated on different images"


def test_every_arm_has_a_place_and_a_colour_of_its_own():
    assert ARM_ORDER == ("default", "mimetic", "conditioned", "scale_matched", "structured")
    assert len({ARM_COLORS[arm] for arm in ARM_ORDER}) == len(ARM_ORDER)


def test_plan_seeds_command(capsys):
    assert compare_main(["--plan-seeds", "--delta", "0.6", "--std", "0.1", "--arms", "2", "--metrics", "2"]) == 0
    out = capsys.readouterr().out
    needed = seeds_needed(0.6, 0.1, comparisons=4)
    assert out.startswith("2 arms x 2 metrics compared with default: to detect Δ = 0.6 (given) with std 0.1")
    assert f"two-sided level 0.05 / 4 (a family of 4 comparisons): n ≥ {needed} seeds per arm." in out
    assert f"{needed} | " in out and f"{needed - 1} | " in out
    # a shared image variance no number of seeds can average away
    assert compare_main(["--plan-seeds", "--delta", "0.6", "--std", "0.1", "--shared-variance", "1"]) == 0
    assert "no number of seeds suffices" in capsys.readouterr().out
    for argv, message in (
        (["--plan-seeds", "--delta", "0.6"], "needs --delta"),
        (["--plan-seeds", "--delta", "0.6", "--std", "0.1", "somedir"], "takes no run directories"),
        (["--plan-seeds", "--delta", "-1", "--std", "0.1"], "expected a positive number"),
        ([], "give run or experiment directories"),
    ):
        with pytest.raises(SystemExit) as e:
            compare_main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_delta_and_std_options_reach_the_report(cls_experiment, capsys):
    out_dir = cls_experiment.parent / "r"
    assert compare_main([str(cls_experiment), "--bootstrap", "0", "--delta", "top1=2", "--output", str(out_dir)]) == 0
    needed = seeds_needed(2.0, float(np.std([8, 8, -3], ddof=1)))
    assert (
        f"| conditioned | top-1 | against default (1) | 2 (given) | 6.35 (observed over 3 seeds) | {needed} | 3 |"
        in unpadded(capsys.readouterr().out)
    )
    stats = (out_dir / "stats.csv").read_text().splitlines()
    header = stats[0].split(",")
    assert header[:5] == ["stage", "arm", "lr_scale", "kind", "metric"]
    row = next(r.split(",") for r in stats if r.startswith("pretrain,conditioned,1,metric,top-1"))
    assert row[header.index("plan_delta")] == "2.0" and row[header.index("replication")] == "runs"
    assert row[header.index("plan_seeds_needed")] == str(seeds_needed(2.0, float(np.std([8, 8, -3], ddof=1))))
    # a std given for planning replaces the observed one; without --delta the plan is for the observed difference
    assert compare_main([str(cls_experiment), "--bootstrap", "0", "--std", "1.5", "--output", str(out_dir)]) == 0
    assert "| conditioned | top-1 | against default (1) | 4.33 (the observed difference) | 1.5 (given) |" in unpadded(
        capsys.readouterr().out
    )


def test_a_compare_into_the_same_folder_reuses_resamples_and_figures_while_their_inputs_hold(
    cls_experiment, monkeypatch
):
    """Image resamples and figures are kept in <output>/.cache and reused by the next compare into that folder while
    the per-image files, records, options and code they come from are unchanged; the report stays the same."""
    from condinit_det.evaluation import bootstrap
    from condinit_det.report import plots

    out = str(cls_experiment.parent / "report")
    drawn, write, resampled_mean = [], plots._write, bootstrap.resampled_mean
    monkeypatch.setattr(plots, "_write", lambda path, fig: (drawn.append(os.path.basename(path)), write(path, fig)))

    def intervals(report):
        return [(s.arm, s.metric, s.interval) for s in report.stage("pretrain").stats]

    report, text = compare_arms([str(cls_experiment)], output_dir=out, bootstrap=200, seed=3)
    resamples = sorted(p for p in os.listdir(os.path.join(out, ".cache")) if p.startswith("resampled-"))
    assert len(resamples) == 6 and "effects.png" in drawn  # one per run of the top-1 comparison
    assert intervals(compare_arms([str(cls_experiment)], bootstrap=200, seed=3)[0]) == intervals(report)

    drawn.clear()
    monkeypatch.setattr(bootstrap, "resampled_mean", None)  # a resample computed again would call it
    again, again_text = compare_arms([str(cls_experiment)], output_dir=out, bootstrap=200, seed=3)
    assert drawn == [] and again_text == text and intervals(again) == intervals(report)

    # an unreadable resample is computed again; another B or seed gets resamples of its own
    monkeypatch.setattr(bootstrap, "resampled_mean", resampled_mean)
    with open(os.path.join(out, ".cache", resamples[0]), "wb") as f:
        f.write(b"not an array")
    assert intervals(compare_arms([str(cls_experiment)], output_dir=out, bootstrap=200, seed=3)[0]) == intervals(report)
    assert np.fromfile(os.path.join(out, ".cache", resamples[0])).shape == (200,) and drawn == []
    compare_arms([str(cls_experiment)], output_dir=out, bootstrap=100, seed=3)
    assert len([p for p in os.listdir(os.path.join(out, ".cache")) if p.startswith("resampled-")]) == 12
    assert "effects.png" in drawn  # its intervals changed

    # a run's new training loss log: the figures are drawn again, the resamples reused
    drawn.clear()
    with open(cls_experiment / "conditioned" / "seed0" / "metrics.json", "w") as f:
        f.write('{"iteration": 1, "total_loss": 2.0}\n{"iteration": 2, "total_loss": 1.5}\n')
    compare_arms([str(cls_experiment)], output_dir=out, bootstrap=200, seed=3)
    assert {"effects.png", "top1.png", "top5.png"} <= set(drawn)
    assert len([p for p in os.listdir(os.path.join(out, ".cache")) if p.startswith("resampled-")]) == 12
