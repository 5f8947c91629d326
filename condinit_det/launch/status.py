"""Where an experiment stands, read from its files alone, for any stage (``condinit-status``).

One entry per planned run (``experiment.json``), then the run directories no plan lists, each read through its
stage's descriptor: state, progress, the last evaluation's headline metrics, the ETA and, for Slurm runs, the job
and what ``squeue`` says of it. A run whose records cannot be read is shown as such; the others are read as usual.
The states and how each is decided: docs/training.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from tabulate import tabulate

from ..records.failures import describe_failure
from ..records.identity import ARM_REPORT_FILENAME, read_arm_report
from ..records.jobs import read_jobs
from ..records.layout import find_plans, is_set_aside, read_plan
from ..records.results import FAILED_KIND, METRICS_FILENAME, RESULTS_FILENAME, ResultsFile
from ..stage import StageDescriptor, stage_of
from ..stage.descriptor import UNITS
from ..utils.squeue import is_pending, query_jobs, still_runs

__all__ = ["STALE_AFTER", "STATES", "RunStatus", "experiment_status", "format_table", "summary_line"]

STATES = ("not started", "queued", "running", "stopped", "cancelled", "finished", "failed", "diverged", "unreadable")
STALE_AFTER = 600.0  # seconds without a log or metrics write after which a run counts as stopped
LOG_FILENAME = "log.txt"
_ENDED = ("finished", "failed", "diverged", "unreadable")
_TAIL_BYTES = 1 << 16  # the last training line of metrics.json lies in its tail


@dataclass
class RunStatus:
    """One run's state: ``last`` is the progress in ``unit`` (a fraction inside an epoch), ``evaluation`` the latest
    evaluation's x (``"at"``) and headline metrics, ``iteration`` the completed optimizer steps."""

    arm: str
    seed: Optional[int]
    lr_scale: float
    path: str  # the run directory
    planned: bool  # listed in an experiment plan (else found on disk only)
    state: str = "not started"
    stage: Optional[str] = None  # the stage's name; None when nothing tells
    unit: Optional[str] = None
    last: Optional[float] = None
    total: Optional[int] = None  # the run's length in ``unit``; None when unknown
    iteration: Optional[int] = None
    evaluation: Optional[Dict[str, Optional[float]]] = None
    sec_per_iter: Optional[float] = None
    eta_seconds: Optional[float] = None
    updated: Optional[float] = None  # last write of log.txt / metrics.json (seconds since the epoch)
    log: Optional[str] = None
    failure: Optional[Dict] = None  # {"reason", "message", "iteration"[, "epoch"]}
    problem: Optional[str] = None  # why its records cannot be read
    job: Optional[Dict] = None  # {"id", "state"}: the run's current Slurm job and what squeue says of it
    descriptor: Optional[StageDescriptor] = field(default=None, repr=False)
    _end: Optional[int] = field(default=None, repr=False)  # the length this run itself shows (outside a plan)
    # At the last training line of metrics.json: (units done, steps done, seconds per step, the writer's own ETA).
    _line: Optional[tuple] = field(default=None, repr=False)
    _line_time: Optional[float] = field(default=None, repr=False)  # when it was written

    @property
    def name(self) -> str:
        seed = "?" if self.seed is None else self.seed
        return f"{self.arm} seed {seed}" + ("" if self.lr_scale == 1.0 else f" lr scale {self.lr_scale:g}")

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key != "descriptor" and key[0] != "_"}


