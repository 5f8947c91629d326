"""The run's results file: ``<output_dir>/results.json``, shared by both training stages and the report.

Layout::

    {"version": 1, "records": [record, ...]}

A record is a JSON object with at least ``"kind"`` (str) and ``"iteration"`` (int, number of
completed optimizer steps). Records written by a training loop also carry ``"arm"``, ``"seed"``
(the training seed), ``"lr_scale"`` (multiplier of the config's base learning rate, 1.0 unless
scanned) and ``"config"``. Kinds:

- ``"ap"`` (detection, :mod:`condinit_det.engine.hooks`): ``"bbox"`` and ``"segm"``, each
  ``{"AP", "AP50", "AP75", "APs", "APm", "APl"}`` in percent, or ``None`` for a task not evaluated.
  A run's final ``"ap"`` record also names the evaluator's saved predictions (``"predictions"``,
  relative to the run directory) and the dataset's COCO json (``"ground_truth"``), which the
  report resamples for confidence intervals. Every ``"ap"`` record names its evaluation's per-image
  COCO matching (``"per_image"``, :mod:`condinit_det.records.per_image`).
- ``"eval"``: an ``"ap"``-shaped record of ``tools/train_net.py --eval-only``, with ``"checkpoint"``.
- ``"cls"`` (classification pretraining, :mod:`condinit_det.pretrain`): ``"epoch"`` (completed
  epochs), ``"top1"``, ``"top5"`` (percent, on the evaluation set), ``"train_loss"`` (mean over the
  epoch), ``"eval_loss"``, ``"lr"``; ``"ema"`` (the EMA weights' ``top1``, ``top5``, ``eval_loss``)
  for recipes with an EMA; ``"per_image"``: the evaluation's per-image correctness
  (:mod:`condinit_det.records.per_image`).
- ``"cls_eval"``: a ``"cls"``-shaped record of ``tools/pretrain_net.py --eval-only``, with ``"checkpoint"``.
- ``"conditioning"`` (:mod:`condinit_det.analysis.hooks`): one attention site's kappa(J), with ``"site"``.
- ``"failed"`` (:mod:`condinit_det.records.failures`): the run stopped on an exception. ``"reason"`` is
  ``"diverged"`` (a non-finite loss or prediction: a result about the arm at that learning rate) or
  ``"error"`` (anything else: out of memory, a crashed data worker, a full disk); ``"iteration"`` is
  the number of optimizer steps completed when it stopped (pretraining also gives ``"epoch"``, the
  epoch it was in, 0-based); ``"message"`` is the exception in one line. The traceback is in the
  run's log.

A record is identified by
``(kind, iteration, site)`` (``site`` is ``None`` when absent): adding a record with an
existing key replaces the old one, so a resumed run that re-evaluates an iteration never
duplicates a point and never loses earlier ones.

Non-finite floats (NaN, inf; e.g. ``APs`` on a dataset without small objects) are stored
as ``null`` so that the file is strict JSON.
"""
import json
import math
import os
import threading
from typing import Any, Dict, Iterable, List, Optional

from ..utils.fileio import atomic_write, move_aside

__all__ = ["FAILED_KIND", "ResultsFile", "RESULTS_FILENAME"]

RESULTS_FILENAME = "results.json"
FAILED_KIND = "failed"
_FORMAT_VERSION = 1


def _is_main_process() -> bool:
    # Plain torch.distributed: this module is also used by the report tools, which must not
    # need a distributed setup or detectron2.
    import torch.distributed as dist

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
    return (record["kind"], record["iteration"], record.get("site"))


def _sort_key(record: Dict[str, Any]):
    site = record.get("site")
    return (record["iteration"], record["kind"], "" if site is None else str(site))


def _validate(record: Any) -> Dict[str, Any]:
    if not isinstance(record, dict):
        raise TypeError(f"A results record must be a dict, got {type(record).__name__}.")
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"A results record needs a non-empty string 'kind'; got {kind!r}.")
    iteration = record.get("iteration")
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(
            f"A results record needs an integer 'iteration' >= 0; got {iteration!r} "
            f"(kind {kind!r})."
        )
    return record


class ResultsFile:
    """
    Reader/writer of ``<output_dir>/results.json``.

    Every :meth:`add` re-reads the file and rewrites it atomically (temporary file in the
    same directory, then ``os.replace``), so several writers in one process (the AP hook, an
    analysis hook) and a crash at any point never leave a truncated file. Only the main
    process of a distributed job writes; on other ranks :meth:`add` does nothing.
    """

    _lock = threading.Lock()

    def __init__(self, output_dir: str):
        if not output_dir:
            raise ValueError("ResultsFile needs an output directory; got an empty path.")
        self.output_dir = os.fspath(output_dir)
        self.path = os.path.join(self.output_dir, RESULTS_FILENAME)

    def __repr__(self):
        return f"ResultsFile({self.path!r})"

    def exists(self) -> bool:
        return os.path.isfile(self.path)

    def _load(self) -> List[Dict[str, Any]]:
        if not self.exists():
            return []
        with open(self.path, "r") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path} is not valid JSON ({e}); refusing to overwrite it.") from None
        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            raise ValueError(
                f"{self.path} is not a results file: expected an object with a 'records' list."
            )
        return [_validate(r) for r in data["records"]]

    def _write(self, records: List[Dict[str, Any]]) -> None:
        payload = {"version": _FORMAT_VERSION, "records": sorted(records, key=_sort_key)}
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
        return sorted(recs, key=_sort_key)

    def remove(self, kind: str) -> List[Dict[str, Any]]:
        """Drop every record of ``kind`` (one rewrite); returns the dropped records."""
        if not _is_main_process():
            return []
        with self._lock:
            records = self._load()
            dropped = [r for r in records if r["kind"] == kind]
            if dropped:
                self._write([r for r in records if r["kind"] != kind])
        return dropped

    def archive(self) -> Optional[str]:
        """
        Move an existing file aside to ``results.<n>.json.bak`` (a fresh, non-resumed run into
        an old directory must not mix its points with the old run's). Returns the new path.
        """
        return move_aside(self.path) if _is_main_process() else None
