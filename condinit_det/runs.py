"""Experiments as sets of runs: the arm x seed x learning-rate layout, the plan file and run identity.

Both training stages (``tools/pretrain_net.py``, ``tools/train_net.py``) lay their runs out the
same way and the report reads them back. No detectron2 or timm import.

Layout of an experiment directory ``<base>``::

    <base>/experiment.json                 the plan: arms, seeds, lr scales, every run's directory
    <base>/<arm>/seed<k>/                  one run (seed k, the config's learning rate)
    <base>/<arm>/seed<k>-lr<s>/            one run of a learning-rate scan (s x the config's lr)
    <base>/report/                         the comparison

A run directory holds ``results.json`` and ``condinit_arm_report.json``; the latter records the
run's *identity* (arm, seeds, include/exclude patterns, arm options, lr scale), against which a
``--resume`` is checked: a run directory never changes arm, seed or patterns silently.

Failures are results (:func:`execute_runs`): a run that raises gets a ``"failed"`` record in its
``results.json`` (``"diverged"`` or ``"error"``, the iteration, the exception in one line) and the
experiment goes on with the next run. ``--resume`` continues a run that failed with an error from
its last checkpoint, and skips a diverged one (the same seed and settings diverge again);
``--retry-failed`` moves a failed or diverged run's directory aside to ``<run>.failed<n>/`` and
trains it afresh.
"""
from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from .fileio import atomic_write
from .init import ARMS
from .results import ARM_REPORT_FILENAME, FAILED_KIND, ResultsFile

__all__ = [
    "ARM_CHOICES",
    "IDENTITY_KEYS",
    "PLAN_FILENAME",
    "Outcome",
    "PREEMPTED_FILENAME",
    "Preempted",
    "RunSpec",
    "check_resume_identity",
    "describe_failure",
    "execute_runs",
    "failure_of",
    "failure_summary",
    "is_set_aside",
    "note_failure",
    "parse_lr_scales",
    "parse_seeds",
    "plan_runs",
    "read_arm_report",
    "read_plan",
    "write_arm_report",
    "write_plan",
]

ARM_CHOICES = tuple(ARMS) + ("all",)
PLAN_FILENAME = "experiment.json"
# What a resumed run must share with the run it continues.
IDENTITY_KEYS = ("arm", "seed", "arm_seed", "include", "exclude", "options", "lr_scale")


