"""The two training stages the report compares: what they record and how they are read.

A stage names the results-record kind of its evaluations, the x axis of its curves, the columns
of its paper-layout table and its headline metrics. Detection ("ap" records, x = iteration):
box and mask AP. Classification pretraining ("cls" records, x = epoch): top-1 / top-5 accuracy.
Every other part of the report is shared by both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["CLASSIFICATION", "DETECTION", "STAGES", "Metric", "Stage", "stage_of_kind"]


@dataclass(frozen=True)
class Metric:
    """One number of an evaluation record: ``record[section][name]`` (or ``record[name]``)."""

    key: str  # short identifier used in CSV columns and file names: "bbox", "top1", ...
    header: str  # table header: "AP^b", "top-1"
    label: str  # axis label with unit: "box AP (%)"
    name: str
    section: Optional[str] = None

    def value(self, record: dict) -> float:
        src = record.get(self.section) if self.section else record
        v = (src or {}).get(self.name)
        try:
            v = float(v)
        except (TypeError, ValueError):
            return float("nan")
        return v if math.isfinite(v) else float("nan")


@dataclass(frozen=True)
class Stage:
    """What a stage records and which of its numbers the report shows."""

    name: str  # "detection" / "classification"
    title: str
    kind: str  # results-record kind of its evaluations
    x: str  # record field of the curves' x axis
    x_label: str
    table: Tuple[Metric, ...]  # paper-layout columns
    headline: Tuple[Metric, ...]  # final metrics compared by the statistics and the convergence table
    plots: Tuple[Tuple[Metric, str], ...]  # metric curves and their file names
    loss_plot: str
    kappa_plot: str


_BOX = Metric("bbox", "AP^b", "box AP (%)", "AP", "bbox")
_MASK = Metric("segm", "AP^m", "mask AP (%)", "AP", "segm")
_TOP1 = Metric("top1", "top-1", "top-1 accuracy (%)", "top1")
_TOP5 = Metric("top5", "top-5", "top-5 accuracy (%)", "top5")

DETECTION = Stage(
    name="detection",
    title="Detection: COCO box / mask AP",
    kind="ap",
    x="iteration",
    x_label="iteration",
    table=(
        _BOX,
        Metric("bbox_AP50", "AP^b_50", "box AP50 (%)", "AP50", "bbox"),
        Metric("bbox_AP75", "AP^b_75", "box AP75 (%)", "AP75", "bbox"),
        _MASK,
        Metric("segm_AP50", "AP^m_50", "mask AP50 (%)", "AP50", "segm"),
        Metric("segm_AP75", "AP^m_75", "mask AP75 (%)", "AP75", "segm"),
    ),
    headline=(_BOX, _MASK),
    plots=((_BOX, "bbox_ap.png"), (_MASK, "segm_ap.png")),
    loss_plot="loss.png",
    kappa_plot="kappa.png",
)

CLASSIFICATION = Stage(
    name="classification",
    title="Classification pretraining: top-1 / top-5 accuracy",
    kind="cls",
    x="epoch",
    x_label="epoch",
    table=(_TOP1, _TOP5),
    headline=(_TOP1,),
    plots=((_TOP1, "top1.png"), (_TOP5, "top5.png")),
    loss_plot="cls_loss.png",
    kappa_plot="cls_kappa.png",
)

# Report order: pretraining comes first in the pipeline.
STAGES = (CLASSIFICATION, DETECTION)


def stage_of_kind(kind: str) -> Optional[Stage]:
    for s in STAGES:
        if s.kind == kind:
            return s
    return None
