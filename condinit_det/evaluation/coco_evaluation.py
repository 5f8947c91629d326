"""
COCO evaluation with faster-coco-eval behind detectron2's ``COCOEvaluator`` interface.

``FastCOCOEvaluator`` is a drop-in replacement for ``detectron2.evaluation.COCOEvaluator``:
same constructor arguments (less ``use_fast_impl``, which picks detectron2's own C++ COCOeval,
not built here), same gathering to rank 0, same result dict
(``{"bbox": {"AP", "AP50", "AP75", "APs", "APm", "APl", "AP-<class>", ...}, "segm": {...}}``,
values in percent, NaN where COCO reports -1). Only the box and mask AP computation differs:
it runs faster-coco-eval's C++ ``COCOeval_faster``, which reproduces pycocotools' numbers.
Keypoint AP and box-proposal recall use detectron2's own code paths unchanged.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os

from detectron2.evaluation import COCOEvaluator
from detectron2.evaluation.coco_evaluation import _evaluate_predictions_on_coco
from detectron2.utils.file_io import PathManager
from faster_coco_eval import COCO as FastCOCO
from faster_coco_eval import COCOeval_faster
from pycocotools.cocoeval import COCOeval

from ..utils.fileio import atomic_write

__all__ = ["FastCOCOEvaluator", "to_fast_evaluator"]

logger = logging.getLogger(__name__)


def _evaluate_fast(coco_gt, coco_results, iou_type, *, max_dets_per_image, img_ids=None):
    """
    Box or mask COCOeval with faster-coco-eval; mirrors detectron2's
    ``_evaluate_predictions_on_coco`` for iou_type in {"bbox", "segm"}.

    COCOeval_faster summarizes AP at ``maxDets[-1]`` for any maxDets, which is what detectron2's
    ``COCOevalMaxDets`` does for a custom ``max_dets_per_image``, so no special case is needed.
    """
    assert len(coco_results) > 0
    if iou_type == "segm":
        # Without "bbox", loadRes takes the mask area as the instance area, so small/medium/large
        # are defined by mask area exactly as in detectron2. A shallow copy per record suffices
        # (loadRes and evaluate only set top-level keys): detectron2's deepcopy of every RLE
        # would cost about as much as the mask evaluation itself.
        coco_results = [{k: v for k, v in r.items() if k != "bbox"} for r in coco_results]
    coco_dt = coco_gt.loadRes(coco_results)
    coco_eval = COCOeval_faster(coco_gt, coco_dt, iou_type, print_function=logger.debug)
    coco_eval.params.maxDets = list(max_dets_per_image)
    if img_ids is not None:
        coco_eval.params.imgIds = img_ids
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return coco_eval


def _write_text_atomic(path: str, text: str) -> None:
    if "://" in path:  # remote storage handled by PathManager: no atomic rename there
        with PathManager.open(path, "w") as f:
            f.write(text)
        return
    atomic_write(path, text)


class FastCOCOEvaluator(COCOEvaluator):
    """
    detectron2 ``COCOEvaluator`` whose box and mask AP come from faster-coco-eval.

    Results are identical to ``COCOEvaluator(..., use_fast_impl=False)`` (pycocotools), only
    computed several times faster. Works in lazy configs:
    ``L(FastCOCOEvaluator)(dataset_name="${..test.dataset.names}")``.

    Args:
        dataset_name (str): a dataset registered in detectron2's DatasetCatalog / MetadataCatalog
            (with metadata ``json_file``, or convertible to COCO json given ``output_dir``).
        tasks (tuple[str] or None): subset of ("bbox", "segm", "keypoints"); None infers them
            from the predictions, as in ``COCOEvaluator``.
        distributed (bool): gather predictions from all ranks and evaluate on rank 0.
        output_dir (str or None): where to save ``instances_predictions.pth`` and
            ``coco_instances_results.json``.
        max_dets_per_image (int or None): detections per image used for AP (COCO default 100).
        kpt_oks_sigmas (tuple[float]): keypoint OKS sigmas (keypoints only).
        allow_cached_coco (bool): reuse a cached COCO-format json of a non-COCO dataset.
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
        if tasks is not None:
            unknown = set(tasks) - {"bbox", "segm", "keypoints"}
            if isinstance(tasks, str) or unknown:
                raise ValueError(
                    f"tasks must be None or a tuple drawn from ('bbox', 'segm', 'keypoints'), got {tasks!r}"
                )
        super().__init__(
            dataset_name,
            tasks=tasks,
            distributed=distributed,
            output_dir=output_dir,
            max_dets_per_image=max_dets_per_image,
            use_fast_impl=False,  # detectron2's own C++ COCOeval: not used here
            kpt_oks_sigmas=kpt_oks_sigmas,
            allow_cached_coco=allow_cached_coco,
        )
        # Re-index the annotation dicts pycocotools already parsed (no second json load).
        # self._coco_api stays the pycocotools index for detectron2's keypoint/proposal paths.
        self._fast_coco_api = FastCOCO(self._coco_api.dataset, print_function=logger.debug)

    def _eval_predictions(self, predictions, img_ids=None):
        coco_results = list(itertools.chain(*[x["instances"] for x in predictions]))
        tasks = self._tasks or self._tasks_from_predictions(coco_results)
        self._unmap_category_ids(coco_results)

        if self._output_dir:
            file_path = os.path.join(self._output_dir, "coco_instances_results.json")
            self._logger.info(f"Saving results to {file_path}")
            _write_text_atomic(file_path, json.dumps(coco_results))

        if not self._do_evaluation:
            self._logger.info("Annotations are not available for evaluation.")
            return

        self._logger.info(
            "Evaluating predictions with faster-coco-eval (pycocotools-identical) ..."
        )
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

    def _unmap_category_ids(self, coco_results):
        """Contiguous class index -> dataset category id, in place (as COCOEvaluator does)."""
        if not hasattr(self._metadata, "thing_dataset_id_to_contiguous_id"):
            return
        dataset_id_to_contiguous_id = self._metadata.thing_dataset_id_to_contiguous_id
        num_classes = len(dataset_id_to_contiguous_id)
        reverse_id_mapping = {v: k for k, v in dataset_id_to_contiguous_id.items()}
        if sorted(reverse_id_mapping) != list(range(num_classes)):
            raise ValueError(
                "thing_dataset_id_to_contiguous_id must map onto 0..num_classes-1, "
                f"got values {sorted(reverse_id_mapping)}"
            )
        for result in coco_results:
            category_id = result["category_id"]
            if not 0 <= category_id < num_classes:
                raise ValueError(
                    f"A prediction has class={category_id}, but the dataset only has {num_classes} "
                    f"classes and predicted class ids must be in [0, {num_classes - 1}]."
                )
            result["category_id"] = reverse_id_mapping[category_id]


def to_fast_evaluator(evaluator_cfg):
    """
    Turn a lazy ``L(COCOEvaluator)(...)`` config node (e.g. from detectron2's model zoo) into
    ``L(FastCOCOEvaluator)(...)`` with the same arguments (interpolations such as
    ``"${..test.dataset.names}"`` are kept unresolved); ``use_fast_impl`` is dropped.

    Example::

        cfg.dataloader.evaluator = to_fast_evaluator(cfg.dataloader.evaluator)
    """
    from detectron2.config.instantiate import locate
    from omegaconf import DictConfig

    target = (
        evaluator_cfg.get("_target_") if isinstance(evaluator_cfg, (dict, DictConfig)) else None
    )
    if isinstance(target, str):
        target = locate(target)
    if not (isinstance(target, type) and issubclass(target, COCOEvaluator)):
        raise ValueError(
            "to_fast_evaluator expects a LazyCall config node of COCOEvaluator (or a subclass), "
            f"got {evaluator_cfg!r}"
        )
    node = copy.deepcopy(evaluator_cfg)
    node["_target_"] = FastCOCOEvaluator
    node.pop("use_fast_impl", None)
    return node
