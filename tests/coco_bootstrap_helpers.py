"""References for the tests of the image bootstrap: COCO AP evaluated from scratch, and the paired
bootstrap of two prediction lists composed from the matching and its resampled accumulation."""

import contextlib
import io
from typing import Dict, Mapping, Sequence, Union

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

from condinit_det.evaluation.bootstrap import AP_METRICS, match_images, resampled_ap
from condinit_det.utils.fileio import read_json

IOU_TYPES = ("bbox", "segm")


def coco_ap(
    ground_truth: Union[str, dict], predictions: Sequence[dict], iou_types: Sequence[str] = IOU_TYPES
) -> Dict[str, float]:
    """Box / mask AP (percent, NaN where COCO gives -1) of COCO results on a COCO annotation json (path or dict)."""
    dataset = read_json(ground_truth) if not isinstance(ground_truth, Mapping) else ground_truth
    dataset = {
        **dataset,
        "images": [dict(im) for im in dataset["images"]],
        "annotations": [dict(a) for a in dataset.get("annotations", [])],
    }
    gt = COCO(dataset, print_function=lambda *_: None)
    out = {}
    for t in iou_types:
        # Masks: without "bbox", the instance area is the mask area (as detectron2's evaluator has it).
        dets = [{k: v for k, v in p.items() if not (t == "segm" and k == "bbox")} for p in predictions]
        ev = COCOeval_faster(gt, gt.loadRes(dets), t, print_function=lambda *_: None)
        with contextlib.redirect_stdout(io.StringIO()):
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        ap = float(ev.stats[0])
        out[t] = float("nan") if ap < 0 else 100.0 * ap
    return out


def paired_coco_bootstrap(
    ground_truth: dict,
    predictions_a: Sequence[dict],
    predictions_b: Sequence[dict],
    rng: np.random.Generator,
    num_resamples: int = 1000,
    iou_types: Sequence[str] = IOU_TYPES,
) -> Dict[str, Dict[str, np.ndarray]]:
    """AP(a) - AP(b) (percent) on the same ``num_resamples`` resamples of the images for both lists;
    resample b is the b-th ``rng.integers(0, n, size=n)``. Returns iou type -> metric -> [num_resamples]."""
    n = len(ground_truth["images"])
    draws = rng.integers(0, n, size=(num_resamples, n))  # the same stream as num_resamples draws of n
    out = {}
    for t in iou_types:
        a = resampled_ap(match_images(ground_truth, predictions_a, t), draws)
        b = resampled_ap(match_images(ground_truth, predictions_b, t), draws)
        out[t] = {k: a[k] - b[k] for k in AP_METRICS}
    return out
