"""condinit-det: default, mimetic and conditioned attention initialization for detectron2 detectors.

The init library (:mod:`condinit_det.init`) is pure PyTorch. When detectron2 is installed,
importing this package also registers the project's backbones and meta-architectures with
detectron2's registries.
"""
import importlib.util

from .init import ARMS, AttentionSite, InitReport, apply_init, find_attention, register_attention_adapter

__version__ = "0.1.0"
__all__ = ["ARMS", "AttentionSite", "InitReport", "apply_init", "find_attention", "register_attention_adapter"]

if importlib.util.find_spec("detectron2") is not None:
    import warnings

    with warnings.catch_warnings():
        # fvcore (imported by detectron2) scripts a loss with torch.jit, which recent torch marks deprecated.
        warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)
        from . import modeling  # noqa: F401  (registers backbones and meta-architectures)
