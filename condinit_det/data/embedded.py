"""The embedded detection datasets: "shapes" generated here, "digits-det" (:mod:`.digits`), both registered here.

Layout of a dataset root (COCO format)::

    <root>/manifest.json                    generator parameters and counts (written last)
    <root>/annotations/instances_{train,val}.json
    <root>/{train,val}/000000.png ...

The root is built in a temporary sibling directory and renamed into place
(:mod:`condinit_det.data.cache`), so an interrupted run never leaves a partial dataset behind,
and concurrent first uses are safe. :func:`register_embedded_datasets` registers one embedded dataset
(``dataset="shapes"`` or ``"digits-det"``) under its two detectron2 names; :func:`write_coco_split` and
:func:`register_coco_splits` are the parts both datasets share.
"""
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pycocotools.mask as mask_util

from .cache import EMBEDDED_PREFIX, cache_root, generate_atomically, read_manifest, write_png
from .shapes import SHAPE_CLASSES, ShapesSpec, render_image

__all__ = [
    "DATASET_NAMES",
    "DATASET_VERSION",
    "default_root",
    "embedded_detection_names",
    "generate_shapes_dataset",
    "register_coco_splits",
    "register_embedded_datasets",
    "get_embedded_dataset_dicts",
    "embedded_dataset_info",
    "write_coco_split",
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
    return cache_root(DATASET_VERSION)


def _expected_manifest(seed: int, num_images: Dict[str, int], spec: ShapesSpec) -> dict:
    return {
        "version": DATASET_VERSION,
        "seed": int(seed),
        "num_images": {k: int(v) for k, v in num_images.items()},
        "spec": dataclasses.asdict(spec),
        "classes": list(SHAPE_CLASSES),
    }


# An instance to write: its 1-based category id, its HxW bool mask, and extra annotation fields.
Instance = Tuple[int, np.ndarray, Dict]


def write_coco_split(root: Path, split: str, scenes: Iterable[Tuple[np.ndarray, Sequence[Instance]]], *,
                     classes: Sequence[str], version: str, supercategory: str) -> int:
    """Write the images of ``split`` (``<root>/<split>/000000.png``, ...) and their COCO json
    (``<root>/annotations/instances_<split>.json``); returns the number of instances.

    Each instance's box is tight around its mask (``x + w`` one past the last column), its area the mask's
    pixel count, its segmentation the mask as COCO RLE; category ids are 1-based indices into ``classes``.
    """
    (root / split).mkdir(parents=True)
    images: List[dict] = []
    annotations: List[dict] = []
    for idx, (img, instances) in enumerate(scenes):
        file_name = f"{split}/{idx:06d}.png"
        write_png(root / file_name, img)
        images.append({"id": idx + 1, "file_name": file_name, "height": img.shape[0], "width": img.shape[1]})
        for category_id, mask, extra in instances:
            ys, xs = np.nonzero(mask)
            x0, y0 = int(xs.min()), int(ys.min())
            w, h = int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0
            rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": idx + 1,
                    "category_id": int(category_id),
                    "bbox": [float(x0), float(y0), float(w), float(h)],
                    "area": float(mask.sum()),
                    "iscrowd": 0,
                    "segmentation": {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")},
                    **extra,
                }
            )
    coco = {
        "info": {"description": f"condinit-det embedded {version} {split}", "version": version},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": n, "supercategory": supercategory} for i, n in enumerate(classes)],
    }
    (root / "annotations").mkdir(exist_ok=True)
    with open(root / "annotations" / f"instances_{split}.json", "w") as f:
        json.dump(coco, f)
    return len(annotations)


def _write_split(tmp: Path, split: str, num: int, seed: int, spec: ShapesSpec) -> int:
    """Render ``num`` images of ``split`` into ``tmp``; returns the number of instances."""
    def scenes():
        for idx in range(num):
            img, instances = render_image(seed, split, idx, spec)
            yield img, [(inst.category_id, inst.mask, {}) for inst in instances]

    return write_coco_split(tmp, split, scenes(), classes=SHAPE_CLASSES, version=DATASET_VERSION,
                            supercategory="shape")


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


class _DetectionDataset(NamedTuple):
    names: Tuple[str, str]  # detectron2 names of the train and val splits
    classes: Tuple[str, ...]
    existing_or_generated: Callable[[Optional[PathLike]], Path]


