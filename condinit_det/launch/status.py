"""Where an experiment stands, read from its directory alone (both training stages).

    python tools/experiment_status.py DIR [--json] [--stale-after S]     (condinit_det.commands.status)

One entry per planned run (the plan ``experiment.json``, :mod:`condinit_det.records.layout`), then the run
directories found under DIR that no plan lists (a single run directory works too). Like the report,
this reads files only: ``results.json``, ``metrics.json``, ``log.txt`` and the plan; it imports no
training code and can watch an experiment another machine is writing.

States, in the order they are decided:

- ``not started``: the run directory holds none of ``results.json``, ``metrics.json``, ``log.txt``.
- ``diverged`` / ``failed``: ``results.json`` holds a ``"failed"`` record (the iteration and message
  come from it).
- ``finished``: an evaluation is recorded at the run's full length (iterations for detection, epochs
  for pretraining). The length is the plan's ``"length"``; plans without one fall back on what the
  runs show: a detection run reached its end when detectron2's last ``metrics.json`` line has an ETA
  of 0 (the writer always logs the last iteration), a pretraining run when its ``model_final.pth``
  exists (written after the final evaluation); the other runs of the experiment take the longest such
  length. Without any of these no run is called finished.
- ``running``: ``log.txt`` or ``metrics.json`` was written within ``stale_after`` seconds.
- ``stopped``: anything else (killed, or waiting to be resumed); the entry keeps its last iteration.

Runs submitted with ``--slurm`` (``<base>/slurm.json``) also show their job id and Slurm state (from
``squeue``, while Slurm remembers the job); a run that has not finished or failed is ``queued`` while
its job is pending and ``cancelled`` when its job was cancelled.

Progress counts completed optimizer steps (detectron2's ``metrics.json`` numbers them from 0; the
pretraining writer from 1) and, for pretraining, the epoch as a fraction. The time per iteration is the
last logged median step time; the ETA (running runs only) is detectron2's own estimate for detection
and the remaining steps times the step time for pretraining, both without evaluation time.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..records.failures import describe_failure
from ..records.identity import ARM_REPORT_FILENAME
from ..records.layout import PLAN_FILENAME, is_set_aside, read_plan
from ..records.results import FAILED_KIND, RESULTS_FILENAME, ResultsFile

__all__ = ["STALE_AFTER", "STATES", "RunStatus", "experiment_status", "format_table", "summary_line"]

STATES = ("not started", "queued", "running", "stopped", "cancelled", "finished", "failed", "diverged")
STALE_AFTER = 600.0  # seconds without a log or metrics write after which a run counts as stopped
DETECTION, PRETRAIN = "detection", "pretrain"
METRICS_FILENAME = "metrics.json"
LOG_FILENAME = "log.txt"
FINAL_FILENAME = "model_final.pth"  # both stages write it when training ends
_EVAL_KIND = {DETECTION: "ap", PRETRAIN: "cls"}
_UNIT = {DETECTION: "iteration", PRETRAIN: "epoch"}
_TAIL_BYTES = 1 << 16  # the last training line of metrics.json lies in its tail


@dataclass
class RunStatus:
    """One run's state. ``last`` counts iterations (detection) or epochs (pretraining, a fraction while in
    an epoch); ``evaluation`` is the latest evaluation record's x (``"at"``) and headline numbers."""

    arm: str
    seed: Optional[int]
    lr_scale: float
    path: str  # the run directory
    planned: bool  # listed in an experiment plan (else found on disk only)
    state: str = "not started"
    stage: Optional[str] = None  # "detection" / "pretrain"; None when nothing tells
    unit: Optional[str] = None  # "iteration" / "epoch"
    last: Optional[float] = None
    total: Optional[int] = None  # the run's length in ``unit``; None when unknown
    iteration: Optional[int] = None  # completed optimizer steps
    evaluation: Optional[Dict[str, Optional[float]]] = None
    sec_per_iter: Optional[float] = None
    eta_seconds: Optional[float] = None
    updated: Optional[float] = None  # last write of log.txt / metrics.json (seconds since the epoch)
    log: Optional[str] = None
    failure: Optional[Dict] = None  # {"reason", "message", "iteration"[, "epoch"]}
    job: Optional[Dict] = None  # reserved for a scheduler's view of the run (job id, queue state)
    _end: Optional[int] = field(default=None, repr=False)  # the length this run itself shows (fallback)
    _line: Optional[dict] = field(default=None, repr=False)  # the last training line of metrics.json
    _line_time: Optional[float] = field(default=None, repr=False)  # when it was written

    @property
    def name(self) -> str:
        seed = "?" if self.seed is None else self.seed
        return f"{self.arm} seed {seed}" + ("" if self.lr_scale == 1.0 else f" lr scale {self.lr_scale:g}")

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("_end", "_line", "_line_time"):
            d.pop(key)
        return d


