"""Training hooks: COCO AP records (and the time the evaluations to come will take), the best and requeue
checkpoints, the history the metric writers smooth over."""

import logging
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from detectron2.engine import hooks
from detectron2.utils import comm
from detectron2.utils.events import EventWriter, JSONWriter, TensorboardXWriter

from condinit_det.records.per_image import detection_eval_path
from condinit_det.records.results import ResultsFile
from condinit_det.stage import DETECTION
from condinit_det.tracking.writers import TrackerWriter
from condinit_det.utils.fileio import read_json
from condinit_det.utils.logs import restore_scalar_history, scalar_history
from condinit_det.utils.preemption import PreemptionWatch

__all__ = [
    "AP_RECORD_METRICS",
    "APHook",
    "PreemptionHook",
    "WriterHistory",
    "ap_record",
    "build_best_checkpointer",
    "continue_writers",
]

AP_RECORD_METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")  # what an "ap" record holds per task
_TASKS = ("bbox", "segm")

logger = logging.getLogger(__name__)


def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def ap_record(
    results: Mapping[str, Mapping[str, float]],
    *,
    iteration: int,
    arm: Optional[str],
    seed: Optional[int],
    config: Optional[str],
    lr_scale: Optional[float] = 1.0,
    kind: str = "ap",
) -> Dict[str, Any]:
    """A results-file record of one COCO evaluation.

    Args:
        results: the COCO evaluator's output, ``{"bbox": {"AP": ..., "AP50": ...}, "segm": {...}}``, in percent.
        iteration: the training iterations completed when the model was evaluated.
        arm, seed, config, lr_scale: the run's, copied into the record (``config``: the config file, or None).
        kind: ``"ap"`` for the evaluations of a training run, ``"eval"`` for ``--eval-only``.

    Returns:
        ``{"kind", "stage": "detection", "iteration", "arm", "seed", "lr_scale", "config", "bbox", "segm"}``: each
        task maps :data:`AP_RECORD_METRICS` to percent, None for a metric the evaluator left undefined (NaN, e.g. APs
        without small objects); a task the evaluator did not run is None.
    """
    record: Dict[str, Any] = {"kind": kind, "stage": DETECTION.name, "iteration": int(iteration)}
    record.update(arm=arm, seed=seed, lr_scale=lr_scale, config=config)  # the run's
    for task in _TASKS:
        metrics = results.get(task)
        record[task] = {m: _finite_or_none(metrics.get(m)) for m in AP_RECORD_METRICS} if metrics else None
    return record


