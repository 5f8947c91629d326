"""The embedded "shapes" dataset: generation into a cache directory and detectron2 registration.

Layout of a dataset root (COCO format)::

    <root>/manifest.json                    generator parameters and counts (written last)
    <root>/annotations/instances_{train,val}.json
    <root>/{train,val}/000000.png ...

The root is built in a temporary sibling directory and renamed into place
(:mod:`condinit_det.data.cache`), so an interrupted run never leaves a partial dataset behind,
and concurrent first uses are safe.
"""
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import cv2
import numpy as np
import pycocotools.mask as mask_util

from .cache import generate_atomically, read_manifest
from .shapes import SHAPE_CLASSES, ShapesSpec, render_image

__all__ = [
    "DATASET_NAMES",
    "DATASET_VERSION",
    "default_root",
    "generate_shapes_dataset",
    "register_embedded_datasets",
    "get_embedded_dataset_dicts",
    "embedded_dataset_info",
]

logger = logging.getLogger(__name__)

DATASET_VERSION = "shapes-v1"
DATASET_NAMES = ("condinit_shapes_train", "condinit_shapes_val")
DEFAULT_SEED = 2026
DEFAULT_NUM_IMAGES = {"train": 512, "val": 64}
DEFAULT_SPEC = ShapesSpec()  # frozen, so one shared instance is a safe default

PathLike = Union[str, os.PathLike]


def default_root() -> Path:
    """``$CONDINIT_DATA/shapes-v1`` if the variable is set, else ``~/.cache/condinit_det/shapes-v1``."""
    base = os.environ.get("CONDINIT_DATA")
    if base:
        return Path(base).expanduser() / DATASET_VERSION
    return Path("~/.cache/condinit_det").expanduser() / DATASET_VERSION


def _expected_manifest(seed: int, num_images: Dict[str, int], spec: ShapesSpec) -> dict:
    return {
        "version": DATASET_VERSION,
        "seed": int(seed),
        "num_images": {k: int(v) for k, v in num_images.items()},
        "spec": dataclasses.asdict(spec),
        "classes": list(SHAPE_CLASSES),
    }


def _write_split(tmp: Path, split: str, num: int, seed: int, spec: ShapesSpec) -> int:
    """Render ``num`` images of ``split`` into ``tmp``; returns the number of instances."""
    (tmp / split).mkdir(parents=True)
    images, annotations = [], []
    for idx in range(num):
        img, instances = render_image(seed, split, idx, spec)
        file_name = f"{split}/{idx:06d}.png"
        ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        if not ok:
            raise RuntimeError(f"OpenCV failed to encode {file_name}")
        (tmp / file_name).write_bytes(buf.tobytes())
        images.append({"id": idx + 1, "file_name": file_name, "height": img.shape[0], "width": img.shape[1]})
        for inst in instances:
            ys, xs = np.nonzero(inst.mask)
            x0, y0 = int(xs.min()), int(ys.min())
            w, h = int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0
            rle = mask_util.encode(np.asfortranarray(inst.mask.astype(np.uint8)))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": idx + 1,
                    "category_id": inst.category_id,
                    "bbox": [float(x0), float(y0), float(w), float(h)],
                    "area": float(inst.mask.sum()),
                    "iscrowd": 0,
                    "segmentation": {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")},
                }
            )
    coco = {
        "info": {"description": f"condinit-det embedded {DATASET_VERSION} {split}", "version": DATASET_VERSION},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(SHAPE_CLASSES)],
    }
    (tmp / "annotations").mkdir(exist_ok=True)
    with open(tmp / "annotations" / f"instances_{split}.json", "w") as f:
        json.dump(coco, f)
    return len(annotations)


def generate_shapes_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    num_train: int = DEFAULT_NUM_IMAGES["train"],
    num_val: int = DEFAULT_NUM_IMAGES["val"],
    spec: ShapesSpec = DEFAULT_SPEC,
    replace_stale: Optional[bool] = None,
) -> Path:
    """Make sure a complete dataset exists at ``root`` (default: :func:`default_root`); return the root.

    Generates it if missing (atomically, :mod:`condinit_det.data.cache`). A dataset made with
    different parameters (e.g. by an older version of the generator) is regenerated in its place
    if ``replace_stale`` (default: True for the default root, which is a cache, else False);
    otherwise a ValueError is raised, as it is for a directory that is not a dataset.
    """
    if replace_stale is None:
        replace_stale = root is None
    root = Path(root).expanduser() if root is not None else default_root()
    for name, n in (("num_train", num_train), ("num_val", num_val)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")

    def write(tmp: Path) -> dict:
        counts = {
            split: _write_split(tmp, split, n, seed, spec) for split, n in (("train", num_train), ("val", num_val))
        }
        return {"num_instances": counts, "image_size": spec.image_size}

    expected = _expected_manifest(seed, {"train": num_train, "val": num_val}, spec)
    return generate_atomically(root, expected, write, replace_stale=replace_stale)


def _existing_or_generated(root: Optional[PathLike]) -> Path:
    """The default cache (regenerated if stale), or a complete dataset at ``root`` whatever its
    parameters, else a default one generated there."""
    if root is None:
        return generate_shapes_dataset(None)
    root = Path(root).expanduser()
    if read_manifest(root) is not None:
        return root
    return generate_shapes_dataset(root)


def register_embedded_datasets(root: Optional[PathLike] = None) -> Tuple[str, str]:
    """Generate (if needed) and register the embedded dataset with detectron2.

    ``root`` (default: :func:`default_root`) may hold a dataset made by
    :func:`generate_shapes_dataset` with any parameters; if it holds none, the
    default one is generated there. Returns ``("condinit_shapes_train",
    "condinit_shapes_val")``. Idempotent; calling it again with a different root
    re-points both names at that root.
    """
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    root = _existing_or_generated(root)
    for name, split in zip(DATASET_NAMES, ("train", "val")):
        json_file = str(root / "annotations" / f"instances_{split}.json")
        if name in DatasetCatalog.list():
            if MetadataCatalog.get(name).get("json_file") == json_file:
                continue
            logger.info("Re-registering %s at %s", name, root)
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        # thing_classes is set eagerly so configs and evaluators can read it before the json is loaded.
        register_coco_instances(name, {"thing_classes": list(SHAPE_CLASSES)}, json_file, str(root))
    return DATASET_NAMES


def get_embedded_dataset_dicts(names, *, filter_empty: bool = True, root: Optional[PathLike] = None):
    """``detectron2.data.get_detection_dataset_dicts`` that first registers the embedded dataset.

    A LazyCall-able dataset builder: a config that references it works even when
    it was reloaded from YAML and its registration side effect did not run.
    """
    from detectron2.data import get_detection_dataset_dicts

    register_embedded_datasets(root)
    return get_detection_dataset_dicts(names, filter_empty=filter_empty)


def embedded_dataset_info(root: Optional[PathLike] = None) -> dict:
    """Metadata of the embedded dataset at ``root`` (the default one is generated if none is there).

    Returns a dict with keys ``root``, ``version``, ``names`` (train, val),
    ``classes``, ``num_classes``, ``image_size``, ``num_images`` and
    ``num_instances`` (both ``{"train": int, "val": int}``).
    """
    root = _existing_or_generated(root)
    manifest = read_manifest(root)
    return {
        "root": str(root),
        "version": manifest["version"],
        "names": DATASET_NAMES,
        "classes": tuple(manifest["classes"]),
        "num_classes": len(manifest["classes"]),
        "image_size": manifest["image_size"],
        "num_images": dict(manifest["num_images"]),
        "num_instances": dict(manifest["num_instances"]),
    }
