"""
The reference for the image bootstrap: re-evaluate COCO on a resampled dataset.

A resample of the images (``indices``, repeats allowed) becomes a new COCO dataset whose j-th image
is ``dataset["images"][indices[j]]`` with image id ``j + 1``, its annotations consecutive fresh ids
and its predictions that image id, so a repeated image counts as many times as it was drawn; COCO
is then run on it from scratch. This is what ``condinit_det.evaluation.bootstrap.resampled_ap``
must equal for the same draws, and what it replaced (one full COCO evaluation per resample, model
and task). Used by ``bench/bench_bootstrap.py`` and ``tests/test_bootstrap.py``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Dict, List, Mapping, Sequence, Tuple

from condinit_det.evaluation.bootstrap import AP_METRICS, coco_evaluator, coco_ground_truth

__all__ = ["reevaluated_ap", "resample_coco"]


def _by_image(items: Sequence[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for it in items:
        out.setdefault(it["image_id"], []).append(it)
    return out


def resample_coco(
    dataset: Mapping, predictions: Sequence[Sequence[dict]], indices: Sequence[int]
) -> Tuple[dict, List[List[dict]]]:
    """The resampled COCO dataset and prediction lists (see module doc); inputs are not modified."""
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


def reevaluated_ap(
    dataset: Mapping, predictions: Sequence[Sequence[dict]], indices: Sequence[int], iou_type: str
) -> List[Dict[str, float]]:
    """COCO AP / AP50 / AP75 (percent, NaN where COCO gives -1) of each prediction list on the resample."""
    data, resampled = resample_coco(dataset, predictions, indices)
    gt = coco_ground_truth(data)
    out = []
    for preds in resampled:
        ev = coco_evaluator(gt, preds, iou_type)
        with contextlib.redirect_stdout(io.StringIO()):
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        out.append(
            {
                name: (float("nan") if ev.stats[n] < 0 else 100.0 * float(ev.stats[n]))
                for n, name in enumerate(AP_METRICS)
            }
        )
    return out