class APHook(hooks.EvalHook):
    """detectron2's ``EvalHook`` (every ``eval_period`` iterations and after the last; the metrics go to the event
    storage as ``bbox/AP``, ``segm/AP50``, ...) that also adds an ``"ap"`` record (:func:`ap_record`) to the run's
    results file in the main process.

    Args:
        eval_period: evaluate every this many iterations (0: only after the last one).
        eval_function: no-argument callable returning the evaluator's metrics, as :func:`ap_record` takes them.
        results_file: where the records go.
        metadata: ``arm``, ``seed``, ``lr_scale`` and ``config``, copied into every record.
        predictions_file: where the evaluator writes its COCO-format predictions, or None. After every evaluation
            that wrote it, its predictions are matched with ``ground_truth`` once (boxes and masks) and the matches
            saved as ``<run>/per_image/ap_iter<k>.npz`` (:mod:`condinit_det.records.per_image`), named in the
            record as ``"per_image"``: the report's two-level intervals resample them. A failure to save them is
            logged, never raised. The final record also names the predictions (``"predictions"``, relative to the
            run directory) and ``"ground_truth"``, so that the report can resample evaluation images.
        ground_truth: the evaluation dataset's COCO json, or None.

    :attr:`last_results` holds the last evaluation's metrics; :meth:`seconds_left` the time the evaluations to come
    will take (for the ETA).
    """

    def __init__(
        self,
        eval_period: int,
        eval_function: Callable[[], Mapping[str, Any]],
        *,
        results_file: ResultsFile,
        metadata: Mapping[str, Any],
        predictions_file: Optional[str] = None,
        ground_truth: Optional[str] = None,
    ):
        self._evaluate = eval_function
        self._results_file = results_file
        self._metadata = dict(metadata)
        self._predictions_file = predictions_file
        self._ground_truth = ground_truth
        self._durations = []  # seconds of each evaluation so far
        self.last_results: Mapping[str, Any] = {}  # of the last evaluation
        super().__init__(eval_period, self._evaluate_and_record)

    def seconds_left(self, iteration: int) -> float:
        """Seconds of the evaluations after storage iteration ``iteration``, at the mean of those made so far."""
        done, end, period = iteration + 1, self.trainer.max_iter, self._period
        count = ((end - 1) // period - done // period if period > 0 else 0) + (done < end)
        return count * sum(self._durations) / len(self._durations) if self._durations else 0.0

    def after_train(self):
        # detectron2 calls after_train on the way out of an exception too: evaluate only a training that ran to its end
        if self.trainer.iter >= self.trainer.max_iter:
            super().after_train()

    def _evaluate_and_record(self):
        started, clock = time.time(), time.perf_counter()
        results = self._evaluate()
        self._durations.append(time.perf_counter() - clock)
        self.last_results = results or {}
        if results and comm.is_main_process():
            # Completed iterations: trainer.iter is the last finished one in after_step, max_iter in after_train.
            iteration = min(self.trainer.iter + 1, self.trainer.max_iter)
            record = ap_record(results, iteration=iteration, **self._metadata)
            pred = self._predictions_file
            if pred and self._ground_truth and os.path.isfile(pred) and os.path.getmtime(pred) >= started - 1:
                self._save_matches(record)
                if iteration == self.trainer.max_iter:
                    record["predictions"] = os.path.relpath(pred, self._results_file.output_dir)
                    record["ground_truth"] = os.path.abspath(self._ground_truth)
            self._results_file.add(record)
            logger.info(
                f"Iteration {iteration}: box AP {_fmt_ap(record['bbox'])}, mask AP {_fmt_ap(record['segm'])} "
                f"(arm {self._metadata['arm']}) recorded in {self._results_file.path}"
            )
        return results

    def _save_matches(self, record: Dict[str, Any]) -> None:
        """Match this evaluation's predictions once, save them and name the file in ``record`` (a failure is
        logged)."""
        from condinit_det.evaluation.bootstrap import match_predictions, save_matches

        iteration, tasks = record["iteration"], [t for t in _TASKS if record[t] is not None]
        path = detection_eval_path(self._results_file.output_dir, iteration)
        started = time.perf_counter()
        try:
            ground_truth, predictions = read_json(self._ground_truth), read_json(self._predictions_file)
            if ground_truth is None or predictions is None:
                raise FileNotFoundError(f"{self._ground_truth} or {self._predictions_file} does not exist")
            matches = match_predictions(ground_truth, predictions, iou_types=tasks)
            size = save_matches(path, matches)
        except Exception as e:  # the run must not stop for a report aid
            logger.warning(
                f"Iteration {iteration}: per-image matches not saved ({type(e).__name__}: {e}); the report "
                "falls back to intervals without this evaluation's images."
            )
            return
        logger.info(
            f"Iteration {iteration}: per-image matches ({', '.join(matches)}) saved to {path} "
            f"({size / 1024:.0f} KiB, {time.perf_counter() - started:.2f} s)"
        )
        record["per_image"] = os.path.relpath(path, self._results_file.output_dir)


def _fmt_ap(task: Optional[Mapping[str, Any]]) -> str:
    value = (task or {}).get("AP")
    return "n/a" if value is None else f"{value:.1f}"


def build_best_checkpointer(
    eval_period: int, checkpointer, *, results_file: ResultsFile, val_metric: str = "bbox/AP"
) -> hooks.BestCheckpointer:
    """detectron2's ``BestCheckpointer`` keeping ``model_best.pth`` by ``val_metric`` (NaN is never "best"), with the
    best so far of a resumed run restored from its results file. Register it after the :class:`APHook`."""
    best = hooks.BestCheckpointer(eval_period, checkpointer, val_metric, mode="max")
    task, _, metric = val_metric.partition("/")
    for r in results_file.records("ap"):
        value = (r.get(task) or {}).get(metric)
        if value is not None and (best.best_metric is None or value > best.best_metric):
            best.best_metric, best.best_iter = float(value), r["iteration"]
    return best


class PreemptionHook(hooks.HookBase):
    """Inside a Slurm element: on the time-limit signal, every process agrees at the next step boundary,
    rank 0 writes a checkpoint of that iteration, and the run stops for its requeue
    (:class:`condinit_det.utils.preemption.PreemptionWatch`). Does nothing elsewhere."""

    def __init__(self, checkpointer, run_dir: str):
        self._checkpointer, self._run_dir = checkpointer, run_dir
        self._watch = PreemptionWatch()

    def after_step(self):
        if not self._watch.requested():
            return
        done = self.trainer.iter
        if comm.is_main_process():
            self._checkpointer.save(f"model_{done:07d}")
        comm.synchronize()
        self._watch.stop(self._run_dir, f"checkpoint model_{done:07d}.pth")


class WriterHistory(hooks.HookBase):
    """What the metric writers continue from, kept in the checkpoint so that a resumed run writes the
    ``metrics.json`` lines of the uninterrupted one: the last ``window`` values of every scalar (the writers smooth
    over the median of 20), the latest value of each in the storage's order (a write sends those not sent yet, in
    that order) and the length of ``metrics_file`` (:attr:`metrics_size`: what was written after the checkpoint is
    cut on resume). Resuming a checkpoint without them (an earlier version's) says in one line that the run does not
    continue as it would have."""

    def __init__(self, metrics_file: Optional[str] = None, *, window: int = 20):
        self._metrics_file, self._window, self._loaded = metrics_file, window, None

    @property
    def metrics_size(self) -> Optional[int]:
        """Bytes of ``metrics.json`` when the loaded checkpoint was written (None: not known)."""
        return (self._loaded or {}).get("metrics_size")

    def state_dict(self):
        storage, path = self.trainer.storage, self._metrics_file
        hints = storage.smoothing_hints()
        return {
            "history": scalar_history(storage, self._window),
            "latest": [(name, value, iteration, hints[name]) for name, (value, iteration) in storage.latest().items()],
            "metrics_size": (os.path.getsize(path) if os.path.isfile(path) else 0) if path else None,
        }

    def load_state_dict(self, state):
        self._loaded = state

    def before_train(self):
        if self._loaded is None and self.trainer.start_iter > 0:
            logger.warning(
                f"The checkpoint of iteration {self.trainer.start_iter} was written by an earlier version: training "
                "continues, but with another data order and other random draws than the interrupted run's"
            )
        storage, state = self.trainer.storage, self._loaded or {}
        # Not "time": detectron2's IterationTimer puts it from a process's fourth step on, so the interrupted run's
        # last one would be written as a line of its own.
        latest = {name: entry for name, *entry in state.get("latest", ()) if name != "time"}
        history = state.get("history", {})  # each latest value is the last of its history: put below
        restore_scalar_history(storage, {name: v[:-1] if name in latest else v for name, v in history.items()})
        for name, (value, iteration, hint) in latest.items():
            storage.put_scalar(name, value, smoothing_hint=hint, cur_iter=iteration)


def continue_writers(writers: Sequence[EventWriter], written: int) -> None:
    """Make a resumed run's fresh ``writers`` continue after iteration ``written``, the last one their
    predecessors wrote: a write sends the storage's values of later iterations only (detectron2's writers keep that
    mark in ``_last_write``, without a setter; the trackers' writers too)."""
    for writer in writers:
        if isinstance(writer, (JSONWriter, TensorboardXWriter, TrackerWriter)):
            writer._last_write = written
