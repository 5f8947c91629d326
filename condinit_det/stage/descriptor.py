"""What a training stage records and how its records are read: one :class:`StageDescriptor` per stage, plain data
that the plan stores. A run's stage is looked up, never guessed (:func:`stage_of`). No torch, detectron2 or timm.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Dict, Mapping, Optional, Tuple

__all__ = ["DETECTION", "PRETRAIN", "UNITS", "Metric", "StageDescriptor", "known_stages", "register_stage", "stage_of"]

# The units a run's length can count, and how the status table abbreviates them.
UNITS = {"iteration": "it", "epoch": "ep"}


@dataclass(frozen=True)
class Metric:
    """One number of an evaluation record: ``record[section][name]`` (or ``record[name]`` without a section).

    Args:
        key: identifier in CSV columns, file names and ``--delta bbox=0.6`` (``"bbox"``); header: table header
            (``"AP^b"``); label: axis label with its unit; short: the status table's word before it (``"box"``).
    """

    key: str
    header: str
    label: str
    name: str
    section: Optional[str] = None
    short: str = ""

    def value(self, record: Mapping) -> float:
        """The metric in ``record`` as a float; NaN when absent, null or not finite."""
        source = record.get(self.section) if self.section else record
        try:
            value = float((source or {}).get(self.name))
        except (TypeError, ValueError):
            return float("nan")
        return value if math.isfinite(value) else float("nan")


@dataclass(frozen=True)
class StageDescriptor:
    """Everything the launcher, the status command and the report need to know of a stage's runs.

    Args:
        name: the stage's one name in plans, records, reports and status (``"detection"``); title: its heading.
        unit: what a run's length and its curves' x axis count, and the record field holding it (:data:`UNITS`).
        eval_kind / eval_only_kind: the record kinds of evaluations while training / of ``--eval-only``.
        table: the report's columns; headline: those the statistics compare and status shows; plots: (metric,
            file name) of the report's curves; loss_plot / kappa_plot: file names of its loss and κ plots.
        metrics_step_offset: added to a ``metrics.json`` line's ``"iteration"`` to count steps done (detectron2's: 1).
        eta_key: a ``metrics.json`` field holding the writer's own estimate of the seconds left, or None.
        final_file: a file a run writes once training ended (a run in no plan is finished with it and an evaluation).
        per_image: an evaluation's per-image file: ``"coco"`` (COCO matches), ``"labels"`` (correctness) or None.
    """

    name: str
    title: str
    unit: str
    eval_kind: str
    eval_only_kind: str
    table: Tuple[Metric, ...]
    headline: Tuple[Metric, ...]
    plots: Tuple[Tuple[Metric, str], ...] = ()
    loss_plot: str = "loss.png"
    kappa_plot: str = "kappa.png"
    metrics_step_offset: int = 0
    eta_key: Optional[str] = None
    final_file: Optional[str] = None
    per_image: Optional[str] = None

    def to_dict(self) -> dict:
        """Plain JSON data (the plan stores it); :meth:`from_dict` reads it back."""
        data = asdict(self)
        data["table"] = list(data["table"])
        data["plots"] = [{"metric": m["key"], "file": name} for m, name in data["plots"]]
        data["headline"] = [m["key"] for m in data["headline"]]
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "StageDescriptor":
        """The descriptor :meth:`to_dict` wrote; raises ValueError naming what is wrong."""
        try:
            table = tuple(Metric(**m) for m in data["table"])
            by_key = {m.key: m for m in table}
            values = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
            values["table"] = table
            values["headline"] = tuple(by_key[k] for k in data["headline"])
            values["plots"] = tuple((by_key[p["metric"]], p["file"]) for p in data.get("plots", ()))
            stage = cls(**values)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a stage description ({type(e).__name__}: {e})") from None
        if stage.unit not in UNITS or not stage.headline or stage.per_image not in (None, "coco", "labels"):
            raise ValueError(
                f"not a stage description: unit {stage.unit!r} (one of {', '.join(UNITS)}), headline "
                f"{[m.key for m in stage.headline]} (at least one metric), per_image {stage.per_image!r} (None, "
                "coco or labels)"
            )
        return stage


_BOX = Metric("bbox", "AP^b", "box AP (%)", "AP", "bbox", short="box")
_MASK = Metric("segm", "AP^m", "mask AP (%)", "AP", "segm", short="mask")
_TOP1 = Metric("top1", "top-1", "top-1 accuracy (%)", "top1", short="top-1")
_TOP5 = Metric("top5", "top-5", "top-5 accuracy (%)", "top5", short="top-5")

DETECTION = StageDescriptor(
    name="detection",
    title="Detection: COCO box / mask AP",
    unit="iteration",
    eval_kind="ap",
    eval_only_kind="eval",
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
    metrics_step_offset=1,
    eta_key="eta_seconds",
    final_file="model_final.pth",
    per_image="coco",
)

PRETRAIN = StageDescriptor(
    name="pretrain",
    title="Classification pretraining: top-1 / top-5 accuracy",
    unit="epoch",
    eval_kind="cls",
    eval_only_kind="cls_eval",
    table=(_TOP1, _TOP5),
    headline=(_TOP1,),
    plots=((_TOP1, "top1.png"), (_TOP5, "top5.png")),
    loss_plot="cls_loss.png",
    kappa_plot="cls_kappa.png",
    final_file="model_final.pth",
    per_image="labels",
)

_REGISTRY: Dict[str, StageDescriptor] = {}


def register_stage(descriptor: StageDescriptor) -> StageDescriptor:
    """Make ``descriptor`` known by its name to runs whose plan does not describe them; returns it. Another descriptor
    under a known name raises ValueError."""
    if _REGISTRY.get(descriptor.name, descriptor) != descriptor:
        raise ValueError(f"a different stage named {descriptor.name!r} is registered already")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


def known_stages() -> Tuple[StageDescriptor, ...]:
    """The registered descriptors, pretraining before detection (the order of the paper's protocol)."""
    return tuple(_REGISTRY.values())


def stage_of(name: Optional[str], described: Optional[Mapping] = None) -> Optional[StageDescriptor]:
    """The stage named ``name``: the plan's own description ``described``, else the registered stage, else None."""
    if described:
        return StageDescriptor.from_dict(described)
    return _REGISTRY.get(name) if name else None


register_stage(PRETRAIN)
register_stage(DETECTION)
