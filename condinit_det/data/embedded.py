"""Every embedded dataset by name (:data:`EMBEDDED_DATASETS`), and the two ways in: detectron2's catalog for the
detection ones (:func:`register_embedded_datasets`) and ``data.root="embedded:<name>"`` for the classification ones
(:func:`resolve_classification_root`). The datasets: docs/configs.md#embedded-datasets.
"""

import logging
import os
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from . import classification, digits, shapes
from .cache import PathLike, read_manifest

__all__ = [
    "DATASET_NAMES",
    "DIGITS_DATASET_NAMES",
    "EMBEDDED_DATASETS",
    "EmbeddedDataset",
    "embedded_dataset_info",
    "get_embedded_dataset_dicts",
    "register_embedded_datasets",
    "resolve_classification_root",
]

logger = logging.getLogger(__name__)

# Embedded datasets are named "embedded:<name>" where a path is expected (e.g. a pretraining data.root).
EMBEDDED_PREFIX = "embedded:"
DATASET_NAMES = ("condinit_shapes_train", "condinit_shapes_val")
DIGITS_DATASET_NAMES = ("condinit_digits_train", "condinit_digits_val")


class EmbeddedDataset(NamedTuple):
    """One embedded dataset; ``generate(root)`` makes sure it is at ``root`` (None: its cache folder) and returns it."""

    name: str
    version: str  # the name of its cache folder, and its manifest's "version"
    classes: Tuple[str, ...]
    generate: Callable[[Optional[PathLike]], Path]
    detectron2_names: Optional[Tuple[str, str]] = None  # (train, val) of a detection dataset; None: classification


EMBEDDED_DATASETS: Dict[str, EmbeddedDataset] = {
    found.name: found
    for found in (
        EmbeddedDataset(
            "shapes", shapes.DATASET_VERSION, shapes.SHAPE_CLASSES, shapes.generate_shapes_dataset, DATASET_NAMES
        ),
        EmbeddedDataset(
            "digits-det", digits.DET_VERSION, digits.CLASSES, digits.generate_digits_det_dataset, DIGITS_DATASET_NAMES
        ),
        EmbeddedDataset(
            "shapes-cls",
            classification.DATASET_VERSION,
            classification.CLASSES,
            classification.generate_classification_dataset,
        ),
        EmbeddedDataset("digits-cls", digits.CLS_VERSION, digits.CLASSES, digits.generate_digits_cls_dataset),
    )
}


def _find(dataset: str, *, detection: Optional[bool], argument: str, accepted_too: str = "") -> EmbeddedDataset:
    """The dataset named ``dataset`` (``embedded:`` prefix optional) among the detection ones (``detection=True``),
    the classification ones (False) or all (None); otherwise a ValueError naming the accepted ones."""
    name = dataset[len(EMBEDDED_PREFIX) :] if dataset.startswith(EMBEDDED_PREFIX) else dataset
    kind = {
        key: found
        for key, found in EMBEDDED_DATASETS.items()
        if detection is None or (found.detectron2_names is not None) == detection
    }
    if name not in kind:
        what = {True: "detection ", False: "classification ", None: ""}[detection]
        raise ValueError(
            f"{argument}={dataset!r} names no embedded {what}dataset; accepted: "
            f"{', '.join(EMBEDDED_PREFIX + key for key in kind)}{accepted_too}"
        )
    return kind[name]


def _existing_or_generated(found: EmbeddedDataset, root: Optional[PathLike]) -> Path:
    """The cache folder (regenerated if stale), the dataset at ``root`` whatever its parameters, or a default one
    generated at an empty ``root``; a root holding another dataset raises a ValueError."""
    if root is None:
        return found.generate(None)
    root = Path(root).expanduser()
    manifest = read_manifest(root)
    if manifest is None:
        return found.generate(root)
    if manifest.get("version") != found.version:
        raise ValueError(f"{root} holds the {manifest.get('version')} dataset, not {found.version}")
    return root


def register_embedded_datasets(root: Optional[PathLike] = None, *, dataset: str = "shapes") -> Tuple[str, str]:
    """Generate (if needed) and register an embedded detection dataset with detectron2; return its (train, val) names.

    Args:
        root: None for its cache folder, else a folder holding it (any parameters) or nothing (generated there).
        dataset: ``"shapes"`` or ``"digits-det"``, with or without the ``embedded:`` prefix.
    """
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    found = _find(dataset, detection=True, argument="dataset", accepted_too=" (the prefix 'embedded:' may be left out)")
    root = _existing_or_generated(found, root)
    for name, split in zip(found.detectron2_names, ("train", "val")):
        json_file = str(root / "annotations" / f"instances_{split}.json")
        if name in DatasetCatalog.list():
            if MetadataCatalog.get(name).get("json_file") == json_file:
                continue
            logger.info("Re-registering %s at %s", name, root)
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        # thing_classes is set eagerly so configs and evaluators can read it before the json is loaded.
        register_coco_instances(name, {"thing_classes": list(found.classes)}, json_file, str(root))
    return found.detectron2_names


def get_embedded_dataset_dicts(names, *, filter_empty: bool = True, root: Optional[PathLike] = None):
    """``detectron2.data.get_detection_dataset_dicts`` that first registers the embedded dataset(s) of ``names`` (so a
    config reloaded from YAML still finds them); ``root`` applies to the one embedded dataset the names belong to."""
    from detectron2.data import get_detection_dataset_dicts

    wanted = {names} if isinstance(names, str) else set(names)
    owners = [key for key, found in EMBEDDED_DATASETS.items() if wanted & set(found.detectron2_names or ())]
    if root is not None and len(owners) != 1:
        raise ValueError(
            f"root={root} needs the names of one embedded dataset; {sorted(wanted)} belong to "
            f"{len(owners)} ({', '.join(owners) or 'none'})"
        )
    for key in owners:
        register_embedded_datasets(root, dataset=key)
    return get_detection_dataset_dicts(names, filter_empty=filter_empty)


def embedded_dataset_info(root: Optional[PathLike] = None, *, dataset: str = "shapes") -> dict:
    """What an embedded dataset at ``root`` (None: its cache folder) holds, generated if missing: ``root``,
    ``version``, ``classes``, ``num_classes``, ``image_size``, ``num_images`` per split; for detection also ``names``
    (detectron2's) and ``num_instances``; for real data ``source`` (provenance and citation)."""
    found = _find(dataset, detection=None, argument="dataset")
    root = _existing_or_generated(found, root)
    manifest = read_manifest(root)
    info = {
        "root": str(root),
        "version": manifest["version"],
        "classes": tuple(manifest["classes"]),
        "num_classes": len(manifest["classes"]),
        "image_size": manifest["image_size"],
        "num_images": dict(manifest["num_images"]),
    }
    if found.detectron2_names is not None:
        info.update(names=found.detectron2_names, num_instances=dict(manifest["num_instances"]))
    if "source" in manifest:
        info["source"] = dict(manifest["source"])
    return info


def resolve_classification_root(root: PathLike) -> str:
    """An ImageFolder path (``~`` expanded), or the cache folder of an ``"embedded:<name>"`` classification dataset."""
    text = os.fspath(root)
    if not text.startswith(EMBEDDED_PREFIX):
        return os.path.expanduser(text)
    found = _find(text, detection=False, argument="data.root", accepted_too=" or an ImageFolder path")
    return str(found.generate(None))
