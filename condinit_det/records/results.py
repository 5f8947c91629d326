"""A run's ``results.json``: ``{"version": 1, "records": [...]}``, each record an object with at least ``"kind"`` and
``"iteration"`` (completed steps), identified by ``(kind, iteration, site)`` so that a resumed run replaces a point
instead of duplicating it; non-finite floats are null. The kinds: docs/training.md and docs/pretraining.md.
"""

import json
import math
import os
import threading
from typing import Any, Dict, Iterable, List, Optional

from ..utils.fileio import atomic_write, read_json

__all__ = ["FAILED_KIND", "METRICS_FILENAME", "ResultsFile", "RESULTS_FILENAME", "truncate_metrics"]

RESULTS_FILENAME = "results.json"
METRICS_FILENAME = "metrics.json"  # detectron2's JSONWriter: both stages' training scalars, one line per write
FAILED_KIND = "failed"


def truncate_metrics(run_dir: str, *, max_iteration: int, size: Optional[int] = None) -> int:
    """Cut ``metrics.json`` back to a checkpoint, replacing the file atomically; nothing happens without one.

    Args:
        max_iteration: the last ``"iteration"`` kept (what a killed run wrote after its checkpoint goes).
        size: the file's length in bytes when the checkpoint was written: when given, exactly those bytes' lines are
            kept (what was written after the checkpoint goes, whatever its iteration).

    Returns:
        The largest iteration kept (-1 for none): where the writers of a resumed run continue.
    """
    path = os.path.join(run_dir, METRICS_FILENAME)
    if not os.path.isfile(path):
        return -1
    with open(path, "rb") as f:
        lines = f.read()[:size].decode().splitlines()
    kept, last = [], -1
    for line in lines:
        try:
            iteration = json.loads(line).get("iteration", 0)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        if size is not None or iteration <= max_iteration:
            kept.append(line + "\n")
            last = max(last, iteration)
    atomic_write(path, "".join(kept))
    return last


def _is_main_process() -> bool:
    import torch.distributed as dist  # on use: the report reads results without torch

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _to_json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _to_json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return _to_json_safe(value.item())  # numpy / torch scalars
    return value


def _key(record: Dict[str, Any]):
    """A record's identity, (kind, iteration, site), in the file's order: by iteration, then kind, then site."""
    site = record.get("site")
    return (record["iteration"], record["kind"], "" if site is None else str(site))


def _validate(record: Any) -> Dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"A results record must be a dict, got {type(record).__name__}.")
    kind, iteration = record.get("kind"), record.get("iteration")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"A results record needs a non-empty string 'kind'; got {kind!r}.")
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"A results record needs an integer 'iteration' >= 0; got {iteration!r} (kind {kind!r}).")
    return record


class ResultsFile:
    """Reader/writer of ``<output_dir>/results.json``. Every write re-reads the file and replaces it atomically, so
    several writers in one process and a crash never leave a torn file; only the main process writes."""

    _lock = threading.Lock()

    def __init__(self, output_dir: str):
        self.output_dir = os.fspath(output_dir)
        self.path = os.path.join(self.output_dir, RESULTS_FILENAME)

    def exists(self) -> bool:
        return os.path.isfile(self.path)

    def _load(self) -> List[Dict[str, Any]]:
        data = read_json(self.path, "; it is left as it is: repair it or move it aside")
        if data is None:
            return []
        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            raise ValueError(f"{self.path} is not a results file: expected an object with a 'records' list.")
        try:
            return [_validate(r) for r in data["records"]]
        except ValueError as e:
            raise ValueError(f"{self.path} holds a bad record: {e}") from None

    def _write(self, records: List[Dict[str, Any]]) -> None:
        payload = {"version": 1, "records": sorted(records, key=_key)}
        atomic_write(self.path, json.dumps(payload, indent=1, allow_nan=False), fsync=True)

    def add(self, record: Dict[str, Any]) -> None:
        """Add one record, replacing any record with the same (kind, iteration, site)."""
        self.extend([record])

    def extend(self, records: Iterable[Dict[str, Any]]) -> None:
        """Add several records with a single rewrite of the file."""
        new = [_validate(_to_json_safe(dict(r))) for r in records]
        if not new or not _is_main_process():
            return
        with self._lock:
            merged = {_key(r): r for r in self._load()}
            for r in new:
                merged[_key(r)] = r
            self._write(list(merged.values()))

    def records(self, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        """Records (optionally only those of ``kind``), sorted by iteration."""
        recs = self._load()
        if kind is not None:
            recs = [r for r in recs if r["kind"] == kind]
        return sorted(recs, key=_key)

    def remove(self, kind: str) -> None:
        """Drop every record of ``kind`` (one rewrite, if any)."""
        if not _is_main_process():
            return
        with self._lock:
            records = self._load()
            kept = [r for r in records if r["kind"] != kind]
            if len(kept) < len(records):
                self._write(kept)