# ---------------------------------------------------------------------------------------------
# Reading one run directory
# ---------------------------------------------------------------------------------------------
def _mtime(path: str) -> Optional[float]:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def _last_training_line(path: str) -> Optional[dict]:
    """The last ``metrics.json`` line of a training step (it has ``"time"``); evaluation lines and lines
    torn by a killed writer are skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - _TAIL_BYTES, 0))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "iteration" in obj and "time" in obj:
            return obj
    return None


def _number(value) -> Optional[float]:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _headline(stage: str, record: dict) -> Dict[str, Optional[float]]:
    if stage == DETECTION:
        return {"at": record["iteration"], "bbox": _number((record.get("bbox") or {}).get("AP")),
                "segm": _number((record.get("segm") or {}).get("AP"))}
    return {"at": record.get("epoch"), "top1": _number(record.get("top1")), "top5": _number(record.get("top5"))}


def _stage_of(records: Sequence[dict], line: Optional[dict]) -> Optional[str]:
    kinds = {r["kind"] for r in records}
    if "cls" in kinds or "cls_eval" in kinds:
        return PRETRAIN
    if "ap" in kinds or "eval" in kinds:
        return DETECTION
    if line is not None:  # only the pretraining writer logs a fractional epoch
        return PRETRAIN if "epoch" in line else DETECTION
    return None


def _identity(path: str, records: Sequence[dict]) -> Tuple[Optional[str], Optional[int], float]:
    """(arm, seed, lr scale) of a run found on disk: its arm report's run section, then its records."""
    arm = seed = scale = None
    report = os.path.join(path, ARM_REPORT_FILENAME)
    if os.path.isfile(report):
        try:
            with open(report) as f:
                run = json.load(f).get("run") or {}
            arm, seed, scale = run.get("arm"), run.get("seed"), run.get("lr_scale")
        except (OSError, json.JSONDecodeError, AttributeError):
            pass
    for r in records:  # the records win, as in the report
        arm = r["arm"] if r.get("arm") is not None else arm
        seed = r["seed"] if r.get("seed") is not None else seed
        scale = r["lr_scale"] if r.get("lr_scale") is not None else scale
    return arm, None if seed is None else int(seed), 1.0 if scale is None else float(scale)


def _read_run(status: RunStatus, stage: Optional[str], now: float, stale_after: float) -> RunStatus:
    """Fill ``status`` from its directory; ``state`` is left for :func:`experiment_status` to settle
    between finished / running / stopped."""
    path = status.path
    log, metrics = os.path.join(path, LOG_FILENAME), os.path.join(path, METRICS_FILENAME)
    rf = ResultsFile(path)
    status.stage, status.unit = stage, _UNIT.get(stage)
    if not any(os.path.isfile(p) for p in (log, metrics, rf.path)):
        status.state = "not started"
        return status
    records = rf.records() if rf.exists() else []
    line = _last_training_line(metrics) if os.path.isfile(metrics) else None
    stage = stage or _stage_of(records, line)
    status.stage, status.unit = stage, _UNIT.get(stage)
    status._line, status._line_time = line, _mtime(metrics)
    status.log = log if os.path.isfile(log) else None
    times = [t for t in (_mtime(log), _mtime(metrics)) if t is not None]
    status.updated = max(times) if times else None

    # Progress: the last training line, then the evaluations and a failure (whichever is furthest).
    iteration, epoch = None, None
    if line is not None:
        iteration = int(line["iteration"]) + (1 if stage == DETECTION else 0)
        epoch = _number(line.get("epoch"))
        status.sec_per_iter = _number(line.get("time"))
    evals = [r for r in records if stage is not None and r["kind"] == _EVAL_KIND[stage]
             and r.get(status.unit) is not None]
    if evals:
        last = max(evals, key=lambda r: (r[status.unit], r["iteration"]))
        status.evaluation = _headline(stage, last)
        iteration = max(iteration or 0, int(last["iteration"]))
        if stage == PRETRAIN:
            epoch = max(epoch or 0.0, float(last["epoch"]))
    failed = [r for r in records if r["kind"] == FAILED_KIND]
    if failed:
        rec = failed[-1]
        status.failure = {k: rec.get(k) for k in ("reason", "message", "iteration", "epoch") if k in rec}
        status.state = "diverged" if rec.get("reason") == "diverged" else "failed"
        iteration = int(rec["iteration"])
        if epoch is None and rec.get("epoch") is not None:
            epoch = float(rec["epoch"])  # the (0-based) epoch it failed in: all of it unfinished
    status.iteration = iteration
    status.last = epoch if stage == PRETRAIN else iteration

    # What the run itself shows about its length (used when the plan does not give it).
    if stage == DETECTION and line is not None and _number(line.get("eta_seconds")) == 0.0:
        status._end = int(line["iteration"]) + 1
    elif stage == PRETRAIN and evals and os.path.isfile(os.path.join(path, FINAL_FILENAME)):
        status._end = int(status.evaluation["at"])
    status.state = status.state if failed else (
        "running" if status.updated is not None and now - status.updated <= stale_after else "stopped")
    return status


