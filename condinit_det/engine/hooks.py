"""Training hooks: COCO AP records (and the time the evaluations to come will take), the best and requeue
checkpoints."""

import logging
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional

from detectron2.engine import hooks
from detectron2.utils import comm

from condinit_det.records.per_image import detection_eval_path
from condinit_det.records.results import ResultsFile
from condinit_det.stage import DETECTION

__all__ = ["AP_RECORD_METRICS", "APHook", "ap_record", "build_best_checkpointer"]

AP_RECORD_METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")  # what an "ap" record holds per task
_METADATA_KEYS = ("arm", "seed", "lr_scale", "config")
_TASKS = ("bbox", "segm")

logger = logging.getLogger(__name__)


def _finite_or_none(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def ap_record(
    results: Mapping[str, Any],
    *,
    iteration: int,
    arm: Optional[str],
    seed: Optional[int],
    config: Optional[str],
    lr_scale: Optional[float] = 1.0,
    kind: str = "ap",
) -> Dict[str, Any]:
    """A results-file record of a COCO evaluator's output ``{"bbox": {"AP": ...}, "segm": {...}}`` (percent) after
    ``iteration`` completed iterations. A task not evaluated is ``None``, an undefined metric (NaN) too."""
    record: Dict[str, Any] = {
        "kind": kind,
        "stage": DETECTION.name,
        "iteration": int(iteration),
        "arm": arm,
        "seed": seed,
        "lr_scale": lr_scale,
        "config": config,
    }
    for task in _TASKS:
        task_results = results.get(task) if isinstance(results, Mapping) else None
        record[task] = (
            None if not task_results else {m: _finite_or_none(task_results.get(m)) for m in AP_RECORD_METRICS}
        )
    return record


class APHook(hooks.EvalHook):
    """detectron2's ``EvalHook`` that also adds an ``"ap"`` record (with ``metadata``: arm, seed, lr_scale, config)
    to ``results_file`` in the main process. When an evaluation wrote ``predictions_file`` (the evaluator's COCO
    predictions), its matches with ``ground_truth`` (the COCO json) are saved (``per_image``; a failure is logged)
    and the final record names both files."""

    def __init__(
        self,
        eval_period: int,
        eval_function: Callable[[], Optional[Mapping[str, Any]]],
        *,
        results_file: Optional[ResultsFile],
        metadata: Optional[Mapping[str, Any]] = None,
        predictions_file: Optional[str] = None,
        ground_truth: Optional[str] = None,
    ):
        self._evaluate = eval_function
        self._results_file = results_file
        self._metadata = {**{k: None for k in _METADATA_KEYS}, **(metadata or {})}
        self._predictions_file = predictions_file
        self._ground_truth = ground_truth
        self._ground_truth_data = None  # the COCO json, read once
        self._iteration = None
        self._durations = []  # seconds of each evaluation so far
        self.last_results: Mapping[str, Any] = {}  # of the last evaluation
        super().__init__(eval_period, self._evaluate_and_record)

    def seconds_left(self, iteration: int) -> float:
        """Seconds of the evaluations after storage iteration ``iteration``, at the mean of those made so far."""
        done, end, period = iteration + 1, self.trainer.max_iter, self._period
        count = ((end - 1) // period - done // period if period > 0 else 0) + (done < end)
        return count * sum(self._durations) / len(self._durations) if self._durations else 0.0

    def before_train(self):
        # A run killed during an evaluation resumes from the checkpoint saved just before it: that evaluation is owed.
        done = self.trainer.iter
        if not (self._period > 0 and 0 < done < self.trainer.max_iter and done % self._period == 0):
            return
        recorded = (
            comm.is_main_process()
            and self._results_file is not None
            and any(r["iteration"] == done for r in self._results_file.records("ap"))
        )
        if not comm.all_gather(recorded)[0]:
            # Stored as the uninterrupted run would have: by the last finished iteration.
            storage, self._iteration = self.trainer.storage, done
            storage.iter = done - 1
            try:
                self._do_eval()
            finally:
                storage.iter, self._iteration = done, None

    def after_train(self):
        # detectron2 calls after_train on the way out of an exception too: evaluate only a training that ran to its end
        if self.trainer.iter >= self.trainer.max_iter:
            super().after_train()

    def _evaluate_and_record(self):
        started, clock = time.time(), time.perf_counter()
        results = self._evaluate()
        self._durations.append(time.perf_counter() - clock)
        self.last_results = results or {}
        if results and self._results_file is not None and comm.is_main_process():
            # Completed iterations: trainer.iter is the last finished one in after_step, max_iter in after_train.
            iteration = self._iteration or min(self.trainer.iter + 1, self.trainer.max_iter)
            record = ap_record(results, iteration=iteration, **self._metadata)
            pred = self._predictions_file
            fresh = bool(pred and self._ground_truth and os.path.isfile(pred) and os.path.getmtime(pred) >= started - 1)
            if fresh and iteration == self.trainer.max_iter:
                record["predictions"] = os.path.relpath(pred, self._results_file.output_dir)
                record["ground_truth"] = os.path.abspath(self._ground_truth)
            if fresh:
                saved = self._save_matches(iteration, [t for t in _TASKS if record[t] is not None])
                if saved:
                    record["per_image"] = os.path.relpath(saved, self._results_file.output_dir)
            self._results_file.add(record)
            logger.info(
                f"Iteration {iteration}: box AP {_fmt_ap(record['bbox'])}, mask AP {_fmt_ap(record['segm'])} "
                f"(arm {self._metadata['arm']}) recorded in {self._results_file.path}"
            )
        return results

    def _save_matches(self, iteration: int, tasks) -> Optional[str]:
        """Match this evaluation's predictions once and save them; returns the file, or None (logged)."""
        from condinit_det.evaluation.bootstrap import load_json, match_predictions, save_matches

        path = detection_eval_path(self._results_file.output_dir, iteration)
        started = time.perf_counter()
        try:
            if self._ground_truth_data is None:
                self._ground_truth_data = load_json(self._ground_truth)
            matches = match_predictions(self._ground_truth_data, load_json(self._predictions_file), iou_types=tasks)
            size = save_matches(path, matches)
        except Exception as e:  # the run must not stop for a report aid
            logger.warning(
                f"Iteration {iteration}: per-image matches not saved ({type(e).__name__}: {e}); the report "
                "falls back to intervals without this evaluation's images."
            )
            return None
        logger.info(
            f"Iteration {iteration}: per-image matches ({', '.join(matches)}) saved to {path} "
            f"({size / 1024:.0f} KiB, {time.perf_counter() - started:.2f} s)"
        )
        return path


def _fmt_ap(task: Optional[Mapping[str, Any]]) -> str:
    value = (task or {}).get("AP")
    return "n/a" if value is None else f"{value:.1f}"


class _BestCheckpointer(hooks.BestCheckpointer):
    """Also considers the evaluation an :class:`APHook` owes at the start of a resumed run."""

    def before_train(self):
        latest = self.trainer.storage.latest().get(self._val_metric)
        if latest is not None and latest[1] == self.trainer.iter - 1:
            self._best_checking()


def build_best_checkpointer(
    eval_period: int, checkpointer, *, results_file: Optional[ResultsFile] = None, val_metric: str = "bbox/AP"
) -> hooks.BestCheckpointer:
    """detectron2's ``BestCheckpointer`` keeping ``model_best.pth`` by ``val_metric`` (NaN is never "best"), with the
    best so far of a resumed run restored from its results file. Register it after the :class:`APHook`."""
    best = _BestCheckpointer(eval_period, checkpointer, val_metric, mode="max")
    task, _, metric = val_metric.partition("/")
    for r in results_file.records("ap") if results_file is not None else []:
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
        self._watch = None

    def before_train(self):
        from condinit_det.utils.preemption import PreemptionWatch

        self._watch = PreemptionWatch()

    def after_step(self):
        if self._watch is None or not self._watch.active or not self._watch.requested():
            return
        done = self.trainer.iter
        if comm.is_main_process():
            self._checkpointer.save(f"model_{done:07d}")
        comm.synchronize()
        self._watch.stop(self._run_dir, f"checkpoint model_{done:07d}.pth")
