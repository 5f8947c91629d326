"""Per-image evaluation data of a run, as the report resamples it.

Each evaluation record names its per-image file (``"per_image"``, :mod:`condinit_det.records.per_image`), whose form
the stage's descriptor gives (``per_image``): ``"coco"``, the COCO matches of box and mask (detection), or
``"labels"``, each image's top-1 / top-5 correctness (classification). :class:`RunImages` answers whether an
evaluation has per-image data (and why not), which images it was evaluated on (a digest), and a metric on resamples
of those images. No detectron2 import.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from condinit_det.records.per_image import read_classification_eval
from condinit_det.stage import Metric

from .discovery import Run

__all__ = ["NoImageData", "RunImages", "paired_images"]


class NoImageData(Exception):
    """Raised with the reason an evaluation has no usable per-image data."""


def _bootstrap_module():
    try:
        from condinit_det.evaluation import bootstrap
    except ImportError as e:  # pycocotools / faster-coco-eval missing
        raise NoImageData(f"the image bootstrap is unavailable ({e})") from None
    return bootstrap


class RunImages:
    """Per-image data of one run's evaluations (x = iteration or epoch), loaded on demand."""

    def __init__(self, run: Run):
        self.run = run
        self.stage = run.stage
        self.coco = self.stage is not None and self.stage.per_image == "coco"
        self._final = None  # (data, digest) or the NoImageData of the final evaluation, once loaded
        # only files the records name: a fresh run into an old directory may leave older files there
        named = {int(r[self.stage.unit]): os.path.join(run.path, r["per_image"]) for r in run.evaluations()
                 if r.get("per_image")}
        self._files = {x: p for x, p in named.items() if os.path.isfile(p)}

    @property
    def evaluated(self) -> List[int]:
        """The x of every evaluation with its own per-image file."""
        return sorted(self._files)

    def has_every_evaluation(self) -> bool:
        """Whether every evaluation of the run has a per-image file."""
        return all(int(r[self.stage.unit]) in self._files for r in self.run.evaluations())

    # ------------------------------------------------------------------ loading
    def _load(self, x: int):
        """COCO matches: iou type -> CocoMatches; labels: metric key -> correctness [N] bool; plus the digest."""
        if x not in self._files:
            raise NoImageData(f"{self.run.name} kept no per-image data of its {self.stage.unit} {x}")
        path = self._files[x]
        if self.coco:
            try:
                matches = _bootstrap_module().load_matches(path)
            except ValueError as e:
                raise NoImageData(str(e)) from None
            return matches, next((m.images_sha1 for m in matches.values()), "")
        try:
            ev = read_classification_eval(path)
        except ValueError as e:
            raise NoImageData(str(e)) from None
        return {"top1": ev.top1, "top5": ev.top5}, ev.labels_sha1

    def load(self, x: int):
        """(data, images digest) of the evaluation at x; the final one is cached. Raises :class:`NoImageData`."""
        if x != self.run.final_x:
            return self._load(x)
        if self._final is None:
            try:
                self._final = self._load(x)
            except NoImageData as e:
                self._final = e
        if isinstance(self._final, NoImageData):
            raise self._final
        return self._final

    def digest(self, x: int) -> str:
        return self.load(x)[1]

    def num_images(self, x: int) -> int:
        data = self.load(x)[0]
        first = next(iter(data.values()))
        return first.num_images if self.coco else int(first.size)

    # ------------------------------------------------------------------ metrics
    def resampled(self, x: int, metric: Metric, draws: np.ndarray) -> np.ndarray:
        """The metric (percent) of the evaluation at x on each resample of the images: draws [B, n] -> [B]."""
        data = self.load(x)[0]
        if self.coco:
            if metric.section not in data:
                raise NoImageData(f"{self.run.name} has no per-image {metric.section} data at {self.stage.unit} {x}")
            return _bootstrap_module().resampled_ap(data[metric.section], draws)[metric.name]
        if metric.key not in data:
            raise NoImageData(f"{self.run.name} has no per-image {metric.header} at {self.stage.unit} {x}")
        from condinit_det.evaluation.bootstrap import resampled_mean

        return resampled_mean(100.0 * data[metric.key], draws)


def paired_images(runs: Dict[int, RunImages], refs: Dict[int, RunImages], seeds) -> Optional[str]:
    """None when every seed's run and reference run have final per-image data on the same images, else why not."""
    digests = set()
    for s in seeds:
        for images in (runs[s], refs[s]):
            try:
                digests.add(images.digest(images.run.final_x))
            except NoImageData as e:
                return str(e)
    if len(digests) > 1:
        return "the runs were evaluated on different images"
    return None
