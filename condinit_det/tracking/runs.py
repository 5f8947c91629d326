"""One training run's tracker runs, their ids kept in the run directory, and the report's.

:class:`RunTracking` holds the tracker runs of one training run (one per enabled tracker) and keeps their ids in the
run directory (``trackers.json``), so that a resumed run or a requeued Slurm element continues the same tracker runs
instead of starting second ones.

Only the main process of a run tracks: the launcher opens the run's tracking there with :func:`tracked_run`, which
makes it the process's :func:`active_run` while the stage trains; the stages' event writers
(:class:`condinit_det.tracking.events.TrackerWriter`) and evaluations send to it. A tracker that fails mid-run is
logged once and dropped: tracking never stops a training.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ..utils.fileio import atomic_write
from .base import FAILED, FINISHED, KILLED, RUNNING, STATE_FILENAME, RunInfo, Tracker
from .settings import enabled_trackers

__all__ = ["RunTracking", "active_run", "arm_report_params", "attach_report", "forget_runs", "mark_unfinished",
           "read_state", "tracked_run"]

_ARM_REPORT_FILENAME = "condinit_arm_report.json"

logger = logging.getLogger("condinit_det.tracking")


def arm_report_params(run_dir: str) -> Optional[Dict[str, Any]]:
    """The arm report of ``run_dir`` (``condinit_arm_report.json``) as parameters, or None while it is not
    written: the number of attention sites, of sites and parameters the arm changed, the changed sites' names, and
    the sites whose weights a checkpoint overwrote."""
    path = os.path.join(run_dir, _ARM_REPORT_FILENAME)
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    sites = report.get("sites") or []
    changed = [s.get("name") for s in sites if s.get("changed")]
    params = {"arm_report.arm": report.get("arm"), "arm_report.sites": len(sites),
              "arm_report.sites_changed": len(changed),
              "arm_report.parameters_changed": sum(len(s.get("changed") or []) for s in sites),
              "arm_report.changed_sites": ",".join(str(n) for n in changed)}
    from_checkpoint = [s.get("name") for s in sites if str(s.get("weights_from", "arm")).startswith("checkpoint")]
    if from_checkpoint:
        params["arm_report.sites_from_checkpoint"] = len(from_checkpoint)
    if report.get("init_checkpoint"):
        params["arm_report.init_checkpoint"] = report["init_checkpoint"]
    return params


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def read_state(run_dir: str) -> Dict[str, dict]:
    """The tracker runs recorded in ``run_dir`` (``trackers.json``): tracker name -> its id, state and the
    settings it was opened with; empty when none."""
    path = os.path.join(run_dir, STATE_FILENAME)
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        logger.warning(f"{path} is unreadable ({_one_line(e)}): new tracker runs are started")
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(run_dir: str, state: Mapping[str, dict]) -> None:
    atomic_write(os.path.join(run_dir, STATE_FILENAME), json.dumps(state, indent=2, sort_keys=True))


def forget_runs(run_dir: str) -> bool:
    """A fresh (not resumed) run in ``run_dir`` starts new tracker runs: forget the recorded ones (their data
    stays where the trackers keep it). Returns whether there were any."""
    path = os.path.join(run_dir, STATE_FILENAME)
    if not os.path.isfile(path):
        return False
    os.remove(path)
    return True


def make_tracker(name: str, settings: Mapping[str, Any]) -> Tracker:
    if name == "wandb":
        from .wandb_tracker import WandbTracker

        return WandbTracker(settings)
    if name == "mlflow":
        from .mlflow_tracker import MlflowTracker

        return MlflowTracker(settings)
    raise ValueError(f"unknown tracker {name!r}")


def _numbers(values: Mapping[str, Any]) -> Dict[str, float]:
    """The values that are numbers, as floats (None, an undefined metric, is left out)."""
    out = {}
    for key, value in values.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class RunTracking:
    """The tracker runs of one training run (none when no tracker is enabled). Every call goes to each tracker;
    one that raises is logged once and dropped for the rest of the run (its run is still ended with the others)."""

    def __init__(self, info: RunInfo, trackers: List[Tracker], state: Dict[str, dict]):
        self.info, self.trackers, self.state = info, trackers, state
        self.dropped: List[Tracker] = []
        self._arm_report_logged = False

    @classmethod
    def open(cls, settings: Mapping, info: RunInfo) -> "RunTracking":
        """Start the enabled trackers' runs of ``info`` (continuing the ones recorded in its directory) and log
        its parameters."""
        os.makedirs(info.run_dir, exist_ok=True)
        state = read_state(info.run_dir)
        trackers = []
        for name in enabled_trackers(settings):
            tracker = make_tracker(name, settings[name])
            previous = state.get(name)
            try:
                entry = tracker.start(info, previous)
            except Exception as e:  # noqa: BLE001 -- a tracker never stops a run
                logger.warning(f"{name}: this run is not tracked ({_one_line(e)})")
                continue
            logger.info(f"{name}: {'continuing' if previous and previous.get('id') == entry.get('id') else 'started'}"
                        f" tracker run {entry.get('id')} for {info.name}")
            state[name] = {**entry, "state": RUNNING}
            trackers.append(tracker)
        tracking = cls(info, trackers, state)
        if trackers:
            _write_state(info.run_dir, state)
            tracking.log_params(info.params())
            tracking.log_arm_report()
        return tracking

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, what: str, call) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:  # noqa: BLE001 -- a tracker never stops a run
                logger.warning(f"{tracker.name}: {what} failed ({_one_line(e)}); not tracking the rest of this run")
                self.trackers.remove(tracker)
                self.dropped.append(tracker)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._each("logging parameters", lambda t: t.log_params(params))

    def log_arm_report(self) -> None:
        """The arm report's parameters, once it is written (a fresh run writes it after the trackers open)."""
        if self._arm_report_logged or not self.trackers:
            return
        params = arm_report_params(self.info.run_dir)
        if params is not None:
            self._arm_report_logged = True
            self.log_params(params)

    def log_metrics(self, metrics: Mapping[str, Any], step: int, step_name: str = "iteration") -> None:
        """Scalars at ``step`` (counted in ``step_name``); None (an undefined metric) is left out."""
        if not self.trackers:
            return
        self.log_arm_report()
        values = _numbers(metrics)
        if values:
            self._each("logging metrics", lambda t: t.log_metrics(values, int(step), step_name))

    def log_files(self, folder: str, name: str) -> None:
        self._each("attaching files", lambda t: t.log_files(folder, name))

    def finish(self, how: str) -> None:
        """End every tracker run ``how`` (the dropped ones too, as far as they can) and record it in the run
        directory."""
        if not self.trackers and not self.dropped:
            return
        self.log_arm_report()
        for tracker in self.trackers + self.dropped:
            try:
                tracker.finish(how)
            except Exception as e:  # noqa: BLE001
                logger.warning(f"{tracker.name}: ending the tracker run failed ({_one_line(e)})")
                continue
            self.state[tracker.name]["state"] = how
        self.trackers, self.dropped = [], []
        _write_state(self.info.run_dir, self.state)