def _detection_datasets() -> Dict[str, _DetectionDataset]:
    """Every embedded detection dataset by name (the digits module is imported here: it builds on this one)."""
    from . import digits

    return {
        "shapes": _DetectionDataset(DATASET_NAMES, SHAPE_CLASSES, _existing_or_generated),
        "digits-det": _DetectionDataset(digits.DET_DATASET_NAMES, digits.CLASSES, digits.existing_or_generated_det),
    }


def embedded_detection_names() -> Tuple[str, ...]:
    """Every ``"embedded:<name>"`` accepted as the ``dataset`` of :func:`register_embedded_datasets`."""
    return tuple(EMBEDDED_PREFIX + n for n in _detection_datasets())


def _detection_dataset(dataset: str) -> _DetectionDataset:
    key = dataset[len(EMBEDDED_PREFIX):] if dataset.startswith(EMBEDDED_PREFIX) else dataset
    known = _detection_datasets()
    if key not in known:
        raise ValueError(f"dataset={dataset!r} names no embedded detection dataset; accepted: "
                         f"{', '.join(embedded_detection_names())} (the prefix 'embedded:' may be left out)")
    return known[key]


def register_coco_splits(names: Sequence[str], root: Path, classes: Sequence[str]) -> None:
    """Register ``<root>/annotations/instances_{train,val}.json`` under ``names`` (train, val) with
    detectron2's ``register_coco_instances``; a name already registered at another root is re-pointed."""
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    for name, split in zip(names, ("train", "val")):
        json_file = str(root / "annotations" / f"instances_{split}.json")
        if name in DatasetCatalog.list():
            if MetadataCatalog.get(name).get("json_file") == json_file:
                continue
            logger.info("Re-registering %s at %s", name, root)
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        # thing_classes is set eagerly so configs and evaluators can read it before the json is loaded.
        register_coco_instances(name, {"thing_classes": list(classes)}, json_file, str(root))


def register_embedded_datasets(root: Optional[PathLike] = None, *, dataset: str = "shapes") -> Tuple[str, str]:
    """Generate (if needed) and register an embedded detection dataset with detectron2.

    dataset: ``"shapes"`` (names ``condinit_shapes_train`` / ``condinit_shapes_val``) or ``"digits-det"``
    (``condinit_digits_train`` / ``condinit_digits_val``), with or without the ``embedded:`` prefix.
    ``root`` (default: the dataset's cache folder) may hold that dataset made with any parameters; if
    it holds none, the default one is generated there. Returns the (train, val) names. Idempotent;
    calling it again with a different root re-points both names at that root.
    """
    found = _detection_dataset(dataset)
    register_coco_splits(found.names, found.existing_or_generated(root), found.classes)
    return found.names


def get_embedded_dataset_dicts(names, *, filter_empty: bool = True, root: Optional[PathLike] = None):
    """``detectron2.data.get_detection_dataset_dicts`` that first registers the embedded dataset(s) of ``names``.

    A LazyCall-able dataset builder: a config that references it works even when it was reloaded from
    YAML and its registration side effect did not run. ``root`` applies to the one embedded dataset the
    names belong to; names of no embedded dataset are left to detectron2's catalog.
    """
    from detectron2.data import get_detection_dataset_dicts

    wanted = [names] if isinstance(names, str) else list(names)
    owners = [key for key, found in _detection_datasets().items() if set(found.names) & set(wanted)]
    if root is not None and len(owners) != 1:
        raise ValueError(f"root={root} needs the names of one embedded dataset; {wanted} belong to "
                         f"{len(owners)} ({', '.join(owners) or 'none'})")
    for key in owners or ["shapes"]:
        register_embedded_datasets(root, dataset=key)
    return get_detection_dataset_dicts(names, filter_empty=filter_empty)


def embedded_dataset_info(root: Optional[PathLike] = None, *, dataset: str = "shapes") -> dict:
    """Metadata of an embedded detection dataset at ``root`` (the default one is generated if none is there).

    Returns a dict with keys ``root``, ``version``, ``names`` (train, val),
    ``classes``, ``num_classes``, ``image_size``, ``num_images`` and
    ``num_instances`` (both ``{"train": int, "val": int}``), and ``source`` for a dataset of real data.
    """
    found = _detection_dataset(dataset)
    root = found.existing_or_generated(root)
    manifest = read_manifest(root)
    info = {
        "root": str(root),
        "version": manifest["version"],
        "names": found.names,
        "classes": tuple(manifest["classes"]),
        "num_classes": len(manifest["classes"]),
        "image_size": manifest["image_size"],
        "num_images": dict(manifest["num_images"]),
        "num_instances": dict(manifest["num_instances"]),
    }
    if "source" in manifest:
        info["source"] = dict(manifest["source"])
    return info
