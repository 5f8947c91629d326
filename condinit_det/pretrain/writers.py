"""What a run writes while it trains: the log, ``metrics.json`` (detectron2's JSON lines) and TensorBoard scalars.

``metrics.json`` holds one line every ``train.log_period`` optimizer steps::

    {"iteration": 120, "epoch": 1.5, "total_loss": 1.93, "lr": 0.0004, "time": 0.21, "data_time": 0.01}

``total_loss`` is the median of the last 20 step losses, as detectron2's writer reports it; the
report reads training-loss curves of both stages from these lines. On resume, lines past the
checkpoint's step are dropped so that the curve has no duplicates.
"""
from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import statistics
import sys
import time
from typing import Deque, Dict, Optional

__all__ = ["LOGGER_NAME", "MetricsWriter", "StepTimer", "setup_logging", "truncate_metrics"]

LOGGER_NAME = "condinit_det.pretrain"
METRICS_FILENAME = "metrics.json"
_FORMAT = "[%(asctime)s %(name)s]: %(message)s"


def setup_logging(run_dir: Optional[str], *, rank: int) -> logging.Logger:
    """Log to the console and ``<run_dir>/log.txt`` on the main process; warnings only elsewhere."""
    logger = logging.getLogger(LOGGER_NAME)
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    fmt = logging.Formatter(_FORMAT, datefmt="%m/%d %H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if run_dir and rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(run_dir, "log.txt"), mode="a")
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


def truncate_metrics(run_dir: str, *, max_iteration: int) -> None:
    """Drop ``metrics.json`` lines past ``max_iteration`` (what a killed run wrote after its last checkpoint)."""
    path = os.path.join(run_dir, METRICS_FILENAME)
    if not os.path.isfile(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line).get("iteration", 0) <= max_iteration:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except json.JSONDecodeError:
                continue  # a line torn by a kill
    from ..utils.fileio import atomic_write

    atomic_write(path, "".join(kept))


class MetricsWriter:
    """Appends ``metrics.json`` lines and TensorBoard scalars (main process only)."""

    def __init__(self, run_dir: str, *, purge_step: Optional[int] = None):
        from torch.utils.tensorboard import SummaryWriter

        self.path = os.path.join(run_dir, METRICS_FILENAME)
        self._file = open(self.path, "a")
        self._tb = SummaryWriter(log_dir=run_dir, purge_step=purge_step)

    def write(self, step: int, scalars: Dict[str, float], *, json_line: bool = True) -> None:
        """One ``metrics.json`` line (unless ``json_line`` is False) and TensorBoard scalars ``train/<key>`` or ``<key>``."""
        for key, value in scalars.items():
            self._tb.add_scalar(key if "/" in key else f"train/{key}", value, step)
        if json_line:
            self._file.write(json.dumps({"iteration": int(step), **scalars}, sort_keys=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()
        self._tb.close()


class StepTimer:
    """Step losses (median over the last 20, like detectron2) and times, for logs and the ETA."""

    def __init__(self, total_steps: int, window: int = 20):
        self.total_steps = int(total_steps)
        self.losses: Deque[float] = collections.deque(maxlen=window)
        self.times: Deque[float] = collections.deque(maxlen=window)
        self.data_times: Deque[float] = collections.deque(maxlen=window)
        self._start = time.perf_counter()
        self._steps_timed = 0

    def update(self, loss: float, step_time: float, data_time: float) -> None:
        self.losses.append(float(loss))
        self.times.append(float(step_time))
        self.data_times.append(float(data_time))
        self._steps_timed += 1

    @property
    def median_loss(self) -> float:
        return statistics.median(self.losses) if self.losses else float("nan")

    @property
    def step_time(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def data_time(self) -> float:
        return statistics.median(self.data_times) if self.data_times else float("nan")

    def eta(self, step: int) -> str:
        """Remaining steps at the mean wall time per step so far (evaluation included)."""
        if self._steps_timed == 0:
            return "?"
        per_step = (time.perf_counter() - self._start) / self._steps_timed
        return str(datetime.timedelta(seconds=int(per_step * max(self.total_steps - step, 0))))