def _mtime(path: str) -> Optional[float]:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def _last_training_line(path: str) -> Optional[dict]:
    """The last ``metrics.json`` line of a training step (it has ``"time"``), skipping evaluation and torn lines."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - _TAIL_BYTES, 0))
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


def _identity(path: str, records: Sequence[dict]) -> Tuple[str, Optional[int], float]:
    """(arm, seed, lr scale) of a run found on disk: its arm report's run section, then its records. An arm report
    that is not an object with a ``run`` object raises ValueError."""
    report = read_arm_report(path) or {}
    run = report.get("run") or {} if isinstance(report, dict) else None
    if not isinstance(run, dict):
        raise ValueError(f"{os.path.join(path, ARM_REPORT_FILENAME)} is not an arm report: its 'run' is no object")
    arm, seed, scale = run.get("arm"), run.get("seed"), run.get("lr_scale")
    for r in records:  # the records win, as in the report
        arm = r["arm"] if r.get("arm") is not None else arm
        seed = r["seed"] if r.get("seed") is not None else seed
        scale = r["lr_scale"] if r.get("lr_scale") is not None else scale
    return arm or "?", None if seed is None else int(seed), 1.0 if scale is None else float(scale)


def _read_run(status: RunStatus, records: Sequence[dict], now: float, stale_after: float) -> RunStatus:
    """Fill ``status`` from its directory; finished or not is settled once the run's length is known."""
    path, d = status.path, status.descriptor
    log, metrics = os.path.join(path, LOG_FILENAME), os.path.join(path, METRICS_FILENAME)
    if d is not None:
        status.stage, status.unit = d.name, d.unit
    if not any(os.path.isfile(p) for p in (log, metrics, os.path.join(path, RESULTS_FILENAME))):
        status.state = "not started"
        return status
    line = _last_training_line(metrics) if os.path.isfile(metrics) else None
    status._line_time = _mtime(metrics)
    status.log = log if os.path.isfile(log) else None
    times = [t for t in (_mtime(log), _mtime(metrics)) if t is not None]
    status.updated = max(times) if times else None
    status.state = "running" if status.updated is not None and now - status.updated <= stale_after else "stopped"

    # Progress: the last training line, then the evaluations and a failure (whichever is furthest).
    steps, x = None, None
    if line is not None and d is not None:
        steps = int(line["iteration"]) + d.metrics_step_offset
        x = steps if d.unit == "iteration" else _number(line.get(d.unit))
        status.sec_per_iter = _number(line.get("time"))
        status._line = (x, steps, status.sec_per_iter, _number(line.get(d.eta_key)) if d.eta_key else None)
    evals = [r for r in records if d is not None and r["kind"] == d.eval_kind and r.get(d.unit) is not None]
    if evals:
        last = max(evals, key=lambda r: (r[d.unit], r["iteration"]))
        status.evaluation = {"at": last[d.unit], **{m.key: _number(m.value(last)) for m in d.headline}}
        steps = max(steps or 0, int(last["iteration"]))
        x = max(x or 0, last[d.unit])
    failed = [r for r in records if r["kind"] == FAILED_KIND]
    if failed:
        record = failed[-1]
        status.failure = {k: record.get(k) for k in ("reason", "message", "iteration", "epoch") if k in record}
        status.state = "diverged" if record.get("reason") == "diverged" else "failed"
        steps = int(record["iteration"])
        if x is None and d is not None:  # the (0-based) epoch it failed in: all of it unfinished
            x = _number(record.get(d.unit))
    status.iteration = steps
    status.last = steps if d is not None and d.unit == "iteration" else x
    if d is not None and d.final_file and evals and os.path.isfile(os.path.join(path, d.final_file)):
        status._end = int(status.evaluation["at"])
    return status


def _settle(status: RunStatus, total: Optional[int]) -> RunStatus:
    """The stage's finished rule: an evaluation at the run's full length ``total``; returns ``status``."""
    status.total = total
    at = (status.evaluation or {}).get("at")
    if status.state in ("running", "stopped") and at is not None and total is not None and at >= total:
        status.state = "finished"
    return status


def _eta(status: RunStatus, now: float) -> Optional[float]:
    """Seconds left as of now: the writer's own estimate (or units left x steps per unit x step time) at the last
    training line, less the time since it was written."""
    if status._line is None:
        return None
    x, steps, per_step, eta = status._line
    if eta is None and status.total is not None and x and per_step is not None:
        eta = max(status.total - x, 0.0) * (steps / x) * per_step
    return None if eta is None else max(eta - max(now - (status._line_time or now), 0.0), 0.0)


def _add_jobs(base: str, runs: List[RunStatus]) -> None:
    """Each run's current Slurm job and its squeue state: a run not ended is queued, running or cancelled with it."""
    jobs = read_jobs(base)
    states = query_jobs(list(jobs.values())).states
    for r in runs:
        job = jobs.get(os.path.relpath(r.path, base))
        if job is None:
            continue
        state = states.get(job)
        r.job = {"id": job, "state": state}
        if r.state in _ENDED:
            continue
        if is_pending(state):
            r.state = "queued"
        elif state == "CANCELLED":
            r.state = "cancelled"
        elif still_runs(state):
            r.state = "running"


def _run_dirs(root: str) -> List[str]:
    """Run directories under ``root`` (sorted), without runs set aside by --retry-failed and the report folder."""
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not is_set_aside(d) and d != "report")
        if RESULTS_FILENAME in files or METRICS_FILENAME in files:
            found.append(here)
    return found


def _read(status: RunStatus, now: float, stale_after: float) -> RunStatus:
    """Fill ``status`` from its run directory; a run in no plan takes its identity and stage from its own files. A
    results file or arm report that cannot be read makes it ``"unreadable"``, with why (the other runs are shown)."""
    records = []
    try:
        records = ResultsFile(status.path).records()
        if not status.planned:
            status.arm, status.seed, status.lr_scale = _identity(status.path, records)
    except ValueError as e:
        status.state, status.problem = "unreadable", str(e)
    if not status.planned:
        status.descriptor = stage_of(next((r["stage"] for r in reversed(records) if r.get("stage")), None))
    return status if status.problem else _read_run(status, records, now, stale_after)


