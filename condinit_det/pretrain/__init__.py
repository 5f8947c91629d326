"""The pretraining stage: classification pretraining of timm models with an arm (``condinit-pretrain``).

The arm acts on the randomly initialized classifier before its first step; each arm's ``model_final.safetensors`` is
the backbone a detector fine-tunes from. :mod:`.stage` (the launcher's :class:`PretrainStage`), :mod:`.config`,
:mod:`.data`, :mod:`.model`, :mod:`.trainer` (one run), :mod:`.step` (one optimizer step), :mod:`.evaluate`,
:mod:`.conditioning` (kappa along training), :mod:`.checkpoint`. No import of :mod:`condinit_det.engine`.
"""

from .config import load_config, node, resolve_lr
from .model import build_armed_model, create_classifier
from .stage import PretrainStage
from .trainer import PretrainRun, train_run

__all__ = [
    "PretrainRun",
    "PretrainStage",
    "build_armed_model",
    "create_classifier",
    "load_config",
    "node",
    "resolve_lr",
    "train_run",
]
