"""Paired bootstrap over evaluation images.

Two models evaluated on the same images are compared on resamples of those images: each
resample draws as many images as the evaluation set holds, with replacement, and both models
are scored on the *same* resample. For COCO detection every resample is a new COCO dataset in
which a drawn image gets a fresh image id (and its annotations fresh ids), so an image drawn
twice counts twice; box and mask AP are then recomputed with faster-coco-eval
(``COCOeval_faster``), or pycocotools when it is not installed. For classification the
per-image correctness is resampled directly.

No detectron2 import.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "classification_correctness",
    "coco_ap",
    "load_json",
    "paired_accuracy_bootstrap",
    "paired_coco_bootstrap",
    "resample_coco",
]

IOU_TYPES = ("bbox", "segm")


def load_json(path: Union[str, os.PathLike]):
    """A JSON file (COCO annotations or a COCO results list)."""
    with open(path) as f:
        return json.load(f)


def _coco_api():
    """(COCO, COCOeval) classes: faster-coco-eval when installed, else pycocotools."""
    try:
        from faster_coco_eval import COCO, COCOeval_faster

        return COCO, COCOeval_faster, True
    except ImportError:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return COCO, COCOeval, False


def _quiet(*_args, **_kwargs):
    pass


def _build_gt(dataset: dict):
    coco_cls, _, fast = _coco_api()
    if fast:
        return coco_cls(dataset, print_function=_quiet)
    gt = coco_cls()
    gt.dataset = dataset
    gt.createIndex()
    return gt


def _average_precision(coco_gt, predictions: List[dict], iou_type: str) -> float:
    """COCO AP (percent, IoU 0.50:0.95, 100 detections) of ``predictions`` for one iou type."""
    if not coco_gt.dataset.get("annotations"):
        return float("nan")
    if not predictions:
        return 0.0
    # loadRes sets "id"/"area" on the records: hand it copies. For masks drop "bbox" so the
    # instance area is the mask area, as detectron2's evaluator does.
    drop = "bbox" if iou_type == "segm" else None
    dets = [{k: v for k, v in p.items() if k != drop} for p in predictions]
    _, eval_cls, fast = _coco_api()
    coco_dt = coco_gt.loadRes(dets)
    ev = eval_cls(coco_gt, coco_dt, iou_type, print_function=_quiet) if fast else eval_cls(coco_gt, coco_dt, iou_type)
    ev.evaluate()
    ev.accumulate()
    if fast:
        ev.summarize()
    else:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            ev.summarize()
    ap = float(ev.stats[0])
    return float("nan") if ap < 0 else 100.0 * ap


def coco_ap(ground_truth: Union[str, dict], predictions: Sequence[dict],
            iou_types: Sequence[str] = IOU_TYPES) -> Dict[str, float]:
    """Box / mask AP (percent) of COCO results on a COCO annotation json (path or dict)."""
    dataset = load_json(ground_truth) if not isinstance(ground_truth, Mapping) else ground_truth
    gt = _build_gt(_copy_dataset(dataset))
    return {t: _average_precision(gt, list(predictions), t) for t in iou_types}


def _copy_dataset(dataset: Mapping) -> dict:
    return {
        **{k: v for k, v in dataset.items() if k not in ("images", "annotations")},
        "images": [dict(im) for im in dataset.get("images", [])],
        "annotations": [dict(a) for a in dataset.get("annotations", [])],
    }


def _by_image(items: Sequence[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for it in items:
        out.setdefault(it["image_id"], []).append(it)
    return out


def resample_coco(dataset: Mapping, predictions: Sequence[Sequence[dict]], indices: Sequence[int]
                  ) -> Tuple[dict, List[List[dict]]]:
    """
    The COCO dataset and prediction lists restricted to the images ``dataset["images"][i]`` for
    ``i`` in ``indices`` (repeats allowed). The j-th drawn image gets image id ``j + 1``, its
    annotations consecutive fresh ids, and its predictions that image id: a repeated image
    counts as many times as it was drawn.
    """
    images = dataset["images"]
    anns = _by_image(dataset.get("annotations", []))
    preds = [_by_image(p) for p in predictions]
    new_images, new_anns = [], []
    new_preds: List[List[dict]] = [[] for _ in predictions]
    for j, i in enumerate(indices):
        image = images[int(i)]
        new_id = j + 1
        new_images.append({**image, "id": new_id})
        for a in anns.get(image["id"], ()):
            new_anns.append({**a, "id": len(new_anns) + 1, "image_id": new_id})
        for out, by_image in zip(new_preds, preds):
            out.extend({**p, "image_id": new_id} for p in by_image.get(image["id"], ()))
    resampled = {k: v for k, v in dataset.items() if k not in ("images", "annotations")}
    resampled.update(images=new_images, annotations=new_anns)
    return resampled, new_preds


def paired_coco_bootstrap(ground_truth: Union[str, dict], predictions_a: Sequence[dict],
                          predictions_b: Sequence[dict], rng: np.random.Generator,
                          num_resamples: int = 200, iou_types: Sequence[str] = IOU_TYPES
                          ) -> Dict[str, np.ndarray]:
    """
    AP(a) - AP(b) in percent on ``num_resamples`` bootstrap resamples of the evaluation images
    (the same resample for both prediction lists). Returns iou type -> array [num_resamples].
    """
    dataset = load_json(ground_truth) if not isinstance(ground_truth, Mapping) else ground_truth
    n = len(dataset["images"])
    if n == 0:
        raise ValueError("the ground truth has no images to resample")
    diffs = {t: np.empty(num_resamples) for t in iou_types}
    for b in range(num_resamples):
        indices = rng.integers(0, n, size=n)
        data, (pa, pb) = resample_coco(dataset, [predictions_a, predictions_b], indices)
        gt = _build_gt(data)
        for t in iou_types:
            diffs[t][b] = _average_precision(gt, pa, t) - _average_precision(gt, pb, t)
    return diffs


def paired_accuracy_bootstrap(correct_a: Sequence[float], correct_b: Sequence[float],
                              rng: np.random.Generator, num_resamples: int = 200) -> np.ndarray:
    """
    Accuracy(a) - accuracy(b) in percent on bootstrap resamples of the evaluation images, from
    per-image correctness (0/1, same image order for both). Returns an array [num_resamples].
    """
    a = np.asarray(correct_a, dtype=np.float64)
    b = np.asarray(correct_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"per-image correctness of both models must be equal-length vectors; got {a.shape} and {b.shape}")
    d = a - b
    out = np.empty(num_resamples)
    for i in range(num_resamples):
        out[i] = 100.0 * d[rng.integers(0, d.size, size=d.size)].mean()
    return out


def classification_correctness(eval_predictions: Mapping) -> Dict[str, np.ndarray]:
    """Per-image top-1 / top-5 correctness (0/1) from an ``eval_predictions.json`` payload."""
    labels = np.asarray(eval_predictions["labels"])
    out = {"top1": (np.asarray(eval_predictions["top1"]) == labels).astype(np.float64)}
    if eval_predictions.get("top5_hit") is not None:
        out["top5"] = np.asarray(eval_predictions["top5_hit"], dtype=np.float64)
    return out