def parse_seeds(text: str) -> List[int]:
    """``"0,1,2"`` or ``"0-2"`` -> ``[0, 1, 2]``; raises ValueError naming the accepted forms."""
    seeds: List[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, "")
                seeds.extend(range(int(lo), int(hi) + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected non-negative integers like '0,1,2' or a range '0-2'") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: expected distinct non-negative integers like '0,1,2' or '0-2'")
    return seeds


def parse_lr_scales(text: str) -> List[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]`` (multipliers of the config's base learning rate)."""
    try:
        scales = [float(p) for p in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--lr-scale {text!r}: expected positive numbers like '0.5,1,2'") from None
    if not scales or any(not math.isfinite(s) or s <= 0 for s in scales) or len(set(scales)) != len(scales):
        raise ValueError(f"--lr-scale {text!r}: expected distinct positive numbers like '0.5,1,2'")
    return scales


def _format_scale(scale: float) -> str:
    return f"{scale:g}"


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: arm, training seed and learning-rate multiplier."""

    arm: str
    seed: int
    lr_scale: float = 1.0

    @property
    def name(self) -> str:
        """``seed<k>`` or ``seed<k>-lr<s>``: the run's folder under ``<base>/<arm>/``."""
        return f"seed{self.seed}" + ("" if self.lr_scale == 1.0 else f"-lr{_format_scale(self.lr_scale)}")

    def path(self, base: str) -> str:
        return os.path.join(base, self.arm, self.name)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "lr_scale": self.lr_scale, "dir": os.path.join(self.arm, self.name)}


def plan_runs(arms: Sequence[str], seeds: Sequence[int], lr_scales: Sequence[float] = (1.0,)) -> List[RunSpec]:
    """Every run of an experiment, in the order they are trained.

    All arms at the config's learning rate for every seed (seed by seed, so an interrupted
    experiment holds complete paired sets), then the learning-rate scan: the other scales for
    every arm on the first seed.
    """
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown arm(s) {unknown}; accepted: {', '.join(ARMS)} (or 'all')")
    runs = [RunSpec(arm, int(seed)) for seed in seeds for arm in arms]
    for scale in lr_scales:
        if float(scale) != 1.0:
            runs += [RunSpec(arm, int(seeds[0]), float(scale)) for arm in arms]
    return runs


def write_plan(base: str, runs: Sequence[RunSpec], *, stage: str, config: Optional[str],
               length: Optional[Mapping] = None) -> str:
    """Write ``<base>/experiment.json`` (the runs the report expects); returns its path.

    ``length``: how long each run trains, ``{"unit": "iteration" | "epoch", "total": N}`` (read by the
    status command to tell finished runs and estimate the time left).
    """
    path = os.path.join(base, PLAN_FILENAME)
    payload = {"version": 1, "stage": stage, "config": config, "runs": [r.to_dict() for r in runs]}
    if length is not None:
        payload["length"] = {"unit": str(length["unit"]), "total": int(length["total"])}
    atomic_write(path, json.dumps(payload, indent=1))
    return path


def read_plan(base: str) -> Optional[List[RunSpec]]:
    """The runs listed in ``<base>/experiment.json``, or None when there is no plan file."""
    path = os.path.join(base, PLAN_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None
    return [RunSpec(r["arm"], int(r["seed"]), float(r.get("lr_scale", 1.0))) for r in data.get("runs", [])]


def read_arm_report(run_dir: str) -> Optional[dict]:
    """The run's ``condinit_arm_report.json`` as a dict, or None when absent."""
    path = os.path.join(run_dir, ARM_REPORT_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); move it aside to start the run afresh") from None


def write_arm_report(run_dir: str, report: Mapping, identity: Mapping) -> str:
    """Write the arm report (``InitReport.to_dict()`` plus per-site extras) with the run identity."""
    path = os.path.join(run_dir, ARM_REPORT_FILENAME)
    atomic_write(path, json.dumps({"run": dict(identity), **dict(report)}, indent=2))
    return path


def _describe(identity: Mapping) -> str:
    return ", ".join(f"{k}={identity.get(k)!r}" for k in IDENTITY_KEYS if k in identity)


def check_resume_identity(run_dir: str, identity: Mapping, *, allow_change: bool = False) -> Optional[Dict]:
    """Refuse to resume ``run_dir`` with another arm, seed, patterns, options or lr scale.

    Compares ``identity`` with the ``run`` section of the run's arm report (when there is one).
    Returns the previous identity (or None). Raises ValueError naming both unless ``allow_change``.
    """
    previous = (read_arm_report(run_dir) or {}).get("run")
    if not previous:
        return None
    differing = [k for k in IDENTITY_KEYS if k in previous and previous.get(k) != identity.get(k)]
    if differing and not allow_change:
        raise ValueError(
            f"{run_dir} was started with {_describe({k: previous.get(k) for k in differing})} but this run asks "
            f"for {_describe({k: identity.get(k) for k in differing})}; resume with the same settings, use "
            "another output directory, or pass --allow-changed-run to continue anyway"
        )
    return previous


# ---------------------------------------------------------------------------------------------
# Failures are results; a preemption is neither a failure nor a finish
# ---------------------------------------------------------------------------------------------
PREEMPTED_FILENAME = "preempted"


class Preempted(Exception):
    """A run stopped at a step boundary to be requeued (the scheduler's time-limit signal); it resumes from
    its last checkpoint. Its processes leave ``<run_dir>/preempted``."""


_NOTE_PREFIX = "failure.rank"
_SET_ASIDE = re.compile(r"\.failed\d+$")


def failure_reason(exc: BaseException) -> str:
    """``"diverged"`` for a non-finite loss or prediction (``FloatingPointError``, as detectron2 and the
    pretraining loop raise it), ``"error"`` for anything else."""
    return "diverged" if isinstance(exc, FloatingPointError) else "error"


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def note_failure(run_dir: str, exc: BaseException, *, rank: int, iteration: Optional[int] = None,
                 epoch: Optional[int] = None) -> bool:
    """In a training process whose run raised: leave ``<run_dir>/failure.rank<k>.json`` for the launching
    process, which turns the notes into one ``"failed"`` record. The first note of a process wins (the
    innermost handler knows the iteration); returns whether this call wrote it."""
    path = os.path.join(run_dir, f"{_NOTE_PREFIX}{rank}.json")
    if os.path.exists(path):
        return False
    note = {"reason": failure_reason(exc), "message": _one_line(exc), "iteration": iteration, "epoch": epoch,
            "rank": int(rank), "time": time.time()}
    atomic_write(path, json.dumps(note))
    return True


def _take_notes(run_dir: str) -> List[dict]:
    notes = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), f"{_NOTE_PREFIX}*.json"))):
        try:
            with open(path) as f:
                notes.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            pass
        os.remove(path)
    return notes


def _last_iteration(run_dir: str) -> int:
    rf = ResultsFile(run_dir)
    return max((r["iteration"] for r in rf.records()), default=0) if rf.exists() else 0


def record_failure(run_dir: str, exc: BaseException, metadata: Mapping) -> dict:
    """In the launching process, after a run raised: add one ``"failed"`` record built from the processes'
    notes (a divergence first, else the earliest note: the other processes usually fail because that one
    stopped), or from ``exc`` when no process left a note (it was killed). Returns the record."""
    notes = _take_notes(run_dir) if os.path.isdir(run_dir) else []
    diverged = [n for n in notes if n.get("reason") == "diverged"]
    note = min(diverged or notes, key=lambda n: n.get("time", 0.0)) if notes else \
        {"reason": failure_reason(exc), "message": _one_line(exc)}
    iteration = note.get("iteration")
    record = {"kind": FAILED_KIND, "reason": note["reason"],
              "iteration": int(iteration) if iteration is not None else _last_iteration(run_dir),
              "message": note["message"], **dict(metadata)}
    if note.get("epoch") is not None:
        record["epoch"] = int(note["epoch"])
    ResultsFile(run_dir).add(record)
    return record