def _settle(status: RunStatus, total: Optional[int], now: float) -> None:
    """Finished or not, and the ETA (running runs only), once the run's length is known."""
    status.total = total
    done = status.evaluation is not None and status.evaluation.get("at") is not None and \
        total is not None and status.evaluation["at"] >= total
    if status.state in ("running", "stopped") and done:
        status.state = "finished"
    status.eta_seconds = _eta(status, total, now) if status.state == "running" else None


def _eta(status: RunStatus, total: Optional[int], now: float) -> Optional[float]:
    """Seconds left as of now: the estimate at the last training line, less the time since it was written.

    Detection: detectron2's own ``eta_seconds``. Pretraining: the epochs left times the steps per epoch
    (the line's step over its fractional epoch) times the line's seconds per step.
    """
    line = status._line
    if line is None:
        return None
    if status.stage == DETECTION:
        eta = _number(line.get("eta_seconds"))
    else:
        epoch, per_step = _number(line.get("epoch")), _number(line.get("time"))
        if total is None or not epoch or per_step is None:
            return None
        eta = max(total - epoch, 0.0) * (int(line["iteration"]) / epoch) * per_step
    if eta is None:
        return None
    return max(eta - max(now - (status._line_time or now), 0.0), 0.0)


# ---------------------------------------------------------------------------------------------
# An experiment directory
# ---------------------------------------------------------------------------------------------
def _read_plan_file(base: str) -> dict:
    path = os.path.join(base, PLAN_FILENAME)
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not an experiment plan: expected an object with a 'runs' list")
    return data


def _plan_stage(name: Optional[str]) -> Optional[str]:
    return {"detection": DETECTION, "pretrain": PRETRAIN, "classification": PRETRAIN}.get(name or "")


def _plan_length(plan: dict, stage: Optional[str]) -> Optional[int]:
    length = plan.get("length")
    if not isinstance(length, dict) or stage is None or length.get("unit") != _UNIT[stage]:
        return None
    try:
        return int(length["total"])
    except (KeyError, TypeError, ValueError):
        return None


def _walk(root: str):
    """Directories under ``root`` (sorted, depth first), skipping run directories set aside by
    --retry-failed and the report folder."""
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not is_set_aside(d) and d != "report")
        yield here, set(files)


def experiment_status(path: str, *, stale_after: float = STALE_AFTER, now: Optional[float] = None) -> List[RunStatus]:
    """Every run under ``path`` (an experiment directory, a folder of experiments or one run directory):
    the planned runs in plan order, then the runs no plan lists. Raises ValueError for a path that is not
    a directory, holds neither a plan nor a run, or has an unreadable plan or results file."""
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a directory; expected an experiment directory (with {PLAN_FILENAME}) "
                         "or a run directory")
    now = time.time() if now is None else float(now)
    bases, run_dirs = [], []
    for here, files in _walk(path):
        if PLAN_FILENAME in files:
            bases.append(here)
        if RESULTS_FILENAME in files or METRICS_FILENAME in files:
            run_dirs.append(here)
    if not bases and not run_dirs:
        raise ValueError(f"{path} holds no experiment plan ({PLAN_FILENAME}) and no run directory (with "
                         f"{RESULTS_FILENAME} or {METRICS_FILENAME})")

    groups: List[Tuple[List[RunStatus], Optional[int]]] = []  # (runs of one experiment, plan length)
    seen = set()
    for base in bases:
        plan, specs = _read_plan_file(base), read_plan(base) or []
        stage = _plan_stage(plan.get("stage"))
        runs = []
        for spec in specs:
            run_path = spec.path(base)
            seen.add(os.path.realpath(run_path))
            runs.append(_read_run(RunStatus(spec.arm, spec.seed, spec.lr_scale, run_path, True), stage, now,
                                  stale_after))
        groups.append((runs, _plan_length(plan, stage)))
        _add_jobs(base, runs)
    found = []
    for run_path in run_dirs:
        if os.path.realpath(run_path) in seen:
            continue
        rf = ResultsFile(run_path)
        arm, seed, scale = _identity(run_path, rf.records() if rf.exists() else [])
        found.append(_read_run(RunStatus(arm or "?", seed, scale, run_path, False), None, now, stale_after))
    if found:
        groups.append((found, None))

    out = []
    for runs, length in groups:
        for stage in {r.stage for r in runs}:
            same = [r for r in runs if r.stage == stage]
            shown = max((r._end for r in same if r._end is not None), default=None)
            for r in same:
                _settle(r, length if length is not None else (r._end if r._end is not None else shown), now)
        out.extend(runs)
    return out