_ACTIVE: List[RunTracking] = []


def active_run() -> Optional[RunTracking]:
    """The tracking of the run this process trains (its main process, inside :func:`tracked_run`), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def tracked_run(settings: Optional[Mapping], info: RunInfo) -> Iterator[Optional[RunTracking]]:
    """Track one training run in this (its main) process: open its tracker runs, make them the
    :func:`active_run` and end them with the run: finished, failed (it raised) or killed (stopped for a requeue,
    or interrupted). Without an enabled tracker it does nothing."""
    if not enabled_trackers(settings):
        yield None
        return
    from ..utils.preemption import Preempted

    tracking = RunTracking.open(settings, info)
    _ACTIVE.append(tracking)
    how = FAILED
    try:
        yield tracking
        how = FINISHED
    except (Preempted, KeyboardInterrupt):
        how = KILLED
        raise
    finally:
        _ACTIVE.remove(tracking)
        tracking.finish(how)


def mark_unfinished(run_dir: str, how: str = FAILED) -> List[str]:
    """From the launching process, after a run ended abnormally: end the tracker runs recorded in ``run_dir``
    that are still marked running (their process was killed before it could end them). Returns the trackers
    marked."""
    state = read_state(run_dir)
    marked = []
    for name, entry in state.items():
        if not isinstance(entry, dict) or entry.get("state") != RUNNING:
            continue
        try:
            type(make_tracker(name, {})).reopen(entry, how, run_dir)
        except Exception as e:  # noqa: BLE001
            logger.warning(f"{name}: could not mark tracker run {entry.get('id')} {how} ({_one_line(e)})")
            continue
        entry["state"] = how
        marked.append(name)
    if marked:
        _write_state(run_dir, state)
    return marked


def attach_report(settings: Optional[Mapping], experiment_dir: str, report_dir: str) -> List[str]:
    """Attach an experiment's report (its tables and figures, every file of ``report_dir``) to a tracker run of its
    own, ``report``, in the experiment's group; writing the report again updates the same tracker run. Returns the
    trackers it went to; a failure is logged, never raised."""
    if not enabled_trackers(settings) or not os.path.isdir(report_dir):
        return []
    info = RunInfo(name="report", run_dir=report_dir, experiment_dir=experiment_dir, stage="report")
    try:
        tracking = RunTracking.open(settings, info)
        names = [t.name for t in tracking.trackers]
        tracking.log_files(report_dir, "report")
        names = [t.name for t in tracking.trackers if t.name in names]
        tracking.finish(FINISHED)
    except Exception as e:  # noqa: BLE001 -- the report is written; the trackers only get a copy
        logger.warning(f"the report was not attached to the trackers ({_one_line(e)})")
        return []
    return names