def experiment_status(path: str, *, stale_after: float = STALE_AFTER, now: Optional[float] = None) -> List[RunStatus]:
    """Every run under ``path`` (an experiment directory, a folder of experiments or one run directory): the planned
    runs in plan order, then the runs no plan lists. Raises ValueError for a ``stale_after`` that is not a positive
    number of seconds, a path that is not a directory, holds neither a plan nor a run, or has an unreadable plan; a
    run whose results file cannot be read is shown ``"unreadable"``, with why."""
    if not math.isfinite(stale_after) or stale_after <= 0:
        raise ValueError(f"--stale-after {stale_after:g}: expected a positive number of seconds")
    if not os.path.isdir(path):
        raise ValueError(
            f"{path} is not a directory; expected an experiment directory (with experiment.json) or a run directory"
        )
    now = time.time() if now is None else float(now)
    bases, run_dirs = find_plans(path), _run_dirs(path)
    if not bases and not run_dirs:
        raise ValueError(
            f"{path} holds no experiment plan (experiment.json) and no run directory (with "
            f"{RESULTS_FILENAME} or {METRICS_FILENAME})"
        )

    out, seen, root = [], set(), os.path.realpath(path)
    for base in bases:
        plan = read_plan(base)
        descriptor = stage_of(plan.stage, plan.stage_description)
        if descriptor is None:
            raise ValueError(
                f"{base}/experiment.json: stage {plan.stage!r} is not described in the plan and no "
                "stage of that name is known"
            )
        total, runs = plan.length if plan.unit == descriptor.unit else None, []
        for spec in plan.runs:
            run_path = spec.path(base)
            real = os.path.realpath(run_path)
            if os.path.commonpath([real, root]) in (real, root):  # under ``path``, or ``path`` is in it
                seen.add(real)
                status = RunStatus(spec.arm, spec.seed, spec.lr_scale, run_path, True, descriptor=descriptor)
                runs.append(_settle(_read(status, now, stale_after), total))
        _add_jobs(base, runs)
        out.extend(runs)
    found = []
    for run_path in run_dirs:
        if os.path.realpath(run_path) in seen:
            continue
        found.append(_read(RunStatus("?", None, 1.0, run_path, False), now, stale_after))
    for r in found:  # outside a plan the length is what the run itself shows, else the longest of its stage's runs
        shown = max((f._end for f in found if f._end is not None and f.stage == r.stage), default=None)
        _settle(r, r._end if r._end is not None else shown)
    for r in out + found:
        r.eta_seconds = _eta(r, now) if r.state == "running" else None
    return out + found


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
    if s.unit == "iteration":
        return f"it {s.last}/{total}"
    last = f"{s.last:g}" if float(s.last).is_integer() else f"{s.last:.2f}"
    return f"{s.unit} {last}/{total}" + ("" if s.iteration is None else f" (it {s.iteration})")


def _evaluation(s: RunStatus) -> str:
    if s.evaluation is None or s.descriptor is None:
        return "-"
    values = [(m.short or m.header, s.evaluation.get(m.key)) for m in s.descriptor.headline]
    metrics = " ".join(f"{name} {'-' if v is None else format(v, '.2f')}" for name, v in values)
    return f"{metrics} @{UNITS[s.unit]} {s.evaluation['at']}"


def format_table(statuses: Sequence[RunStatus], base: str = "") -> str:
    """One line per run: arm, seed, lr scale, state, progress, latest evaluation, s/it, ETA, log."""
    rows = []
    for s in statuses:
        log = s.log or os.path.join(s.path, LOG_FILENAME) + " (none yet)"
        state = s.state + (f" (job {s.job['id']})" if s.job else "")
        rows.append(
            (
                s.arm,
                "?" if s.seed is None else str(s.seed),
                f"{s.lr_scale:g}",
                state,
                _progress(s),
                _evaluation(s),
                "-" if s.sec_per_iter is None else f"{s.sec_per_iter:.3g}",
                _duration(s.eta_seconds),
                os.path.relpath(log, base) if base else log,
            )
        )
    header = ("arm", "seed", "lr", "state", "progress", "last evaluation", "s/it", "ETA", "log")
    table = tabulate(rows, headers=header, tablefmt="plain", disable_numparse=True, stralign="left")
    notes = [f"  {s.name}: {describe_failure(s.failure)}" for s in statuses if s.failure is not None]
    notes += [f"  {s.name}: {s.problem}" for s in statuses if s.problem is not None]
    unplanned = [s for s in statuses if not s.planned]
    if unplanned and len(unplanned) < len(statuses):
        notes.append(f"  {len(unplanned)} run(s) listed in no plan: " + ", ".join(s.path for s in unplanned))
    return "\n".join([line.rstrip() for line in table.splitlines()] + notes)


def summary_line(statuses: Sequence[RunStatus]) -> str:
    """``"9 runs: 4 finished, 1 running, 1 stopped, 2 not started, 1 diverged"`` (states with no run left out)."""
    counts = Counter(s.state for s in statuses)
    parts = [f"{counts[state]} {state}" for state in STATES if counts[state]]
    return f"{len(statuses)} run{'s' if len(statuses) != 1 else ''}" + (": " + ", ".join(parts) if parts else "")
