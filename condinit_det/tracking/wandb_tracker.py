"""Weights & Biases: one W&B run per training run, offline by default.

In offline mode (the default) a run's W&B files go to ``<run_dir>/wandb/offline-run-<time>-<id>/``, ready for
``wandb sync``; no account and no network are needed. A resumed run opens the same run id again (one more
``offline-run-*`` folder of the same run: ``wandb sync`` uploads them in order, as one run). Metrics are logged
against their own step, ``iteration`` or ``epoch`` (``define_metric``), so that a resumed run continues its curves
wherever W&B's own row counter starts.
"""
from __future__ import annotations

import glob
import os
import secrets
import string
import time
from datetime import datetime
from typing import Any, Dict, Mapping, Optional

from .base import FAILED, FINISHED, KILLED, RunInfo, Tracker, attachable_files

__all__ = ["WandbTracker"]

_EXIT_CODES = {FINISHED: 0, FAILED: 1, KILLED: 1}


def _new_id() -> str:
    """A fresh W&B run id (W&B's form: 8 lowercase letters and digits)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _wait_for_a_new_second(run_dir: str, run_id: str) -> None:
    """W&B names a session's folder after the second it starts in (local time): a second session of the same run
    starting within that second would share the first one's folder and write over its log (a run killed and marked
    failed at once). Wait for the next second then."""
    folder = glob.escape(os.path.join(run_dir, "wandb"))
    while True:
        now = time.time()
        stamp = datetime.fromtimestamp(now).strftime("%Y%m%d_%H%M%S")
        if not glob.glob(os.path.join(folder, f"*run-{stamp}-{run_id}")):
            return
        time.sleep(1.0 - now % 1.0 + 0.01)


def _init(wandb, entry: Mapping[str, Any], run_dir: str, **extra):
    _wait_for_a_new_second(run_dir, entry["id"])
    return wandb.init(project=entry["project"], entity=entry.get("entity"), group=entry.get("group"),
                      job_type=entry.get("job_type"), name=entry.get("name"), id=entry["id"], resume="allow",
                      dir=run_dir, mode=entry.get("mode", "offline"), reinit="create_new",
                      settings=wandb.Settings(console="off"), **extra)


class WandbTracker(Tracker):
    """A W&B run (settings: ``project``, ``entity``, ``mode``, ``group``)."""

    name = "wandb"

    def __init__(self, settings: Mapping[str, Any]):
        super().__init__(settings)
        self.run = None
        self._defined = set()

    def start(self, info: RunInfo, previous: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        import wandb

        settings = self.settings
        entry = {"project": settings["project"], "entity": settings.get("entity"),
                 "group": settings.get("group") or info.group, "job_type": info.stage, "name": info.name,
                 "mode": settings.get("mode", "offline")}
        same = previous and all(previous.get(k) == entry[k] for k in ("project", "entity", "mode"))
        entry["id"] = previous["id"] if same and previous.get("id") else _new_id()
        tags = [info.stage] + ([info.arm] if info.arm else [])
        self.run = _init(wandb, entry, info.run_dir, tags=tags, config=dict(info.params()))
        return entry

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def _define(self, key: str, step_name: str) -> None:
        if step_name not in self._defined:
            self.run.define_metric(step_name)
            self._defined.add(step_name)
        if key not in self._defined:
            self.run.define_metric(key, step_metric=step_name)
            self._defined.add(key)

    def log_metrics(self, metrics: Mapping[str, float], step: int, step_name: str) -> None:
        row = {}
        for key, value in metrics.items():
            if key not in ("iteration", "epoch"):  # a step of its own (pretraining logs its fractional epoch)
                self._define(key, step_name)
            row[key] = value
        row[step_name] = step
        self.run.log(row)

    def log_files(self, folder: str, name: str) -> None:
        import wandb

        images = {}
        for rel in attachable_files(folder):
            path = os.path.join(folder, rel)
            self.run.save(path, base_path=folder, policy="now")
            if rel.lower().endswith(".png"):
                images[f"{name}/{os.path.splitext(rel)[0]}"] = wandb.Image(path)
        if images:
            self.run.log(images)

    def finish(self, how: str) -> None:
        if how == KILLED:
            self.run.mark_preempting()
        self.run.finish(exit_code=_EXIT_CODES[how])
        self.run = None

    @classmethod
    def reopen(cls, entry: Mapping[str, Any], how: str, run_dir: str) -> None:
        import wandb

        run = _init(wandb, entry, run_dir)
        if how == KILLED:
            run.mark_preempting()
        run.finish(exit_code=_EXIT_CODES[how])
