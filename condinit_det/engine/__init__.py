"""Training glue: results file, AP hook, train/eval entry points.

``condinit_det.engine.results`` is importable without detectron2; the hooks and the
training functions (``condinit_det.engine.hooks``, ``condinit_det.engine.training``)
need it and are imported explicitly.
"""
from .results import RESULTS_FILENAME, ResultsFile

__all__ = ["ResultsFile", "RESULTS_FILENAME"]
