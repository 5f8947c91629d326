"""Per-image evaluation data of a run, as the report resamples it.

Where a run keeps it (newest first):

- detection: each "ap" record's ``"per_image"`` file (COCO matches of box and mask,
  :mod:`condinit_det.records.per_image`); runs written before per-evaluation files existed: the final
  record's ``"predictions"`` with ``"ground_truth"`` (matched here, final evaluation only);
- classification: each "cls" record's ``"per_image"`` file, or without that field the
  ``per_image/cls_epoch<k>.npz`` of each recorded epoch; older runs: ``eval_predictions.json`` (final
  epoch only).

:class:`RunImages` answers whether an evaluation has per-image data (and why not), which images it was
evaluated on (a digest), and a metric on resamples of those images. No detectron2 import.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np

from condinit_det.records.per_image import find_classification_evals, labels_digest, read_classification_eval

from .discovery import Run
from .stages import DETECTION, Metric

__all__ = ["EVAL_PREDICTIONS_FILENAME", "NoImageData", "RunImages", "paired_images"]

EVAL_PREDICTIONS_FILENAME = "eval_predictions.json"


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
        self._final = None  # (data, digest) or the NoImageData of the final evaluation, once loaded
        evaluated = {int(r[self.stage.x]) for r in run.evaluations()} if self.stage is not None else set()
        named = {int(r[self.stage.x]): os.path.join(run.path, r["per_image"]) for r in run.evaluations()
                 if r.get("per_image")}
        if self.stage is DETECTION or named:
            # only files the records name: a fresh run into an old directory may leave older files there
            self._files = {x: p for x, p in named.items() if os.path.isfile(p)}
        else:
            self._files = {x: p for x, p in find_classification_evals(run.path).items() if x in evaluated}

    @property
    def evaluated(self) -> List[int]:
        """The x of every evaluation with its own per-image file."""
        return sorted(self._files)

    def has_every_evaluation(self) -> bool:
        """Whether every evaluation of the run has a per-image file."""
        return all(int(r[self.stage.x]) in self._files for r in self.run.evaluations())

    # ------------------------------------------------------------------ loading
    def _load(self, x: int):
        """Detection: iou type -> CocoMatches; classification: metric key -> correctness [N] bool; plus digest."""
        if x in self._files:
            path = self._files[x]
            if self.stage is DETECTION:
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
        if x != self.run.final_x:
            raise NoImageData(f"{self.run.name} kept no per-image data of its {self.stage.x} {x} "
                              "(runs written before per-evaluation files keep the final evaluation's only)")
        return self._load_legacy_final()

    def _load_legacy_final(self):
        run = self.run
        if self.stage is DETECTION:
            rec = run.final
            if not (rec.get("predictions") and rec.get("ground_truth")):
                raise NoImageData(f"{run.name} has no per-image files and its final 'ap' record names no "
                                  "'predictions' and 'ground_truth'")
            bootstrap = _bootstrap_module()
            try:
                gt = bootstrap.load_json(os.path.join(run.path, rec["ground_truth"]))
                preds = bootstrap.load_json(os.path.join(run.path, rec["predictions"]))
            except (OSError, ValueError) as e:
                raise NoImageData(f"cannot read the predictions or ground truth of {run.name} ({e})") from None
            try:
                matches = bootstrap.match_predictions(gt, preds)
            except (KeyError, ValueError, TypeError) as e:
                raise NoImageData(f"cannot match the predictions of {run.name} ({e})") from None
            return matches, bootstrap.image_ids_digest(gt)
        path = os.path.join(run.path, EVAL_PREDICTIONS_FILENAME)
        if not os.path.isfile(path):
            raise NoImageData(f"{run.name} kept no per-image data (no per_image/ files, no "
                              f"{EVAL_PREDICTIONS_FILENAME})")
        try:
            with open(path) as f:
                payload = json.load(f)
            labels = np.asarray(payload["labels"])
            if payload.get("epoch") is not None and int(payload["epoch"]) != run.final_x:
                raise NoImageData(f"{path} is from epoch {payload['epoch']}, not the final epoch {run.final_x}")
            correct = {"top1": np.asarray(payload["top1"]) == labels}
            if payload.get("top5_hit") is not None:
                correct["top5"] = np.asarray(payload["top5_hit"]) != 0
        except (OSError, ValueError, KeyError) as e:
            raise NoImageData(f"cannot read {path} ({e})") from None
        return correct, labels_digest(labels)

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
        return first.num_images if self.stage is DETECTION else int(first.size)

    # ------------------------------------------------------------------ metrics
    def resampled(self, x: int, metric: Metric, draws: np.ndarray) -> np.ndarray:
        """The metric (percent) of the evaluation at x on each resample of the images: draws [B, n] -> [B]."""
        data = self.load(x)[0]
        if self.stage is DETECTION:
            if metric.section not in data:
                raise NoImageData(f"{self.run.name} has no per-image {metric.section} data at {self.stage.x} {x}")
            return _bootstrap_module().resampled_ap(data[metric.section], draws)[metric.name]
        if metric.key not in data:
            raise NoImageData(f"{self.run.name} has no per-image {metric.header} at {self.stage.x} {x}")
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
