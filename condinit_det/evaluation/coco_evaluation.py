"""detectron2's ``COCOEvaluator`` with box and mask AP from faster-coco-eval's ``COCOeval_faster``, which reproduces
pycocotools' numbers several times faster; keypoints and box proposals take detectron2's own paths."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os

from detectron2.config.instantiate import locate
from detectron2.evaluation import COCOEvaluator
from detectron2.evaluation.coco_evaluation import _evaluate_predictions_on_coco
from detectron2.utils.file_io import PathManager
from faster_coco_eval import COCO as FastCOCO
from faster_coco_eval import COCOeval_faster
from omegaconf import DictConfig
from pycocotools.cocoeval import COCOeval

from ..utils.fileio import atomic_write

__all__ = ["FastCOCOEvaluator", "to_fast_evaluator"]

logger = logging.getLogger(__name__)


def _evaluate_fast(coco_gt, coco_results, iou_type, *, max_dets_per_image, img_ids=None):
    """Box or mask COCOeval with faster-coco-eval, as detectron2's ``_evaluate_predictions_on_coco`` (AP at
    ``maxDets[-1]`` for any maxDets, as detectron2's ``COCOevalMaxDets``)."""
    if iou_type == "segm":
        # Without "bbox", loadRes takes the mask area as the instance area (small / medium / large as in
        # detectron2). A shallow copy suffices: detectron2's deepcopy of every RLE costs about the evaluation itself.
        coco_results = [{k: v for k, v in r.items() if k != "bbox"} for r in coco_results]
    coco_eval = COCOeval_faster(coco_gt, coco_gt.loadRes(coco_results), iou_type, print_function=logger.debug)
    coco_eval.params.maxDets = list(max_dets_per_image)
    if img_ids is not None:
        coco_eval.params.imgIds = img_ids
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return coco_eval


class FastCOCOEvaluator(COCOEvaluator):
    """``COCOEvaluator`` (its arguments less ``use_fast_impl``, its result dict) with the results of
    ``COCOEvaluator(..., use_fast_impl=False)``, several times faster. In a lazy config:
    ``L(FastCOCOEvaluator)(dataset_name="${..test.dataset.names}")``.
    """

    def __init__(
        self,
        dataset_name,
        tasks=None,
        distributed=True,
        output_dir=None,
        *,
        max_dets_per_image=None,
        kpt_oks_sigmas=(),
        allow_cached_coco=True,
    ):
        if tasks is not None and (isinstance(tasks, str) or set(tasks) - {"bbox", "segm", "keypoints"}):
            raise ValueError(f"tasks must be None or a tuple drawn from ('bbox', 'segm', 'keypoints'), got {tasks!r}")
        super().__init__(
            dataset_name,
            tasks=tasks,
            distributed=distributed,
            output_dir=output_dir,
            max_dets_per_image=max_dets_per_image,
            use_fast_impl=False,
            kpt_oks_sigmas=kpt_oks_sigmas,
            allow_cached_coco=allow_cached_coco,
        )
        # Re-index the annotations pycocotools already parsed (no second json load); self._coco_api stays the
        # pycocotools index for detectron2's keypoint and proposal paths.
        self._fast_coco_api = FastCOCO(self._coco_api.dataset, print_function=logger.debug)

    def _eval_predictions(self, predictions, img_ids=None):
        coco_results = list(itertools.chain(*[x["instances"] for x in predictions]))
        tasks = self._tasks or self._tasks_from_predictions(coco_results)
        if hasattr(self._metadata, "thing_dataset_id_to_contiguous_id"):  # class index -> category id, in place
            reverse = {v: k for k, v in self._metadata.thing_dataset_id_to_contiguous_id.items()}
            for result in coco_results:
                if result["category_id"] not in reverse:
                    raise ValueError(
                        f"A prediction has class={result['category_id']}, but the dataset only has {len(reverse)} "
                        f"classes and predicted class ids must be in [0, {len(reverse) - 1}]."
                    )
                result["category_id"] = reverse[result["category_id"]]
        if self._output_dir:
            file_path = os.path.join(self._output_dir, "coco_instances_results.json")
            self._logger.info(f"Saving results to {file_path}")
            if "://" in file_path:  # remote storage through PathManager: no atomic rename there
                with PathManager.open(file_path, "w") as f:
                    f.write(json.dumps(coco_results))
            else:
                atomic_write(file_path, json.dumps(coco_results))
        if not self._do_evaluation:
            self._logger.info("Annotations are not available for evaluation.")
            return
        self._logger.info("Evaluating predictions with faster-coco-eval (pycocotools-identical) ...")
        for task in sorted(tasks):
            if not coco_results:
                coco_eval = None  # the COCO API does not handle empty results
            elif task == "keypoints":
                coco_eval = _evaluate_predictions_on_coco(
                    self._coco_api,
                    coco_results,
                    task,
                    kpt_oks_sigmas=self._kpt_oks_sigmas,
                    cocoeval_fn=COCOeval,
                    img_ids=img_ids,
                    max_dets_per_image=self._max_dets_per_image,
                )
            else:
                coco_eval = _evaluate_fast(
                    self._fast_coco_api,
                    coco_results,
                    task,
                    max_dets_per_image=self._max_dets_per_image,
                    img_ids=img_ids,
                )
            self._results[task] = self._derive_coco_results(
                coco_eval, task, class_names=self._metadata.get("thing_classes")
            )


def to_fast_evaluator(evaluator_cfg):
    """A lazy ``L(COCOEvaluator)(...)`` node as ``L(FastCOCOEvaluator)(...)`` with the same arguments (unresolved;
    ``use_fast_impl`` dropped): ``cfg.dataloader.evaluator = to_fast_evaluator(cfg.dataloader.evaluator)``."""
    target = evaluator_cfg.get("_target_") if isinstance(evaluator_cfg, (dict, DictConfig)) else None
    if isinstance(target, str):
        target = locate(target)
    if not (isinstance(target, type) and issubclass(target, COCOEvaluator)):
        raise ValueError(
            f"to_fast_evaluator expects a LazyCall config node of COCOEvaluator (or a subclass), got {evaluator_cfg!r}"
        )
    node = copy.deepcopy(evaluator_cfg)
    node["_target_"] = FastCOCOEvaluator
    node.pop("use_fast_impl", None)
    return node
