"""COCO evaluation: a pycocotools-identical, faster drop-in for detectron2's COCOEvaluator, and the
image bootstrap of the report (:mod:`condinit_det.evaluation.bootstrap`, which needs no detectron2). The evaluator
is loaded on first use, so that the report reads the bootstrap without importing detectron2."""

from ..utils.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {"coco_evaluation": ("FastCOCOEvaluator", "to_fast_evaluator")})
