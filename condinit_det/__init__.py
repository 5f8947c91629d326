"""condinit-det: default, mimetic and conditioned attention initialization for detectron2 detectors.

The init library (:mod:`condinit_det.init`) is pure PyTorch; its names are importable from here. Importing this
package also registers the project's backbones and meta-architectures with detectron2's registries, once
``detectron2.modeling`` is imported (at once when it already is): importing the package itself loads neither torch
nor detectron2, so the commands answer ``--help`` at once.
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from .utils.lazy import lazy_exports

__version__ = "0.1.0"
__all__, __getattr__ = lazy_exports(
    __name__,
    {"init": ("ARMS", "AttentionSite", "InitReport", "apply_init", "find_attention", "register_attention_adapter")},
)

_DETECTRON2_MODELING = "detectron2.modeling"
_FOCAL_LOSS = "fvcore.nn.focal_loss"  # scripts its losses with torch.jit at import, which recent torch deprecates


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning)
        yield


def _register_with_detectron2() -> None:
    with _quiet():
        importlib.import_module(".modeling", __name__)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Quiets fvcore's deprecated torch.jit call while it is imported, and registers the project's detectron2 parts
    right after ``detectron2.modeling`` is executed (whoever imports them first)."""

    def __init__(self):
        self.pending = {name for name in (_FOCAL_LOSS, _DETECTRON2_MODELING) if name not in sys.modules}

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            with _quiet():
                execute(module)
            if name == _DETECTRON2_MODELING:
                _register_with_detectron2()

        spec.loader.exec_module = exec_module
        return spec


if _DETECTRON2_MODELING in sys.modules:
    _register_with_detectron2()
elif importlib.util.find_spec("detectron2") is not None:
    sys.meta_path.insert(0, _AfterImport())
