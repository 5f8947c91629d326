"""The pretraining stage (:class:`PretrainStage`, ``condinit-pretrain``): timm classifiers trained from their arm's
random init; each arm's final weights are the backbone a detector fine-tunes from (docs/pretraining.md).
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
