"""Tiny datasets in the layouts the real configs read, written from the embedded shapes renderers.

- :func:`write_coco_layout`: COCO 2017 instance segmentation, as detectron2's builtin ``coco_2017_*``
  datasets find it under ``$DETECTRON2_DATASETS``::

      <root>/coco/annotations/instances_{train,val}2017.json
      <root>/coco/{train,val}2017/<12-digit image id>.jpg

  Every json lists the 80 COCO thing categories (ids 1..90 with COCO's gaps, detectron2's names, which
  its builtin metadata requires); objects are polygon masks (one polygon per connected part), some
  objects are crowd regions (``iscrowd=1``, uncompressed RLE, as in COCO), and some images have no
  annotations. Images are JPEG, wider than tall (COCO's typical orientation).
- :func:`write_image_folder`: an ImageNet-style ``<root>/{train,val}/<class>/<image>.png`` folder.
- :func:`small_digits_cls`: the first images per class and split of the embedded digits-cls, in its layout.

Everything is drawn from the renderers' own seeded generators: the same arguments write the same files.
"""

import json
from pathlib import Path
from typing import Dict, List, Tuple

import cv2
import numpy as np
import pycocotools.mask as mask_util

from condinit_det.data import SHAPE_CLASSES, ShapesSpec, render_image
from condinit_det.data.classification import CLASSES as CLS_CLASSES
from condinit_det.data.classification import ShapesClsSpec, render_classification_image

__all__ = ["COCO_CATEGORY_OF_SHAPE", "small_digits_cls", "write_coco_layout", "write_image_folder"]

# Each shape class is stored under one COCO category; the ids are spread over 1..90 so that the
# dataset-id -> contiguous-id mapping (which skips COCO's gaps) matters.
COCO_CATEGORY_OF_SHAPE = {"circle": 37, "square": 72, "triangle": 38, "star": 34, "cross": 90}
SPLITS = {"train": "train2017", "val": "val2017"}
_SEED = 2026


def coco_thing_categories() -> List[Dict]:
    """The 80 COCO thing categories as an annotation file lists them (id, name, supercategory)."""
    from detectron2.data.datasets.builtin_meta import COCO_CATEGORIES

    cats = [
        {"id": c["id"], "name": c["name"], "supercategory": c.get("supercategory", "")}
        for c in COCO_CATEGORIES
        if c["isthing"] == 1
    ]
    assert len(cats) == 80
    return cats


def _polygons(mask: np.ndarray) -> List[List[float]]:
    """Outer contours of the connected parts of ``mask`` as COCO polygons ``[x0, y0, x1, y1, ...]``;
    parts with fewer than 3 vertices are dropped (COCO has none)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polys = []
    for c in contours:
        if len(c) >= 3:
            # Pixel centres: COCO polygons trace the boundary in continuous coordinates.
            polys.append([float(v) + 0.5 for v in c.reshape(-1)])
    return polys


def _uncompressed_rle(mask: np.ndarray) -> Dict:
    """COCO's crowd encoding: run lengths of 0s then 1s, alternating, in column-major order."""
    flat = mask.astype(np.uint8).reshape(-1, order="F")
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:  # runs start with zeros
        counts = [0] + counts
    return {"counts": [int(c) for c in counts], "size": [int(mask.shape[0]), int(mask.shape[1])]}


def _widen(img: np.ndarray, width: int) -> np.ndarray:
    """Pad the square render on the right to ``width`` with its mean colour (no object is cut)."""
    pad = width - img.shape[1]
    color = [float(v) for v in img.reshape(-1, 3).mean(0)]
    return cv2.copyMakeBorder(img, 0, 0, 0, pad, cv2.BORDER_CONSTANT, value=color)


