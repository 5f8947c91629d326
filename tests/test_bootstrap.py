import numpy as np
import pytest
from pycocotools import mask as mask_utils

from condinit_det.evaluation.bootstrap import (classification_correctness, coco_ap, paired_accuracy_bootstrap,
                                               paired_coco_bootstrap, resample_coco)
from condinit_det.stats import percentile_interval

SIZE = 64


def _rle(x, y, w, h):
    m = np.zeros((SIZE, SIZE), dtype=np.uint8, order="F")
    m[y:y + h, x:x + w] = 1
    rle = mask_utils.encode(m)
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def _ann(image_id, ann_id, cat, x, y, w=16, h=16):
    return {"id": ann_id, "image_id": image_id, "category_id": cat, "bbox": [x, y, w, h], "area": w * h,
            "iscrowd": 0, "segmentation": _rle(x, y, w, h)}


def _det(image_id, cat, x, y, score, w=16, h=16):
    return {"image_id": image_id, "category_id": cat, "bbox": [x, y, w, h], "score": score,
            "segmentation": _rle(x, y, w, h)}


def _dataset(images, anns):
    return {"images": [{"id": i, "width": SIZE, "height": SIZE, "file_name": f"{i}.png"} for i in images],
            "annotations": anns, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}


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


def _ap_101(max_recall):
    """COCO AP when precision is 1 up to ``max_recall`` and no detection after: 101-point interpolation."""
    return 100.0 * np.sum(np.linspace(0, 1, 101) <= max_recall + 1e-9) / 101


def test_duplicated_images_count_twice():
    # image 7: one object, detected exactly; image 9: one object, missed
    gt = _dataset([7, 9], [_ann(7, 1, 1, 10, 10), _ann(9, 2, 1, 30, 30)])
    preds = [_det(7, 1, 10, 10, 0.9)]
    assert coco_ap(gt, preds) == pytest.approx({"bbox": _ap_101(1 / 2), "segm": _ap_101(1 / 2)})

    data, (resampled,) = resample_coco(gt, [preds], np.array([0, 0, 1]))
    assert [im["id"] for im in data["images"]] == [1, 2, 3]
    assert [(a["id"], a["image_id"]) for a in data["annotations"]] == [(1, 1), (2, 2), (3, 3)]
    assert sorted(p["image_id"] for p in resampled) == [1, 2]
    assert gt["images"][0]["id"] == 7 and preds[0]["image_id"] == 7  # inputs untouched
    # the detected image drawn twice: recall 2/3 instead of 1/2
    assert coco_ap(data, resampled) == pytest.approx({"bbox": _ap_101(2 / 3), "segm": _ap_101(2 / 3)})
    data, (resampled,) = resample_coco(gt, [preds], np.array([1, 0, 1]))
    assert coco_ap(data, resampled)["bbox"] == pytest.approx(_ap_101(1 / 3))


def test_bootstrap_interval_contains_estimate_and_shrinks_with_more_images():
    widths = []
    for num_images in (6, 48):
        gt, pred_a, pred_b = _synthetic(num_images, seed=1)
        full_a, full_b = coco_ap(gt, pred_a), coco_ap(gt, pred_b)
        diffs = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(0), num_resamples=60)
        assert set(diffs) == {"bbox", "segm"} and diffs["bbox"].shape == (60,)
        for task in ("bbox", "segm"):
            estimate = full_a[task] - full_b[task]
            assert estimate > 0  # arm a localizes better
            assert percentile_interval(estimate, diffs[task]).contains(estimate)
        iv = percentile_interval(full_a["bbox"] - full_b["bbox"], diffs["bbox"])
        widths.append(iv.high - iv.low)
    assert widths[1] < 0.75 * widths[0]


def test_bootstrap_is_paired_and_reproducible():
    gt, pred_a, _ = _synthetic(5, seed=2)
    same = paired_coco_bootstrap(gt, pred_a, pred_a, np.random.default_rng(3), num_resamples=5)
    assert np.all(same["bbox"] == 0) and np.all(same["segm"] == 0)  # same resample for both arms
    gt, pred_a, pred_b = _synthetic(5, seed=2)
    one = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(4), 4, iou_types=("bbox",))
    two = paired_coco_bootstrap(gt, pred_a, pred_b, np.random.default_rng(4), 4, iou_types=("bbox",))
    assert list(one) == ["bbox"] and np.array_equal(one["bbox"], two["bbox"])


def test_classification_bootstrap():
    labels = [0, 1, 2, 3] * 25
    a = {"epoch": 3, "labels": labels, "top1": [l if i % 5 else (l + 1) % 4 for i, l in enumerate(labels)],
         "top5_hit": [1] * 100}
    b = {"epoch": 3, "labels": labels, "top1": [l if i % 2 else (l + 1) % 4 for i, l in enumerate(labels)],
         "top5_hit": [int(i % 10 > 0) for i in range(100)]}
    ca, cb = classification_correctness(a), classification_correctness(b)
    assert ca["top1"].mean() == pytest.approx(0.8) and cb["top1"].mean() == pytest.approx(0.5)
    assert cb["top5"].mean() == pytest.approx(0.9)
    diffs = paired_accuracy_bootstrap(ca["top1"], cb["top1"], np.random.default_rng(0), 300)
    assert diffs.shape == (300,)
    iv = percentile_interval(30.0, diffs)
    assert iv.contains(30.0) and iv.low > 0
    # one resample by hand: the same image indices for both arms
    idx = np.random.default_rng(5).integers(0, 100, size=100)
    first = paired_accuracy_bootstrap(ca["top1"], cb["top1"], np.random.default_rng(5), 1)[0]
    assert first == pytest.approx(100 * (ca["top1"][idx].mean() - cb["top1"][idx].mean()))
    with pytest.raises(ValueError, match="equal-length"):
        paired_accuracy_bootstrap([1, 0], [1], np.random.default_rng(0), 2)
