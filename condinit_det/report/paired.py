"""Paired statistics of every arm against the default arm.

Runs with the same training seed share data order and every non-attention weight, so each arm is
compared with the default arm through per-seed differences over the seeds both ran. Two or more
paired seeds: a 95% Student t-interval of the mean difference. Exactly one: a paired bootstrap
over evaluation images (COCO AP of each resample accumulated from one per-image matching per model
and task, or per-image classification correctness). The convergence speed-ups are already relative
to the same seed's default run, so their per-seed values are the paired quantity.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from condinit_det.report.statistics import Interval, mean_std, percentile_interval, t_interval, verdict

from .curves import first_reach, speedup
from .discovery import Run
from .stages import DETECTION, Metric, Stage

__all__ = ["EVAL_PREDICTIONS_FILENAME", "PairedStat", "paired_statistics"]

EVAL_PREDICTIONS_FILENAME = "eval_predictions.json"
REFERENCE = "reference"


@dataclass
class PairedStat:
    """One arm x one metric: spread over seeds and the paired comparison with the default arm."""

    arm: str
    metric: str  # display name
    key: str
    lr_scale: float
    values: Dict[Optional[int], float]  # seed -> value
    mean: float
    std: float
    n: int
    paired_seeds: List[int] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)  # "seed 2 (no default run)"
    differences: List[float] = field(default_factory=list)
    interval: Optional[Interval] = None
    method: str = ""
    verdict: str = ""
    higher_is_better: bool = True

    @property
    def mean_difference(self) -> float:
        return float(np.mean(self.differences)) if self.differences else float("nan")


class _NoBootstrap(Exception):
    pass


def _by_seed(runs: List[Run]) -> Dict[int, Run]:
    return {r.seed: r for r in runs if r.seed is not None}


def _speedup_of(run: Run, ref: Run, metric: Optional[Metric]) -> Optional[float]:
    """Speed-up of ``run`` to ``ref``'s final value (a headline metric, or the loss when None)."""
    if metric is None:
        its, _, sm = run.loss()
        ref_its, _, ref_sm = ref.loss()
        if not len(its) or not len(ref_its):
            return None
        return speedup(first_reach(its, sm, float(ref_sm[-1]), lower_is_better=True), int(ref_its[-1]))
    x, y = run.curve(metric)
    return speedup(first_reach(x, y, metric.value(ref.final)), ref.final_x)


def _read_json(path: str):
    import json

    with open(path) as f:
        return json.load(f)


def _detection_bootstrap(run: Run, ref: Run, metrics: List[Metric], num: int, seed: int):
    recs = (run.final, ref.final)
    if not all(r.get("predictions") and r.get("ground_truth") for r in recs):
        raise _NoBootstrap("the final 'ap' records do not name their 'predictions' and 'ground_truth'")
    try:
        from condinit_det.evaluation.bootstrap import load_json, paired_coco_bootstrap
    except ImportError as e:
        raise _NoBootstrap(f"bootstrap unavailable ({e})") from None
    gts = [os.path.join(r.path, rec["ground_truth"]) for r, rec in ((run, recs[0]), (ref, recs[1]))]
    try:
        gt = load_json(gts[1])
        if os.path.realpath(gts[0]) != os.path.realpath(gts[1]):
            other = load_json(gts[0])
            if sorted(i["id"] for i in other["images"]) != sorted(i["id"] for i in gt["images"]):
                raise _NoBootstrap("the two runs were evaluated on different images")
        preds = [load_json(os.path.join(r.path, rec["predictions"])) for r, rec in ((run, recs[0]), (ref, recs[1]))]
    except (OSError, ValueError, KeyError) as e:
        raise _NoBootstrap(f"cannot read the predictions or ground truth ({e})") from None
    diffs = paired_coco_bootstrap(gt, preds[0], preds[1], np.random.default_rng(seed), num,
                                  iou_types=[m.section for m in metrics])
    return {m.key: diffs[m.section][m.name] for m in metrics}, f"{len(gt['images'])} evaluation images"


def _classification_bootstrap(run: Run, ref: Run, metrics: List[Metric], num: int, seed: int):
    try:
        from condinit_det.evaluation.bootstrap import classification_correctness, paired_accuracy_bootstrap
    except ImportError as e:
        raise _NoBootstrap(f"bootstrap unavailable ({e})") from None
    correct = []
    for r in (run, ref):
        path = os.path.join(r.path, EVAL_PREDICTIONS_FILENAME)
        if not os.path.isfile(path):
            raise _NoBootstrap(f"no {EVAL_PREDICTIONS_FILENAME} in {r.path}")
        try:
            payload = _read_json(path)
        except (OSError, ValueError) as e:
            raise _NoBootstrap(f"cannot read {path} ({e})") from None
        if payload.get("epoch") is not None and int(payload["epoch"]) != r.final_x:
            raise _NoBootstrap(f"{path} is from epoch {payload['epoch']}, not the final epoch {r.final_x}")
        correct.append((list(payload["labels"]), classification_correctness(payload)))
    if correct[0][0] != correct[1][0]:
        raise _NoBootstrap("the two runs were evaluated on different images (labels differ)")
    rng = np.random.default_rng(seed)
    out = {}
    for m in metrics:
        if m.key not in correct[0][1] or m.key not in correct[1][1]:
            raise _NoBootstrap(f"{EVAL_PREDICTIONS_FILENAME} has no per-image {m.header}")
        out[m.key] = paired_accuracy_bootstrap(correct[0][1][m.key], correct[1][1][m.key], rng, num)
    return out, f"{len(correct[0][0])} evaluation images"


