"""Helpers shared by the bench/ scripts: the machine and device lines printed above every table, markdown
tables, argument checks, and interleaved timing rounds.

Speed numbers are only meaningful as ratios against a baseline measured in the same run on the same machine;
the scripts print both.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
from typing import List, Optional, Sequence


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

    from tabulate import tabulate

    return tabulate(
        [[cell(v) for v in row] for row in rows],
        headers=[str(h) for h in headers],
        tablefmt="github",
        disable_numparse=True,
    )


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
        "cores": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
    }
    for name in packages:
        try:
            info[name] = getattr(__import__(name), "__version__", None) or importlib.metadata.version(name)
        except ImportError:
            info[name] = "not installed"
        except importlib.metadata.PackageNotFoundError:
            info[name] = "?"
    return info


def load_average() -> str:
    """The 1/5/15-minute load average as ``"a / b / c"``, or ``"n/a"`` where the system gives none."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def format_machine_info(info: dict) -> str:
    load = info.get("load_avg")
    load_s = "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("cpu", "cores", "load_avg"))
    return f"CPU: {info['cpu']} ({info['cores']} cores), load avg 1/5/15 min: {load_s}; {versions}"


def rotated(items: Sequence[object], shift: int) -> list:
    """``items`` rotated left by ``shift`` (modulo its length): round ``r`` of an interleaved benchmark
    starts with variant ``r``, so that no variant always runs right after the same neighbour."""
    items = list(items)
    if not items:
        return items
    k = shift % len(items)
    return items[k:] + items[:k]


def timed_round(variants: Sequence, index: int, steps: int) -> None:
    """Round ``index`` of an interleaved benchmark: each variant in turn, from variant ``index`` on (:func:`rotated`),
    runs ``steps`` steps (``variant.step()`` returns its seconds) into its ``times``, their sum into its
    ``round_times``."""
    for variant in rotated(variants, index):
        times = [variant.step() for _ in range(steps)]
        variant.times += times
        variant.round_times.append(sum(times))


def paired_ratio(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of ``candidate[r] / baseline[r]`` (times of the same round): the ratio least
    affected by slow drifts of the machine's speed."""
    if len(candidate) != len(baseline) or not candidate:
        raise ValueError(f"need equally many (>= 1) rounds, got {len(candidate)} and {len(baseline)}")
    if any(b <= 0 for b in baseline):
        raise ValueError(f"baseline round times must be positive, got {list(baseline)}")
    return median([c / b for c, b in zip(candidate, baseline)])


def parse_names(parser: argparse.ArgumentParser, flag: str, text: str, accepted: Sequence[str]) -> List[str]:
    """The comma-separated names given to ``flag``; one line and exit for an unknown, missing or repeated name."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in accepted]
    if unknown or not names:
        parser.error(f"{flag}: unknown {', '.join(unknown) or '(none given)'}; accepted: {', '.join(accepted)}")
    if len(set(names)) != len(names):
        parser.error(f"{flag} lists a name twice: {text}")
    return names


def check_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, minimums: dict) -> None:
    """One line and exit where an option (``minimums``: its ``args`` attribute -> its least value) is below it."""
    for name, minimum in minimums.items():
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}")


def _nvidia_driver() -> Optional[str]:
    """The NVIDIA driver version from ``nvidia-smi`` (first GPU), or None where it cannot be asked."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def device_info(device: str = "cuda") -> dict:
    """
    What a benchmark ran on. For ``"cuda"`` / ``"cuda:N"``: GPU name, compute capability, total memory
    (bytes), driver (``nvidia-smi``; None without it), CUDA runtime of the torch build, device count.
    For ``"cpu"``: the CPU model and usable cores. Always ``type``, ``name`` and ``torch``.
    """
    import torch

    kind = torch.device(device)
    info = {"type": kind.type, "torch": torch.__version__}
    if kind.type == "cuda":
        index = kind.index if kind.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(
            name=props.name,
            index=index,
            capability=f"{props.major}.{props.minor}",
            total_memory_bytes=int(props.total_memory),
            driver=_nvidia_driver(),
            cuda_runtime=torch.version.cuda,
            device_count=torch.cuda.device_count(),
        )
    else:
        info.update(name=_cpu_model(), cores=machine_info(packages=())["cores"])
    return info


def format_device_info(info: dict) -> str:
    if info["type"] == "cuda":
        gib = info["total_memory_bytes"] / 2**30
        return (
            f"device: {info['name']} (cuda:{info['index']}, capability {info['capability']}, {gib:.1f} GiB), "
            f"driver {info['driver'] or 'unknown'}, CUDA runtime {info['cuda_runtime']}, torch {info['torch']}"
        )
    return f"device: CPU {info['name']} ({info['cores']} cores), torch {info['torch']}"
