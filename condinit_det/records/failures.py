"""Failure records: a run that raises is a result. Each training process leaves a note (:func:`note_failure`) that
the launching process turns into one ``"failed"`` record in ``results.json`` (:func:`record_failure`)."""

from __future__ import annotations

import glob
import json
import os
import time
from typing import List, Mapping, Optional

from ..utils.fileio import atomic_write, read_json
from .results import FAILED_KIND, ResultsFile

__all__ = [
    "describe_failure",
    "discard_notes",
    "failure_of",
    "failure_reason",
    "note_failure",
    "one_line",
    "record_failure",
]

_NOTE_PREFIX = "failure.rank"


def failure_reason(exc: BaseException) -> str:
    """``"diverged"`` for a ``FloatingPointError`` (a non-finite loss or prediction), ``"error"`` for the rest."""
    return "diverged" if isinstance(exc, FloatingPointError) else "error"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The exception as ``Type: message`` on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def note_failure(
    run_dir: str, exc: BaseException, *, rank: int, iteration: Optional[int] = None, epoch: Optional[int] = None
) -> bool:
    """Leave ``<run_dir>/failure.rank<k>.json`` for the launching process; the first note of a process wins (the
    innermost handler knows the iteration). Returns whether this call wrote it."""
    path = os.path.join(run_dir, f"{_NOTE_PREFIX}{rank}.json")
    if os.path.exists(path):
        return False
    note = {
        "reason": failure_reason(exc),
        "message": one_line(exc),
        "iteration": iteration,
        "epoch": epoch,
        "rank": int(rank),
        "time": time.time(),
    }
    atomic_write(path, json.dumps(note))
    return True


def discard_notes(run_dir: str) -> List[dict]:
    """Read and delete every process's failure note in ``run_dir``; returns the notes."""
    notes = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), f"{_NOTE_PREFIX}*.json"))):
        notes.append(read_json(path))  # written whole (atomic_write)
        os.remove(path)
    return notes


def record_failure(run_dir: str, exc: BaseException, metadata: Mapping) -> dict:
    """Add the ``"failed"`` record of a run that raised, from its processes' notes (a divergence first, else the
    earliest: the others usually fail because that one stopped), or from ``exc`` without a note (a kill); returns it."""
    notes = discard_notes(run_dir)
    diverged = [n for n in notes if n.get("reason") == "diverged"]
    note = (
        min(diverged or notes, key=lambda n: n.get("time", 0.0))
        if notes
        else {"reason": failure_reason(exc), "message": one_line(exc)}
    )
    iteration = note.get("iteration")
    if iteration is None:  # no process knew it: the last one the run recorded
        iteration = max((r["iteration"] for r in ResultsFile(run_dir).records()), default=0)
    record = {
        "kind": FAILED_KIND,
        "reason": note["reason"],
        "iteration": int(iteration),
        "message": note["message"],
        **dict(metadata),
    }
    if note.get("epoch") is not None:
        record["epoch"] = int(note["epoch"])
    ResultsFile(run_dir).add(record)
    return record


def failure_of(run_dir: str) -> Optional[dict]:
    """The run's ``"failed"`` record, or None (no results, or the run did not fail)."""
    failed = ResultsFile(run_dir).records(FAILED_KIND)
    return failed[-1] if failed else None


def describe_failure(record: Mapping) -> str:
    """``"diverged at iteration 4"`` / ``"failed: RuntimeError: ..."``."""
    if record.get("reason") == "diverged":
        return f"diverged at iteration {record.get('iteration')}"
    return f"failed: {record.get('message')}"
