"""How every embedded dataset is stored: a folder per version (:func:`cache_root`) holding PNG images in the
ImageFolder or COCO layout and ``manifest.json`` (the generator's parameters), built in a temporary sibling folder and
renamed into place, so readers never see half a dataset (docs/configs.md#embedded-datasets).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import cv2
import numpy as np
import psutil
import pycocotools.mask as mask_util

__all__ = [
    "Instance",
    "cache_root",
    "check_counts",
    "expected_manifest",
    "generate_atomically",
    "read_manifest",
    "write_coco",
    "write_image_folder",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]
DEFAULT_SEED = 2026  # of every embedded dataset
MANIFEST = "manifest.json"
# The manifest entries that say how a dataset was made; the other entries describe what was made.
_GENERATOR_KEYS = ("version", "seed", "num_images", "spec", "classes")


def cache_root(version: str) -> Path:
    """``$CONDINIT_DATA/<version>`` if the variable is set (and not empty), else ``~/.cache/condinit_det/<version>``."""
    base = os.environ.get("CONDINIT_DATA")
    return Path(base or "~/.cache/condinit_det").expanduser() / version


def write_png(path: Path, img: np.ndarray) -> None:
    """Write an HxW or HxWx3 (BGR) uint8 image as PNG; fast compression, and the same bytes for the same pixels."""
    Path(path).write_bytes(cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes())


def read_manifest(root: Path) -> Optional[dict]:
    """The root's manifest, or None when it has none (or an unreadable one)."""
    try:
        with open(Path(root) / MANIFEST) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def expected_manifest(version: str, seed: int, num_images: Dict[str, int], spec, classes: Sequence[str]) -> dict:
    """The generator's entries of a manifest (``spec``: its dataclass of knobs) as the file holds them."""
    entries = {
        "version": version,
        "seed": int(seed),
        "num_images": {k: int(v) for k, v in num_images.items()},
        "spec": dataclasses.asdict(spec),
        "classes": list(classes),
    }
    return json.loads(json.dumps(entries))


def check_counts(minimum: int, **counts) -> None:
    """Raise a ValueError naming the first count (e.g. ``num_val=0``) that is not an int >= ``minimum``."""
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {n!r}")


def generate_atomically(root: Optional[PathLike], expected: dict, write: Callable[[Path], dict]) -> Path:
    """Make sure ``root`` holds the dataset that ``expected`` (:func:`expected_manifest`) describes; return the root.

    Args:
        root: the dataset's folder; None for its cache folder, where a dataset made with other parameters (or a folder
            without a manifest) is replaced; elsewhere such a root raises a ValueError saying what was found.
        write: fills a temporary folder with the dataset and returns the manifest's other entries.
    """
    replace_stale = root is None
    root = cache_root(expected["version"]) if root is None else Path(root).expanduser()

    def complete() -> bool:
        found = read_manifest(root)
        if found is not None and all(found.get(k) == expected[k] for k in _GENERATOR_KEYS):
            return True
        if root.exists() and not replace_stale:
            if found is not None:
                raise ValueError(
                    f"{root} holds a dataset generated with other parameters "
                    f"(seed={found.get('seed')}, num_images={found.get('num_images')}); expected seed="
                    f"{expected['seed']}, num_images={expected['num_images']}. Delete it or pass another root."
                )
            if any(root.iterdir()):
                raise ValueError(
                    f"{root} is not a complete {expected['version']} dataset (it holds files but no "
                    f"{MANIFEST}); delete it or pass another root"
                )
        return False

    if complete():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{root.name}.tmp-{socket.gethostname()}-"  # then the generating process's pid
    for path in root.parent.glob(prefix + "*"):  # left by a generator on this host whose process is gone (killed)
        pid = path.name[len(prefix) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root.parent))
    try:
        extra = write(tmp)
        with open(tmp / MANIFEST, "w") as f:
            json.dump(dict(expected, **extra), f, indent=1)
        if complete():  # another process finished first
            return root
        stale = None
        if root.exists():  # a stale or incomplete cache, or an empty folder: move it aside, delete it after
            stale = Path(tempfile.mkdtemp(prefix=f".{root.name}.stale-", dir=root.parent))
            os.rename(root, stale / root.name)
        try:
            os.rename(tmp, root)
        except OSError:
            if not complete():  # another process renamed its copy first: keep it if it is valid
                raise
        else:
            logger.info("Generated the %s dataset at %s", expected["version"], root)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


class Instance(NamedTuple):
    """One annotated object of a detection scene."""

    category_id: int  # 1-based index into the dataset's classes
    mask: np.ndarray  # HxW bool, its visible pixels
    fields: dict = {}  # extra annotation fields, e.g. digits-det's ``digit_index``


def write_image_folder(root: Path, expected: dict, image: Callable[[str, int], Tuple[str, int, np.ndarray]]) -> None:
    """Write every split of ``expected`` (:func:`expected_manifest`) as ``<root>/<split>/<class>/<stem>.png``, a
    folder for every class; ``image(split, index)`` gives ``(file stem, index into the classes, image)``."""
    classes = expected["classes"]
    for split, num in expected["num_images"].items():
        for name in classes:
            (root / split / name).mkdir(parents=True)
        for index in range(num):
            stem, label, img = image(split, index)
            write_png(root / split / classes[label] / f"{stem}.png", img)


def write_coco(
    root: Path,
    expected: dict,
    scene: Callable[[str, int], Tuple[np.ndarray, Sequence[Instance]]],
    *,
    supercategory: str,
) -> Dict[str, int]:
    """Write every split of ``expected`` (:func:`expected_manifest`) as ``<root>/<split>/000000.png``, ... and
    ``<root>/annotations/instances_<split>.json``; returns the instances per split. ``scene(split, index)`` gives
    ``(HxWx3 image, its instances)``; a box is tight around its mask, the segmentation the mask as COCO RLE."""
    version = expected["version"]
    categories = [{"id": i + 1, "name": n, "supercategory": supercategory} for i, n in enumerate(expected["classes"])]
    (root / "annotations").mkdir()
    counts = {}
    for split, num in expected["num_images"].items():
        (root / split).mkdir()
        images: List[dict] = []
        annotations: List[dict] = []
        for idx in range(num):
            img, instances = scene(split, idx)
            file_name = f"{split}/{idx:06d}.png"
            write_png(root / file_name, img)
            images.append({"id": idx + 1, "file_name": file_name, "height": img.shape[0], "width": img.shape[1]})
            for category_id, mask, fields in instances:
                ys, xs = np.nonzero(mask)
                x0, y0 = int(xs.min()), int(ys.min())
                w, h = int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0
                rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
                segmentation = {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": idx + 1,
                        "category_id": int(category_id),
                        "bbox": [float(x0), float(y0), float(w), float(h)],
                        "area": float(mask.sum()),
                        "iscrowd": 0,
                        "segmentation": segmentation,
                        **fields,
                    }
                )
        coco = {
            "info": {"description": f"condinit-det embedded {version} {split}", "version": version},
            "licenses": [],
            "images": images,
            "annotations": annotations,
            "categories": categories,
        }
        with open(root / "annotations" / f"instances_{split}.json", "w") as f:
            json.dump(coco, f)
        counts[split] = len(annotations)
    return counts
