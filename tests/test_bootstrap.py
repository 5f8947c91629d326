import importlib.metadata
import math
import os
import re
import sys

import numpy as np
import pytest
from coco_bootstrap_helpers import coco_ap, paired_coco_bootstrap
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pycocotools import mask as mask_utils

from condinit_det.evaluation.bootstrap import (
    AP_METRICS,
    image_counts,
    image_draws,
    image_ids_digest,
    load_matches,
    match_images,
    match_predictions,
    resampled_ap,
    resampled_mean,
    save_matches,
)
from condinit_det.report.statistics import percentile_interval

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from coco_reevaluation import reevaluated_ap, resample_coco  # noqa: E402  (the re-evaluation reference)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 64


def _rle(x, y, w, h):
    m = np.zeros((SIZE, SIZE), dtype=np.uint8, order="F")
    m[y : y + h, x : x + w] = 1
    rle = mask_utils.encode(m)
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def _ann(image_id, ann_id, cat, x, y, w=16, h=16, crowd=0):
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": cat,
        "bbox": [x, y, w, h],
        "area": w * h,
        "iscrowd": crowd,
        "segmentation": _rle(x, y, w, h),
    }


def _det(image_id, cat, x, y, score, w=16, h=16):
    return {
        "image_id": image_id,
        "category_id": cat,
        "bbox": [x, y, w, h],
        "score": score,
        "segmentation": _rle(x, y, w, h),
    }


def _dataset(images, anns, num_categories=2):
    return {
        "images": [{"id": i, "width": SIZE, "height": SIZE, "file_name": f"{i}.png"} for i in images],
        "annotations": anns,
        "categories": [{"id": c, "name": f"c{c}"} for c in range(1, num_categories + 1)],
    }


def _synthetic(num_images, seed):
    """Two objects per image; arm a localizes them to ±1 px, arm b to ±4 px (IoU often below 0.75)."""
    rng = np.random.default_rng(seed)
    anns, pred_a, pred_b = [], [], []
    for i in range(num_images):
        image_id = 1000 + 3 * i  # ids not 1..n on purpose
        for cat in (1, 2):
            x, y = (int(v) for v in rng.integers(4, SIZE - 24, size=2))
            anns.append(_ann(image_id, 50 + len(anns), cat, x, y))
            for preds, noise in ((pred_a, 1), (pred_b, 4)):
                dx, dy = (int(v) for v in rng.integers(-noise, noise + 1, size=2))
                preds.append(_det(image_id, cat, x + dx, y + dy, float(rng.uniform(0.3, 1.0))))
    return _dataset([1000 + 3 * i for i in range(num_images)], anns), pred_a, pred_b


def _hard(seed):
    """
    12 images, 3 categories: crowd regions (a detection on one is ignored), empty images, images
    with objects and no detection, detections without objects, category 3 in two images only (absent
    from many resamples), duplicates, and scores on a 0.1 grid, so many are equal within an image and
    across images (COCO's order among them then follows the draw order).
    """
    rng = np.random.default_rng(seed)
    anns, preds = [], []
    ids = [7 + 5 * i for i in range(12)]
    for n, image_id in enumerate(ids):
        if n in (2, 9):
            continue  # empty: no objects, no detections
        for _ in range(int(rng.integers(1, 4))):
            cat = 3 if n in (4, 10) and rng.uniform() < 0.7 else int(rng.integers(1, 3))
            x, y, w, h = (int(v) for v in (*rng.integers(0, SIZE - 20, size=2), *rng.integers(6, 20, size=2)))
            crowd = int(rng.uniform() < 0.15)
            anns.append(_ann(image_id, 100 + len(anns), cat, x, y, w, h, crowd))
            if n in (5, 11):
                continue  # objects, no detection
            for _ in range(int(rng.integers(1, 3))):  # a detection, sometimes a duplicate
                dx, dy = (int(v) for v in rng.integers(-3, 4, size=2))
                wrong = rng.uniform() < 0.15
                preds.append(
                    _det(
                        image_id,
                        (cat % 3) + 1 if wrong else cat,
                        max(x + dx, 0),
                        max(y + dy, 0),
                        score=round(float(rng.uniform(0.1, 1.0)), 1),
                        w=w,
                        h=h,
                    )
                )
        if n in (3, 8):  # background false positives, one image with detections only
            preds.append(_det(image_id, int(rng.integers(1, 4)), 40, 40, round(float(rng.uniform(0.1, 1.0)), 1)))
    preds.append(_det(ids[9], 1, 10, 10, 0.5))  # an image without objects, with a detection
    return _dataset(ids, anns, num_categories=3), preds


