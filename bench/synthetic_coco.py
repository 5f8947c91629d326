"""
Synthetic COCO-style ground truth and detector outputs, for the evaluation benchmark and its tests, and
detectron2 training inputs for the step and conditioning benchmarks (:func:`detection_batches`).

The ground truth is a COCO annotation dict (polygon masks, a few crowd regions with
uncompressed RLE, non-contiguous category ids like COCO's 1..90). Predictions imitate a
Mask R-CNN at test time: each object is found with probability ``recall`` by a jittered
box/mask, some get duplicates or a wrong class, and random false positives are added; at
most ``max_dets_per_image`` detections per image, highest scores kept.

Everything is drawn from a ``numpy.random.Generator`` seeded by the caller, so the same
arguments always give the same data.
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np
import pycocotools.mask as mask_util

__all__ = [
    "detection_batches",
    "make_synthetic_coco",
    "make_synthetic_predictions",
    "predictions_to_instances",
    "predictions_to_coco_results",
    "synthetic_results",
]

INSTANCES_PER_IMAGE = 7  # COCO train2017: 860,001 instances / 118,287 images = 7.3
POLYGON_VERTICES = 16


def _ellipse_polygon(rng, cx, cy, rx, ry, num_vertices=16, wobble=0.15):
    # A wobbly ellipse: irregular enough that box IoU and mask IoU differ.
    angles = np.sort(rng.uniform(0.0, 2.0 * math.pi, size=num_vertices))
    radius = 1.0 + rng.uniform(-wobble, wobble, size=num_vertices)
    xs = cx + rx * radius * np.cos(angles)
    ys = cy + ry * radius * np.sin(angles)
    return np.stack([xs, ys], axis=1)


def _clip_polygon(poly, width, height):
    poly = poly.copy()
    poly[:, 0] = np.clip(poly[:, 0], 0.0, width - 1e-3)
    poly[:, 1] = np.clip(poly[:, 1], 0.0, height - 1e-3)
    return poly


def _polygon_rle(poly, height, width):
    rles = mask_util.frPyObjects([poly.reshape(-1).tolist()], height, width)
    return mask_util.merge(rles)


def _random_object(rng, width, height):
    # Log-uniform sizes cover COCO's small (< 32^2), medium and large (> 96^2) ranges.
    side = math.exp(rng.uniform(math.log(6.0), math.log(0.6 * min(width, height))))
    aspect = math.exp(rng.uniform(-0.7, 0.7))
    rx, ry = 0.5 * side * aspect, 0.5 * side / aspect
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    return _clip_polygon(_ellipse_polygon(rng, cx, cy, rx, ry), width, height)


def make_synthetic_coco(
    *,
    num_images: int,
    num_categories: int = 10,
    objects_per_image: float = 7.0,
    image_size=(480, 640),
    crowd_fraction: float = 0.02,
    empty_categories: int = 0,
    seed: int = 0,
) -> dict:
    """
    Build a COCO-format ground-truth dict.

    Args:
        num_images: number of images; image ids are 1..num_images.
        num_categories: number of categories; ids are non-contiguous (1, 2, 3, 5, 6, 7, 9, ...).
        objects_per_image: mean of the Poisson number of objects per image.
        image_size: (height, width) of every image.
        crowd_fraction: probability that an object is a crowd region (iscrowd=1, RLE mask).
        empty_categories: the last this-many categories get no annotations at all.
        seed: seed of the generator.

    Returns:
        dict with "images", "annotations", "categories" (COCO json layout).
    """
    if num_images < 1 or num_categories < 1:
        raise ValueError(f"num_images and num_categories must be >= 1, got {num_images} and {num_categories}")
    if not 0 <= empty_categories < num_categories:
        raise ValueError(
            f"empty_categories must be in [0, num_categories), got {empty_categories} "
            f"for num_categories={num_categories}"
        )
    rng = np.random.default_rng(seed)
    height, width = image_size
    categories = [{"id": i + 1 + i // 3, "name": f"class_{i}", "supercategory": "thing"} for i in range(num_categories)]
    annotated_ids = [c["id"] for c in categories[: num_categories - empty_categories]]
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        images.append({"id": image_id, "file_name": f"{image_id:08d}.jpg", "height": height, "width": width})
        for _ in range(rng.poisson(objects_per_image)):
            poly = _random_object(rng, width, height)
            rle = _polygon_rle(poly, height, width)
            area = float(mask_util.area(rle))
            if area < 1:
                continue
            x, y, w, h = (float(v) for v in mask_util.toBbox(rle))
            ann = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": int(rng.choice(annotated_ids)),
                "bbox": [x, y, w, h],
                "area": area,
                "iscrowd": 0,
                "segmentation": [poly.reshape(-1).round(2).tolist()],
            }
            if rng.uniform() < crowd_fraction:
                # COCO stores crowd regions as uncompressed RLE.
                mask = mask_util.decode(rle)
                flat = mask.reshape(-1, order="F")
                change = np.flatnonzero(np.diff(flat)) + 1
                bounds = np.concatenate([[0], change, [flat.size]])
                counts = np.diff(bounds).tolist()
                if flat[0] == 1:
                    counts = [0] + counts
                ann["iscrowd"] = 1
                ann["segmentation"] = {"counts": counts, "size": [height, width]}
            annotations.append(ann)
    return {"images": images, "annotations": annotations, "categories": categories}


def make_synthetic_predictions(
    coco_gt: dict,
    *,
    recall: float = 0.85,
    duplicate_rate: float = 0.3,
    wrong_class_rate: float = 0.1,
    false_positives_per_image: float = 8.0,
    max_dets_per_image: int = 100,
    images_without_predictions=(),
    seed: int = 0,
) -> Dict[int, List[dict]]:
    """
    Draw detector outputs for a ground-truth dict from :func:`make_synthetic_coco`.

    Args:
        coco_gt: the ground-truth dict.
        recall: probability that an object gets a (jittered) detection.
        duplicate_rate: probability that a detected object gets a second, worse detection.
        wrong_class_rate: probability that a detection carries a random class.
        false_positives_per_image: mean of the Poisson number of background detections.
        max_dets_per_image: keep at most this many detections per image (highest scores).
        images_without_predictions: image ids that get no detections at all.
        seed: seed of the generator.

    Returns:
        {image_id: [{"box": [x0, y0, x1, y1] (absolute XYXY), "score": float,
        "category": contiguous class index in [0, num_categories), "rle": compressed RLE}]},
        with an entry (possibly empty) for every image, detections sorted by decreasing score.
    """
    rng = np.random.default_rng(seed)
    cat_ids = sorted(c["id"] for c in coco_gt["categories"])
    contiguous = {cid: i for i, cid in enumerate(cat_ids)}
    anns_per_image: Dict[int, List[dict]] = {img["id"]: [] for img in coco_gt["images"]}
    for ann in coco_gt["annotations"]:
        anns_per_image[ann["image_id"]].append(ann)
    skip = set(images_without_predictions)

    out: Dict[int, List[dict]] = {}
    for img in coco_gt["images"]:
        height, width = img["height"], img["width"]
        dets = []

        # Called only within this image's iteration; the defaults bind this image's size and list.
        def add(poly, score, category, width=width, height=height, dets=dets):
            poly = _clip_polygon(poly, width, height)
            rle = _polygon_rle(poly, height, width)
            x0, y0 = poly.min(axis=0)
            x1, y1 = poly.max(axis=0)
            # The box head and the mask head disagree a little, as in a real detector.
            noise = rng.normal(0.0, 0.02, size=4) * max(x1 - x0, y1 - y0)
            box = [x0 + noise[0], y0 + noise[1], x1 + noise[2], y1 + noise[3]]
            box = [
                float(np.clip(box[0], 0, width)),
                float(np.clip(box[1], 0, height)),
                float(np.clip(max(box[2], box[0] + 1), 0, width)),
                float(np.clip(max(box[3], box[1] + 1), 0, height)),
            ]
            if rng.uniform() < wrong_class_rate:
                category = int(rng.integers(len(cat_ids)))
            dets.append({"box": box, "score": float(score), "category": category, "rle": rle})

        for ann in anns_per_image[img["id"]]:
            if ann["iscrowd"] or rng.uniform() >= recall:
                continue
            x, y, w, h = ann["bbox"]
            size = max(w, h)
            cx, cy = x + w / 2, y + h / 2
            for k in range(2 if rng.uniform() < duplicate_rate else 1):
                jitter = 0.04 + 0.12 * k + 0.08 * rng.uniform()
                poly = _ellipse_polygon(
                    rng,
                    cx + rng.normal(0, jitter) * size,
                    cy + rng.normal(0, jitter) * size,
                    0.5 * w * math.exp(rng.normal(0, jitter)),
                    0.5 * h * math.exp(rng.normal(0, jitter)),
                )
                score = rng.beta(5, 2) * (0.6 if k else 1.0)
                add(poly, score, contiguous[ann["category_id"]])
        for _ in range(rng.poisson(false_positives_per_image)):
            add(
                _random_object(rng, width, height),
                rng.beta(1.2, 6),
                int(rng.integers(len(cat_ids))),
            )

        dets.sort(key=lambda d: -d["score"])
        out[img["id"]] = [] if img["id"] in skip else dets[:max_dets_per_image]
    return out


def synthetic_results(coco_gt: dict, *, seed: int, recall: float = 0.85) -> Dict[int, List[dict]]:
    """{image_id: COCO results} of the benchmarks' detector: :func:`make_synthetic_predictions` with 25 background
    detections per image on average, through :func:`predictions_to_coco_results`."""
    dets = make_synthetic_predictions(coco_gt, recall=recall, false_positives_per_image=25.0, seed=seed)
    return {image_id: predictions_to_coco_results(d, image_id) for image_id, d in dets.items()}


def predictions_to_instances(dets: List[dict], image_size, *, with_masks: bool = True):
    """
    Turn one image's detections from :func:`make_synthetic_predictions` into the
    ``{"instances": Instances}`` dict a detectron2 model returns at test time
    (pred_boxes XYXY, scores, pred_classes, pred_masks bool [N, H, W]).
    """
    import torch
    from detectron2.structures import Boxes, Instances

    height, width = image_size
    inst = Instances((height, width))
    inst.pred_boxes = Boxes(torch.tensor([d["box"] for d in dets], dtype=torch.float32).reshape(-1, 4))
    inst.scores = torch.tensor([d["score"] for d in dets], dtype=torch.float32)
    inst.pred_classes = torch.tensor([d["category"] for d in dets], dtype=torch.int64)
    if with_masks:
        if dets:
            masks = mask_util.decode([d["rle"] for d in dets])  # [H, W, N]
            inst.pred_masks = torch.from_numpy(np.ascontiguousarray(masks.transpose(2, 0, 1))).bool()
        else:
            inst.pred_masks = torch.zeros((0, height, width), dtype=torch.bool)
    return {"instances": inst}


def predictions_to_coco_results(dets: List[dict], image_id: int) -> List[dict]:
    """
    One image's detections in the form ``COCOEvaluator.process`` stores them (the output of
    detectron2's ``instances_to_coco_json`` on :func:`predictions_to_instances`): XYWH boxes and
    scores rounded through float32, contiguous class ids, RLE counts as str. Skips the
    mask decode/encode round trip, which makes large benchmarks affordable.
    """
    if not dets:
        return []
    boxes = np.asarray([d["box"] for d in dets], dtype=np.float32)
    boxes[:, 2:] -= boxes[:, :2]  # XYXY -> XYWH in float32, as BoxMode.convert does on a float32 tensor
    scores = np.asarray([d["score"] for d in dets], dtype=np.float32)
    results = []
    for d, box, score in zip(dets, boxes.tolist(), scores.tolist()):
        rle = {"size": list(d["rle"]["size"]), "counts": d["rle"]["counts"].decode("utf-8")}
        results.append(
            {
                "image_id": image_id,
                "category_id": d["category"],
                "bbox": box,
                "score": score,
                "segmentation": rle,
            }
        )
    return results


def detection_batches(*, num: int, batch: int, size, num_classes: int, seed: int) -> List[list]:
    """``num`` batches of ``batch`` detectron2 training inputs (uint8 CHW images of ``size`` (h, w), Instances with
    INSTANCES_PER_IMAGE boxes of 5-50% of the side, their classes and elliptic polygon masks), drawn from a
    generator seeded by ``seed``."""
    import torch
    from detectron2.structures import Boxes, Instances, PolygonMasks

    rng = np.random.default_rng(seed)
    h, w = size
    angles = np.linspace(0.0, 2.0 * np.pi, POLYGON_VERTICES, endpoint=False)
    batches = []
    for _ in range(num):
        inputs = []
        for _ in range(batch):
            image = torch.from_numpy(rng.integers(0, 256, size=(3, h, w), dtype=np.uint8))
            sides = rng.uniform(0.05, 0.5, size=(INSTANCES_PER_IMAGE, 2)) * np.array([w, h])
            corners = rng.uniform(0.0, 1.0, size=(INSTANCES_PER_IMAGE, 2)) * (np.array([w, h]) - sides)
            polygons, boxes = [], []
            for (x0, y0), (bw, bh) in zip(corners, sides):
                xs = x0 + bw / 2 * (1 + np.cos(angles))
                ys = y0 + bh / 2 * (1 + np.sin(angles))
                polygons.append([np.stack([xs, ys], axis=1).reshape(-1)])
                # Boxes from the masks, as the recipes' mapper recomputes them (recompute_boxes=True).
                boxes.append([xs.min(), ys.min(), xs.max(), ys.max()])
            instances = Instances((h, w))
            instances.gt_boxes = Boxes(torch.tensor(np.array(boxes), dtype=torch.float32))
            instances.gt_classes = torch.from_numpy(rng.integers(0, num_classes, size=INSTANCES_PER_IMAGE))
            instances.gt_masks = PolygonMasks(polygons)
            inputs.append({"image": image, "height": h, "width": w, "instances": instances})
        batches.append(inputs)
    return batches
