"""COCO evaluation: a pycocotools-identical, faster drop-in for detectron2's COCOEvaluator."""

from .coco_evaluation import FastCOCOEvaluator, fast_coco_eval_available, to_fast_evaluator

__all__ = ["FastCOCOEvaluator", "fast_coco_eval_available", "to_fast_evaluator"]
