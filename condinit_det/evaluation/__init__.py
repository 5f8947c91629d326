"""COCO evaluation: a pycocotools-identical, faster drop-in for detectron2's COCOEvaluator, and the
image bootstrap of the report (:mod:`condinit_det.evaluation.bootstrap`, which needs no detectron2). The evaluator
is loaded on first use, so that the report reads the bootstrap without importing detectron2."""
import importlib

__all__ = ["FastCOCOEvaluator", "to_fast_evaluator"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module(".coco_evaluation", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
