"""Classification pretraining of timm models with an attention-initialization arm (``tools/pretrain_net.py``).

The arm acts where the paper applies it: on the randomly initialized classifier, before the first
step. Each arm's ``model_final.pth`` is then the backbone a detector fine-tunes from. Modules:

- :mod:`.config`: lazy configs, node defaults, learning rate, the arm and the run identity;
- :mod:`.data`: timm datasets, transforms, mixup, and (seed, epoch)-determined samplers;
- :mod:`.model`: ``timm.create_model`` + the arm; unknown model names get suggestions;
- :mod:`.trainer`: the loop, per-epoch evaluation records, atomic checkpoints, the final export;
- :mod:`.evaluate`: top-1 / top-5 with distributed gathering in dataset order;
- :mod:`.checkpoint`, :mod:`.writers`: files of a run directory;
- :mod:`.launch`: the command line.

This package does not import :mod:`condinit_det.engine` or :mod:`condinit_det.modeling`.
"""
from .checkpoint import FINAL_FILENAME, FINAL_FORMAT, load_final
from .config import DEFAULTS, UsageError, load_config, node, resolve_lr
from .evaluate import EvalResult, evaluate
from .launch import Experiment, build_argument_parser, configure_run, execute, prepare_experiment, run_worker
from .model import build_armed_model, check_model_name, create_classifier, state_digest
from .trainer import PREDICTIONS_FILENAME, evaluate_checkpoint, run_finished, train_run

__all__ = [
    "DEFAULTS",
    "EvalResult",
    "Experiment",
    "FINAL_FILENAME",
    "FINAL_FORMAT",
    "PREDICTIONS_FILENAME",
    "UsageError",
    "build_argument_parser",
    "build_armed_model",
    "check_model_name",
    "configure_run",
    "create_classifier",
    "evaluate",
    "evaluate_checkpoint",
    "load_config",
    "load_final",
    "execute",
    "node",
    "prepare_experiment",
    "run_worker",
    "resolve_lr",
    "run_finished",
    "state_digest",
    "train_run",
]