def failure_of(run_dir: str) -> Optional[dict]:
    """The run's ``"failed"`` record, or None (no results, or the run did not fail)."""
    rf = ResultsFile(run_dir)
    failed = rf.records(FAILED_KIND) if rf.exists() else []
    return failed[-1] if failed else None


def describe_failure(record: Mapping) -> str:
    """``"diverged at iteration 4"`` / ``"failed: RuntimeError: ..."``."""
    if record.get("reason") == "diverged":
        return f"diverged at iteration {record.get('iteration')}"
    return f"failed: {record.get('message')}"


def is_set_aside(name: str) -> bool:
    """Whether a folder name is a run directory moved aside by ``--retry-failed`` (``seed0.failed1``)."""
    return bool(_SET_ASIDE.search(name))


def _set_aside(run_dir: str) -> str:
    n = 0
    while os.path.exists(f"{run_dir}.failed{n}"):
        n += 1
    os.replace(run_dir, f"{run_dir}.failed{n}")
    return f"{run_dir}.failed{n}"


@dataclass
class Outcome:
    """What became of one planned run in :func:`execute_runs`."""

    spec: RunSpec
    path: str
    failure: Optional[dict] = None  # the "failed" record; None when the run finished (now or earlier)


def execute_runs(runs: Sequence[RunSpec], base: str, *, launch: Callable[[RunSpec], object],
                 finished: Callable[[RunSpec], bool], resume: bool, retry_failed: bool = False,
                 config: Optional[str] = None, main: bool = True,
                 log: Optional[logging.Logger] = None) -> List[Outcome]:
    """Train every planned run through ``launch(spec)`` (all processes of one run); a run that raises is
    recorded as failed and the next one starts. Resume rules: see the module docstring. ``main``: whether
    this is the launcher that writes (the first machine's); the others only launch. ``log``: the stage's
    console logger."""
    logger = log or logging.getLogger("condinit_det")
    outcomes = []
    for spec in runs:
        run_dir = spec.path(base)
        name = f"{spec.arm}/{spec.name}"
        failure = failure_of(run_dir) if resume else None
        if failure is not None and retry_failed:
            aside = _set_aside(run_dir) if main else "<run>.failed<n>"
            logger.warning(f"Run {name} {describe_failure(failure)} earlier; moved aside to {aside}, training it "
                           "afresh (--retry-failed)")
        elif failure is not None and failure.get("reason") == "diverged":
            logger.warning(f"Run {name} {describe_failure(failure)} earlier: not retried, the same seed and settings "
                           "diverge again (--retry-failed trains it afresh)")
            outcomes.append(Outcome(spec, run_dir, failure))
            continue
        elif failure is not None:
            if main:
                ResultsFile(run_dir).remove(FAILED_KIND)
            logger.warning(f"Run {name} {describe_failure(failure)} earlier: resuming it from its last checkpoint")
        elif resume and finished(spec):
            logger.info(f"Run {name} already finished in {run_dir}: skipped, results kept")
            outcomes.append(Outcome(spec, run_dir))
            continue
        preempted = os.path.join(run_dir, PREEMPTED_FILENAME)
        if main and os.path.exists(preempted):
            os.remove(preempted)
        try:
            launch(spec)
        except Exception as e:  # noqa: BLE001 -- any failure of one run is a result; the experiment goes on
            if isinstance(e, Preempted) or os.path.exists(preempted):
                if main:
                    _take_notes(run_dir)  # the processes stopped by the requeue signal are not failures
                raise Preempted(f"run {name} stopped for a requeue; it resumes from its last checkpoint") from e
            metadata = {"arm": spec.arm, "seed": spec.seed, "lr_scale": spec.lr_scale, "config": config}
            record = record_failure(run_dir, e, metadata) if main else {
                "kind": FAILED_KIND, "reason": failure_reason(e), "iteration": 0, "message": _one_line(e), **metadata}
            logger.error(f"Run {name} {describe_failure(record)} (traceback in {run_dir}/log*); going on with "
                         "the next run")
            outcomes.append(Outcome(spec, run_dir, record))
        else:
            outcomes.append(Outcome(spec, run_dir))
    return outcomes


def failure_summary(outcomes: Sequence[Outcome]) -> List[str]:
    """Lines naming the failed runs (empty when none failed)."""
    failed = [o for o in outcomes if o.failure is not None]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} run(s) did not finish:"]
    lines += [f"  {o.spec.arm} seed {o.spec.seed}" + ("" if o.spec.lr_scale == 1.0 else f" lr scale {o.spec.lr_scale:g}")
              + f": {describe_failure(o.failure)} ({o.path})" for o in failed]
    return lines
