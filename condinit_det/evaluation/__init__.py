"""COCO evaluation: a pycocotools-identical, faster drop-in for detectron2's COCOEvaluator, and the
image bootstrap of the report (:mod:`condinit_det.evaluation.bootstrap`, which needs no detectron2)."""
import importlib.util

__all__ = []
if importlib.util.find_spec("detectron2") is not None:
    from .coco_evaluation import FastCOCOEvaluator, to_fast_evaluator

    __all__ = ["FastCOCOEvaluator", "to_fast_evaluator"]