def _bootstrap(stage: Stage, run: Run, ref: Run, metrics: List[Metric], num: int, seed: int):
    if stage is DETECTION:
        return _detection_bootstrap(run, ref, metrics, num, seed)
    return _classification_bootstrap(run, ref, metrics, num, seed)


def _pair(arm_runs: Dict[int, Run], ref_runs: Dict[int, Run], ref_name: str, arm: str,
          why: Dict[Tuple[str, int], str]) -> Tuple[List[int], List[str]]:
    """Seeds with both runs, and the dropped ones named with what became of the missing run (``why``:
    (arm, seed) -> e.g. "diverged at iteration 40")."""
    paired = sorted(set(arm_runs) & set(ref_runs))
    dropped = [f"seed {s} ({arm} run {why[(arm, s)]})" if (arm, s) in why else f"seed {s} (no {arm} run)"
               for s in sorted(set(ref_runs) - set(arm_runs))]
    dropped += [f"seed {s} ({ref_name} run {why[(ref_name, s)]})" if (ref_name, s) in why else
                f"seed {s} (no {ref_name} run)" for s in sorted(set(arm_runs) - set(ref_runs))]
    return paired, dropped


def paired_statistics(stage_report, *, bootstrap: int = 1000, seed: int = 0) -> List[PairedStat]:
    """Rows of the paired-statistics table of one stage's main comparison (see module doc)."""
    stage: Stage = stage_report.stage
    groups = stage_report.arms
    default = next((g for g in groups if g.arm == "default"), None)
    why = {(m.arm, m.seed): m.reason for m in stage_report.failed if m.lr_scale == stage_report.scale}
    rows: List[PairedStat] = []
    for g in groups:
        runs = _by_seed(g.runs)
        ref_runs = _by_seed(default.runs) if default is not None else {}
        paired, dropped = _pair(runs, ref_runs, "default", g.arm, why) if default is not None else ([], [])
        metrics = [m for m in stage.headline if math.isfinite(g.value(m.header))]
        boot, boot_method, boot_error = None, "", ""
        if g is not default and default is not None and len(paired) == 1 and bootstrap > 0:
            try:
                boot, unit = _bootstrap(stage, runs[paired[0]], ref_runs[paired[0]], metrics, bootstrap, seed)
                boot_method = f"paired bootstrap over {unit}, B={bootstrap}"
            except _NoBootstrap as e:
                boot_error = str(e)
        for m in metrics:
            finals = [m.value(r.final) for r in g.runs]
            values = {r.seed: v for r, v in zip(g.runs, finals) if r.seed is not None}
            mean, std = mean_std(finals)
            row = PairedStat(g.arm, m.header, m.key, g.lr_scale, values, mean, std, len(finals))
            if default is None:
                row.method, row.verdict = "no default arm", ""
            elif g is default:
                row.method, row.verdict = REFERENCE, REFERENCE
            else:
                row.paired_seeds, row.dropped = paired, dropped
                row.differences = [values[s] - m.value(ref_runs[s].final) for s in paired]
                _fill_interval(row, boot.get(m.key) if boot else None, boot_method,
                               boot_error or ("bootstrap off" if bootstrap <= 0 else ""))
            rows.append(row)
        if default is None or g is default:
            continue
        conv = [(m, f"{m.key}_speedup", f"speed-up {m.header} (%)") for m in metrics]
        if g.loss is not None and default.loss is not None:
            conv.append((None, "loss_speedup", "speed-up loss (%)"))
        for m, key, name in conv:
            per_seed = {s: _speedup_of(runs[s], ref_runs[s], m) for s in paired}
            defined = {s: v for s, v in per_seed.items() if v is not None}
            mean, std = mean_std(list(defined.values()))
            row = PairedStat(g.arm, name, key, g.lr_scale, defined, mean, std, len(defined),
                             paired_seeds=paired, dropped=dropped)
            not_reached = sorted(s for s, v in per_seed.items() if v is None)
            if not_reached:
                row.method = "not reached for seed " + ", ".join(map(str, not_reached))
                row.verdict = "no interval"
            else:
                row.differences = [defined[s] for s in paired]
                _fill_interval(row, None, "", "no image bootstrap for a convergence number (it needs every "
                               "evaluation's predictions; runs keep the final evaluation's only)")
            rows.append(row)
    return rows


def _fill_interval(row: PairedStat, resampled: Optional[np.ndarray], boot_method: str, why_not: str) -> None:
    n = len(row.differences)
    if n >= 2:
        row.interval = t_interval(row.differences)
        row.method = row.interval.method
    elif n == 1 and resampled is not None:
        row.interval = percentile_interval(row.differences[0], resampled, method=boot_method)
        row.method = boot_method
    elif n == 1:
        row.method = "one paired seed" + (f": {why_not}" if why_not else "")
    else:
        row.method = "no paired seeds"
    row.verdict = verdict(row.interval, row.higher_is_better)