def _empty_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth random background without objects."""
    small = rng.integers(0, 256, size=(3, 4, 3)).astype(np.uint8)
    img = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    img += rng.normal(0.0, 4.0, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def _write_split(root: Path, split: str, num_images: int, num_empty: int, size: int, width: int) -> Tuple[int, int]:
    image_dir = root / "coco" / SPLITS[split]
    image_dir.mkdir(parents=True)
    spec = ShapesSpec(image_size=size)
    images, annotations = [], []
    crowd = 0
    for idx in range(num_images):
        # COCO ids are large and not consecutive.
        image_id = 139 + 1000 * idx + (7 if split == "val" else 0)
        empty = idx >= num_images - num_empty
        if empty:
            img, instances = _empty_image(np.random.default_rng([_SEED, idx]), size, width), []
        else:
            img, instances = render_image(_SEED, split, idx, spec)
            img = _widen(img, width)
        file_name = f"{image_id:012d}.jpg"
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok, file_name
        (image_dir / file_name).write_bytes(buf.tobytes())
        images.append({"id": image_id, "file_name": file_name, "height": size, "width": width, "license": 1})
        for k, inst in enumerate(instances):
            mask = np.zeros((size, width), dtype=bool)
            mask[:, :size] = inst.mask
            # Every second image stores its last object as a crowd region (when it has others).
            is_crowd = idx % 2 == 0 and k == len(instances) - 1 and k > 0
            if is_crowd:
                segm = _uncompressed_rle(mask)
                rle = mask_util.frPyObjects(segm, size, width)
                crowd += 1
            else:
                segm = _polygons(mask)
                if not segm:
                    continue
                rle = mask_util.merge(mask_util.frPyObjects(segm, size, width))
            annotations.append(
                {
                    "id": len(annotations) + 1 + (100000 if split == "val" else 0),
                    "image_id": image_id,
                    "category_id": COCO_CATEGORY_OF_SHAPE[SHAPE_CLASSES[inst.category_id - 1]],
                    "segmentation": segm,
                    "area": float(mask_util.area(rle)),
                    "bbox": [float(v) for v in mask_util.toBbox(rle)],
                    "iscrowd": int(is_crowd),
                }
            )
    coco = {
        "info": {"description": f"condinit-det test data in the COCO 2017 layout ({split})", "year": 2017},
        "licenses": [{"id": 1, "name": "test data", "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": coco_thing_categories(),
    }
    ann_dir = root / "coco" / "annotations"
    ann_dir.mkdir(parents=True, exist_ok=True)
    with open(ann_dir / f"instances_{SPLITS[split]}.json", "w") as f:
        json.dump(coco, f)
    return len(annotations), crowd


def write_coco_layout(
    root, *, num_train: int = 3, num_val: int = 2, num_empty: int = 1, size: int = 96, width: int = 128
) -> Path:
    """Write ``<root>/coco/...`` (module docstring) and return ``root``, the folder for DETECTRON2_DATASETS.

    Images are ``size`` x ``width`` px. The last ``num_empty`` images of each split have no annotations;
    the others hold 1-5 shapes, and every second one (the first of each split included) stores its last
    shape as a crowd region when it has others. Requires an empty or missing ``root/coco``.
    """
    root = Path(root)
    if (root / "coco").exists():
        raise FileExistsError(f"{root / 'coco'} exists; write the dataset into an empty folder")
    if not 0 <= num_empty < min(num_train, num_val):
        raise ValueError(f"num_empty must leave annotated images in both splits, got {num_empty}")
    for split, n in (("train", num_train), ("val", num_val)):
        _write_split(root, split, n, num_empty, size, width)
    return root


def write_image_folder(
    root, *, num_classes: int = 2, train_per_class: int = 2, val_per_class: int = 1, size: int = 32
) -> Path:
    """``<root>/{train,val}/<class>/<index>.png`` with the first ``num_classes`` shapes-cls classes."""
    root = Path(root)
    spec = ShapesClsSpec(
        image_size=size,
        min_size=size * 0.45,
        max_size=size * 0.7,
        center_jitter=size * 0.1,
        distractor_size=(size * 0.12, size * 0.2),
    )
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        counts = [0] * num_classes
        idx = 0
        while min(counts) < per_class:
            img, label = render_classification_image(_SEED, split, idx, spec)
            if label < num_classes and counts[label] < per_class:
                folder = root / split / CLS_CLASSES[label]
                folder.mkdir(parents=True, exist_ok=True)
                ok, buf = cv2.imencode(".png", img)
                assert ok
                (folder / f"{idx:06d}.png").write_bytes(buf.tobytes())
                counts[label] += 1
            idx += 1
    return root


def small_digits_cls(root, per_class: Dict[str, int]) -> Path:
    """``<root>/{train,val}/<class>/<image>``: the first ``per_class[split]`` images of each class of the embedded
    digits-cls (generated under ``<root>/full``)."""
    import shutil

    from condinit_det.data import generate_digits_cls_dataset

    root = Path(root)
    full = generate_digits_cls_dataset(root / "full")
    small = root / "small"
    for split, count in per_class.items():
        for folder in sorted((full / split).iterdir()):
            (small / split / folder.name).mkdir(parents=True)
            for image in sorted(folder.iterdir())[:count]:
                shutil.copy(image, small / split / folder.name / image.name)
    return small