def _assert_equal_to_reevaluation(gt, predictions, draws):
    for task in ("bbox", "segm"):
        fast = [resampled_ap(match_images(gt, p, task), draws) for p in predictions]
        for b, indices in enumerate(draws):
            reference = reevaluated_ap(gt, predictions, indices, task)
            for ours, ref in zip(fast, reference):
                for metric in AP_METRICS:
                    r, o = ref[metric], ours[metric][b]
                    assert (math.isnan(r) and math.isnan(o)) or abs(o - r) <= 1e-9, (task, metric, b, o, r)


def _ap_101(max_recall):
    """COCO AP when precision is 1 up to ``max_recall`` and no detection after: 101-point interpolation."""
    return 100.0 * np.sum(np.linspace(0, 1, 101) <= max_recall + 1e-9) / 101


def test_resampled_ap_equals_reevaluation():
    gt, preds = _hard(seed=0)
    m = match_images(gt, preds, "bbox")
    assert (m.group >= 0).sum() > 10  # many equal scores, within and across images
    assert m.gt_count[2].sum() > 0 and (m.gt_count[2] > 0).sum() <= 2
    _, pred_a, pred_b = _synthetic(12, seed=4)
    pred_b = [{**p, "image_id": gt["images"][(p["image_id"] - 1000) // 3]["id"]} for p in pred_b]
    n = len(gt["images"])
    draws = np.concatenate(
        [
            np.arange(n)[None],  # the evaluation set itself
            np.random.default_rng(1).integers(0, n, size=(10, n)),
            # one image n times; only empty images; category 3 drawn often
            np.array([[3] * n, [2, 9] * (n // 2), [4, 10, 4, 4, 10, 0, 1, 4, 3, 3, 8, 0]]),
        ]
    )
    assert any(not {4, 10} & set(row) for row in draws)  # a resample without category 3
    # the same detections with distinct scores (each category's order then the same in every resample)
    untied = [{**p, "score": p["score"] + 1e-6 * n} for n, p in enumerate(preds)]
    assert (match_images(gt, untied, "bbox").group < 0).all()
    _assert_equal_to_reevaluation(gt, [preds, pred_b, untied], draws)
    # a model without any detection: AP 0 wherever the resample has ground truth
    assert resampled_ap(match_images(gt, [], "segm"), draws[:2])["AP"] == pytest.approx([0.0, 0.0])
    _assert_equal_to_reevaluation(gt, [[]], draws[:2])


def test_identity_resample_is_coco_ap():
    gt, preds = _hard(seed=3)
    full = coco_ap(gt, preds)
    for task in ("bbox", "segm"):
        ap = resampled_ap(match_images(gt, preds, task), np.arange(len(gt["images"]))[None])["AP"]
        assert ap[0] == pytest.approx(full[task], abs=1e-9)
    only_empty = resampled_ap(match_images(gt, preds, "bbox"), np.array([[2, 9, 9]]))
    assert all(math.isnan(v[0]) for v in only_empty.values())  # no ground truth: COCO's -1


def test_duplicated_images_count_twice():
    # image 7: one object, detected exactly; image 9: one object, missed
    gt = _dataset([7, 9], [_ann(7, 1, 1, 10, 10), _ann(9, 2, 1, 30, 30)])
    preds = [_det(7, 1, 10, 10, 0.9)]
    assert coco_ap(gt, preds) == pytest.approx({"bbox": _ap_101(1 / 2), "segm": _ap_101(1 / 2)})

    data, (resampled,) = resample_coco(gt, [preds], np.array([0, 0, 1]))
    assert [im["id"] for im in data["images"]] == [1, 2, 3]
    assert [(a["id"], a["image_id"]) for a in data["annotations"]] == [(1, 1), (2, 2), (3, 3)]
    assert gt["images"][0]["id"] == 7 and preds[0]["image_id"] == 7  # inputs untouched
    for task in ("bbox", "segm"):
        ap = resampled_ap(match_images(gt, preds, task), np.array([[0, 0, 1], [1, 0, 1], [1, 1, 1]]))["AP"]
        # the detected image drawn twice: recall 2/3 instead of 1/2; once in three: 1/3; never: 0
        assert ap == pytest.approx([_ap_101(2 / 3), _ap_101(1 / 3), 0.0])


def test_bootstrap_interval_contains_estimate_and_shrinks_with_more_images():
    widths = []
    for num_images in (6, 48):
        gt, pred_a, pred_b = _synthetic(num_images, seed=1)
        full_a, full_b = coco_ap(gt, pred_a), coco_ap(gt, pred_b)
        diffs = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(0), num_resamples=200)
        assert set(diffs) == {"bbox", "segm"} and set(diffs["bbox"]) == set(AP_METRICS)
        assert diffs["bbox"]["AP"].shape == (200,)
        for task in ("bbox", "segm"):
            estimate = full_a[task] - full_b[task]
            assert estimate > 0  # arm a localizes better
            iv = percentile_interval(estimate, diffs[task]["AP"])
            assert iv.low <= estimate <= iv.high
        iv = percentile_interval(full_a["bbox"] - full_b["bbox"], diffs["bbox"]["AP"])
        widths.append(iv.high - iv.low)
    assert widths[1] < 0.75 * widths[0]


def test_bootstrap_is_paired_reproducible_and_uses_the_generators_draws():
    gt, pred_a, _ = _synthetic(5, seed=2)
    same = paired_coco_bootstrap(gt, pred_a, pred_a, np.random.default_rng(3), num_resamples=5)
    assert all(np.all(same[t][k] == 0) for t in same for k in AP_METRICS)  # same resample for both arms
    gt, pred_a, pred_b = _synthetic(5, seed=2)
    one = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(4), 4, iou_types=("bbox",))
    two = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(4), 4, iou_types=("bbox",))
    assert list(one) == ["bbox"] and np.array_equal(one["bbox"]["AP"], two["bbox"]["AP"])
    # resample b is the b-th rng.integers(0, n, size=n), as one re-evaluation per resample drew it
    rng = np.random.default_rng(4)
    for b in range(4):
        a_ap, b_ap = reevaluated_ap(gt, [pred_a, pred_b], rng.integers(0, 5, size=5), "bbox")
        for k in AP_METRICS:
            assert one["bbox"][k][b] == pytest.approx(a_ap[k] - b_ap[k], abs=1e-9)


def test_classification_bootstrap():
    # Per-image top-1 correctness of two models; their accuracy difference on shared resamples.
    labels = np.array([0, 1, 2, 3] * 25)
    top1_a = np.array([c if i % 5 else (c + 1) % 4 for i, c in enumerate(labels)])
    top1_b = np.array([c if i % 2 else (c + 1) % 4 for i, c in enumerate(labels)])
    ca, cb = (top1_a == labels).astype(float), (top1_b == labels).astype(float)
    assert ca.mean() == pytest.approx(0.8) and cb.mean() == pytest.approx(0.5)
    diffs = resampled_mean(100.0 * (ca - cb), image_draws(np.random.default_rng(0), 100, 300))
    assert diffs.shape == (300,)
    iv = percentile_interval(30.0, diffs)
    assert iv.low <= 30.0 <= iv.high and iv.low > 0
    # one resample by hand: the same image indices for both arms
    idx = np.random.default_rng(5).integers(0, 100, size=100)
    first = resampled_mean(100.0 * (ca - cb), image_draws(np.random.default_rng(5), 100, 1))[0]
    assert first == pytest.approx(100 * (ca[idx].mean() - cb[idx].mean()))


def test_saved_matches_resample_exactly_as_the_matching(tmp_path):
    gt, preds = _hard(seed=0)
    matches = match_predictions(gt, preds)
    assert set(matches) == {"bbox", "segm"} and matches["bbox"].images_sha1 == image_ids_digest(gt)
    path = str(tmp_path / "per_image" / "ap_iter0000100.npz")
    size = save_matches(path, matches)
    assert size == os.path.getsize(path) and not [n for n in os.listdir(tmp_path / "per_image") if n.endswith(".tmp")]
    loaded = load_matches(path)
    draws = np.concatenate([np.arange(12)[None], np.random.default_rng(2).integers(0, 12, size=(20, 12))])
    for task in ("bbox", "segm"):
        a, b = matches[task], loaded[task]
        for name in ("gt_count", "category", "image", "tp", "fp", "group", "iou_thresholds", "recall_thresholds"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert b.images_sha1 == a.images_sha1 and b.score == pytest.approx(a.score, rel=1e-6)  # float32 scores
        ours, theirs = resampled_ap(a, draws), resampled_ap(b, draws)
        assert all(np.array_equal(ours[k], theirs[k], equal_nan=True) for k in AP_METRICS)
        # the identity resample is the COCO AP of the evaluation
        assert theirs["AP"][0] == pytest.approx(coco_ap(gt, preds)[task], abs=1e-9)
    # predictions without masks: box matches only; a model without detections saves and loads too
    boxes_only = match_predictions(gt, [{k: v for k, v in p.items() if k != "segmentation"} for p in preds])
    assert set(boxes_only) == {"bbox"}
    save_matches(str(tmp_path / "empty.npz"), match_predictions(gt, [], iou_types=("bbox",)))
    assert load_matches(str(tmp_path / "empty.npz"))["bbox"].tp.shape == (10, 0)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a file of saved COCO matches"):
        load_matches(str(tmp_path / "bad.npz"))


def test_resampled_mean_counts_repeated_images_and_broadcasts():
    values = np.array([0.0, 10.0, 20.0, 30.0])
    draws = np.array([[0, 0, 1, 3], [2, 2, 2, 2]])
    assert image_counts(draws, 4).tolist() == [[2, 1, 0, 1], [0, 0, 4, 0]]
    assert resampled_mean(values, draws) == pytest.approx([10.0, 20.0])
    batch = np.stack([values, -values])[:, None, :]  # [2 experiments, 1 seed, 4 images]
    per_experiment = np.stack([draws, draws[::-1]])[:, None]  # [2, 1, B=2, n=4]
    out = resampled_mean(batch, per_experiment)
    assert out.shape == (2, 1, 2) and out[1, 0] == pytest.approx([-20.0, -10.0])
    with pytest.raises(ValueError, match="no evaluation images"):
        image_draws(np.random.default_rng(0), 0, 5)
    # the draws are the generator's stream: resample b is the b-th rng.integers(0, n, size=n)
    rng = np.random.default_rng(3)
    first, second = rng.integers(0, 5, 5), rng.integers(0, 5, 5)
    assert np.array_equal(image_draws(np.random.default_rng(3), 5, 2), np.stack([first, second]))


def test_installed_faster_coco_eval_is_in_the_declared_range_and_keeps_per_image_results():
    with open(os.path.join(ROOT, "setup.py")) as f:
        declared = re.search(r'"faster-coco-eval([^"]*)"', f.read()).group(1)
    specifier = SpecifierSet(declared)
    assert any(s.operator == "<" for s in specifier), f"no upper bound: {declared!r}"
    installed = importlib.metadata.version("faster-coco-eval")
    assert Version(installed) in specifier, (installed, declared)
    # What the matching reads: the per-image results of a separate evaluation, pickled as six fields
    # (detection matches [T*D], ground-truth matches [T*G], detection scores [D], ground-truth ignores
    # [G], detection ignores [T*D], matched pairs).
    from faster_coco_eval import COCO, COCOeval_faster

    gt = _dataset([7], [_ann(7, 1, 1, 10, 10), _ann(7, 2, 2, 30, 30)])
    coco = COCO(gt, print_function=lambda *_: None)
    ev = COCOeval_faster(
        coco, coco.loadRes([_det(7, 1, 10, 10, 0.9)]), "bbox", print_function=lambda *_: None, separate_eval=True
    )
    ev.evaluate()
    state = ev._evalImgs_cpp[0].__getstate__()  # category 1, area "all", image 7
    assert isinstance(state, tuple) and len(state) == 6
    num_t = len(ev.params.iouThrs)
    assert list(state[2]) == [0.9] and len(state[0]) == len(state[4]) == num_t and len(state[3]) == 1
    assert all(m == 1 for m in state[0])  # matched to ground truth 1 at every threshold
