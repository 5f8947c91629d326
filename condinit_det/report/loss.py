"""Training loss from detectron2's ``metrics.json`` (both stages write it).

The file holds one JSON object per line; training lines carry ``"iteration"`` and
``"total_loss"`` (already detectron2's median over the last 20 iterations), evaluation lines do
not. A killed run can leave a truncated last line, and a resumed run appends after it, so the
iterations restart in mid-file: the later lines win (every earlier point at or after the
restart is dropped).
"""
from __future__ import annotations

import json
import math
import os
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["METRICS_FILENAME", "SMOOTHING_WINDOW", "read_training_loss", "smooth"]

METRICS_FILENAME = "metrics.json"
# Logged points in the trailing median, as detectron2's HistoryBuffer.median(20).
SMOOTHING_WINDOW = 20


def _parse(line: str) -> Optional[dict]:
    """The object on one line; a line garbled by a killed writer yields its last complete object."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
        start = line.find("{", 1)
        while start != -1:  # a truncated line followed by a complete one, without a newline between
            try:
                obj = json.loads(line[start:])
                break
            except json.JSONDecodeError:
                start = line.find("{", start + 1)
    return obj if isinstance(obj, dict) else None


def read_training_loss(path: str, key: str = "total_loss") -> Tuple[np.ndarray, np.ndarray]:
    """
    (iterations [N], loss [N]) of a ``metrics.json`` (a run directory or the file itself),
    increasing in iteration, resumed segments resolved. Empty arrays when nothing was logged.
    """
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    points: List[Tuple[int, float]] = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = _parse(line)
            if obj is None or key not in obj or "iteration" not in obj:
                continue
            try:
                it, value = int(obj["iteration"]), float(obj[key])
            except (TypeError, ValueError):
                continue
            if not math.isfinite(value):
                continue
            if points and it <= points[-1][0]:  # a resumed run: its points replace the old tail
                while points and points[-1][0] >= it:
                    points.pop()
            points.append((it, value))
    its = np.asarray([p[0] for p in points], dtype=np.int64)
    return its, np.asarray([p[1] for p in points], dtype=np.float64)


def smooth(values: np.ndarray, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """Trailing median over the last ``window`` points (fewer at the start)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.empty_like(v)
    head = min(window - 1, v.size)
    for i in range(head):
        out[i] = np.median(v[: i + 1])
    if v.size >= window:
        out[window - 1:] = np.median(np.lib.stride_tricks.sliding_window_view(v, window), axis=1)
    return out
