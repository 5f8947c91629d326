"""
Small helpers shared by the bench/ scripts.

- ``time_call(fn, setup=..., warmup=..., repeats=...)``: wall-clock seconds of ``fn``, one
  value per repeat, each preceded by an untimed ``setup()``; ``median`` of them.
- ``format_table(headers, rows)``: a GitHub-markdown table (pastes into BENCHMARKS.md).
- ``speedup(baseline_s, candidate_s)``: baseline / candidate (> 1 means the candidate is faster).
- ``machine_info()`` / ``format_machine_info()``: CPU model, core count, load average and library
  versions, printed at the top of every benchmark so numbers carry their context.

Speed numbers are only meaningful as ratios against a baseline measured in the same run on the
same machine; the scripts print both.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence

__all__ = [
    "time_call",
    "median",
    "speedup",
    "format_table",
    "machine_info",
    "format_machine_info",
]


def time_call(
    fn: Callable[[], object],
    *,
    setup: Optional[Callable[[], object]] = None,
    warmup: int = 0,
    repeats: int = 1,
) -> List[float]:
    """
    Run ``fn()`` ``warmup + repeats`` times and return the ``repeats`` wall-clock durations
    (seconds, ``time.perf_counter``). ``setup()`` runs untimed before every call; when it
    returns something other than None, ``fn`` receives it as its only argument.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(
            f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}"
        )
    times = []
    for i in range(warmup + repeats):
        state = setup() if setup is not None else None
        start = time.perf_counter()
        fn() if state is None else fn(state)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def speedup(baseline_s: float, candidate_s: float) -> float:
    """How many times faster the candidate is than the baseline."""
    return baseline_s / candidate_s if candidate_s > 0 else float("inf")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Markdown table; floats are printed with 3 significant decimals unless pre-formatted."""

    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-3 and v != 0 else f"{v:.3f}"
        return str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in body]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(packages: Sequence[str] = ("numpy", "torch")) -> dict:
    """CPU model, usable cores, 1/5/15-min load average, Python and package versions."""
    info = {
        "cpu": _cpu_model(),
        "cores": (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        ),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
    }
    for name in packages:
        try:
            info[name] = getattr(
                __import__(name), "__version__", None
            ) or importlib.metadata.version(name)
        except ImportError:
            info[name] = "not installed"
        except importlib.metadata.PackageNotFoundError:
            info[name] = "?"
    return info


def format_machine_info(info: dict) -> str:
    load = info.get("load_avg")
    load_s = "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)
    versions = ", ".join(
        f"{k} {v}" for k, v in info.items() if k not in ("cpu", "cores", "load_avg")
    )
    return f"CPU: {info['cpu']} ({info['cores']} cores), load avg 1/5/15 min: {load_s}; {versions}"