def _squeue_states(job_ids: Sequence[str]) -> Dict[str, str]:
    """Slurm's state of each job id it still remembers (``squeue --states=all``); {} without Slurm."""
    import shutil
    import subprocess

    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:
        out = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%T", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.strip().split("|", 1) for line in out.splitlines() if "|" in line)


def _add_jobs(base: str, runs: List[RunStatus]) -> None:
    from .cluster import read_jobs

    jobs = read_jobs(base)
    if not jobs:
        return
    states = _squeue_states(sorted(set(jobs.values())))
    for r in runs:
        job = jobs.get(os.path.relpath(r.path, base))
        if job is None:
            continue
        r.job = {"id": job, "state": states.get(job)}
        if r.state in ("finished", "failed", "diverged"):
            continue
        if states.get(job) == "PENDING":
            r.state = "queued"
        elif states.get(job) == "CANCELLED":
            r.state, r.eta_seconds = "cancelled", None


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d" if d else "") + f"{h}:{m:02d}:{s:02d}"


def _progress(s: RunStatus) -> str:
    if s.last is None:
        return "-"
    total = "?" if s.total is None else s.total
    if s.unit == "epoch":
        epoch = f"{s.last:g}" if float(s.last).is_integer() else f"{s.last:.2f}"
        return f"epoch {epoch}/{total}" + ("" if s.iteration is None else f" (it {s.iteration})")
    return f"it {s.last}/{total}"


def _metric(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def _evaluation(s: RunStatus) -> str:
    e = s.evaluation
    if e is None:
        return "-"
    if s.stage == DETECTION:
        return f"box {_metric(e['bbox'])} mask {_metric(e['segm'])} @it {e['at']}"
    return f"top-1 {_metric(e['top1'])} @ep {e['at']}"


def format_table(statuses: Sequence[RunStatus], base: str = "") -> str:
    """One line per run: arm, seed, lr scale, state, progress, latest evaluation, s/it, ETA, log."""
    header = ("arm", "seed", "lr", "state", "progress", "last evaluation", "s/it", "ETA", "log")
    rows = [header]
    for s in statuses:
        log = s.log or os.path.join(s.path, LOG_FILENAME) + " (none yet)"
        state = s.state + (f" (job {s.job['id']})" if s.job else "")
        rows.append((s.arm, "?" if s.seed is None else str(s.seed), f"{s.lr_scale:g}", state, _progress(s),
                     _evaluation(s), "-" if s.sec_per_iter is None else f"{s.sec_per_iter:.3g}",
                     _duration(s.eta_seconds), os.path.relpath(log, base) if base else log))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    notes = [f"  {s.name}: {describe_failure(s.failure)}" for s in statuses if s.failure is not None]
    unplanned = [s for s in statuses if not s.planned]
    if unplanned and len(unplanned) < len(statuses):
        notes.append(f"  {len(unplanned)} run(s) listed in no plan: " + ", ".join(s.path for s in unplanned))
    return "\n".join([line.rstrip() for line in lines] + notes)


def summary_line(statuses: Sequence[RunStatus]) -> str:
    """``"9 runs: 4 finished, 1 running, 1 stopped, 2 not started, 1 diverged"`` (states with no run left out)."""
    counts = Counter(s.state for s in statuses)
    parts = [f"{counts[state]} {state}" for state in STATES if counts[state]]
    return f"{len(statuses)} run{'s' if len(statuses) != 1 else ''}" + (": " + ", ".join(parts) if parts else "")
