"""Per-image data of each evaluation of a run, which the report's bootstrap resamples: COCO matches
(``per_image/ap_iter<7 digits>.npz``) or top-1 / top-5 correctness (``per_image/cls_epoch<4 digits>.npz``), named by
the record's ``"per_image"``. Formats: docs/statistics.md. No detectron2, timm or torch import.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass

import numpy as np

from ..utils.fileio import atomic_write

__all__ = [
    "PER_IMAGE_DIRNAME",
    "ClassificationEval",
    "classification_eval_path",
    "detection_eval_path",
    "labels_digest",
    "read_classification_eval",
    "write_classification_eval",
]

PER_IMAGE_DIRNAME = "per_image"


def detection_eval_path(run_dir: str, iteration: int) -> str:
    return os.path.join(run_dir, PER_IMAGE_DIRNAME, f"ap_iter{int(iteration):07d}.npz")


def classification_eval_path(run_dir: str, epoch: int) -> str:
    return os.path.join(run_dir, PER_IMAGE_DIRNAME, f"cls_epoch{int(epoch):04d}.npz")


def labels_digest(labels) -> str:
    """SHA-1 (hex) of the labels as little-endian int64: equal digests = same images, same order."""
    return hashlib.sha1(np.ascontiguousarray(labels, dtype="<i8").tobytes()).hexdigest()


@dataclass(frozen=True)
class ClassificationEval:
    """One evaluated epoch: per-image correctness [N] (bool, dataset order)."""

    epoch: int
    top1: np.ndarray
    top5: np.ndarray
    labels_sha1: str


def write_classification_eval(run_dir: str, epoch: int, *, labels, top1, top5_hit) -> str:
    """Save one evaluated epoch's per-image correctness as packed bits with ``labels_sha1``; returns the path.

    Args:
        epoch: completed epochs at the evaluation (the "cls" record's ``"epoch"``).
        labels, top1: [N] true and predicted class per evaluation image, in dataset order.
        top5_hit: [N] whether the true class is among the top-5 predictions (0/1 or bool).
    """
    labels = np.asarray(labels, dtype=np.int64)
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        top1=np.packbits(np.asarray(top1) == labels),
        top5=np.packbits(np.asarray(top5_hit) != 0),
        num_images=np.int64(labels.size),
        epoch=np.int64(epoch),
        labels_sha1=np.str_(labels_digest(labels)),
    )
    path = classification_eval_path(run_dir, epoch)
    atomic_write(path, buf.getvalue())
    return path


def read_classification_eval(path: str) -> ClassificationEval:
    """Read a file written by :func:`write_classification_eval`; ValueError when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as f:
            n = int(f["num_images"])
            return ClassificationEval(
                epoch=int(f["epoch"]),
                top1=np.unpackbits(f["top1"], count=n).astype(bool),
                top5=np.unpackbits(f["top5"], count=n).astype(bool),
                labels_sha1=str(f["labels_sha1"]),
            )
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path} is not a per-image classification file ({e})") from None
