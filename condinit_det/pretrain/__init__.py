"""The pretraining stage: classification pretraining of timm models with an attention-initialization arm
(``condinit-pretrain``, ``tools/pretrain_net.py``).

The arm acts where the paper applies it: on the randomly initialized classifier, before the first step. Each arm's
``model_final.safetensors`` is then the backbone a detector fine-tunes from. Modules:

- :mod:`.stage`: :class:`PretrainStage`, the stage the launcher runs (:mod:`condinit_det.launch`);
- :mod:`.config`: lazy configs, node defaults, learning rate, the arm and the run identity;
- :mod:`.data`: timm datasets, transforms, mixup, and (seed, epoch)-determined samplers;
- :mod:`.model`: ``timm.create_model`` + the arm; unknown model names get suggestions;
- :mod:`.trainer`: one run (setup, resume, the epochs, evaluation records, checkpoints, the final export);
- :mod:`.step`: one optimizer step of the recipe (optimizer, scheduler, loss scaling, mixup, clipping, EMA);
- :mod:`.evaluate`: top-1 / top-5 with distributed gathering in dataset order;
- :mod:`.conditioning`: kappa of the attention Jacobian along training (``condinit_analysis``, period in epochs);
- :mod:`.checkpoint`: epoch checkpoints (fvcore) and the final weights.

This package does not import :mod:`condinit_det.engine` or :mod:`condinit_det.modeling`.
"""
from .checkpoint import FINAL_FILENAME, FINAL_FORMAT
from .config import DEFAULTS, load_config, node, resolve_lr
from .evaluate import EvalResult, evaluate
from .model import build_armed_model, check_model_name, create_classifier
from .stage import PretrainStage
from .trainer import PREDICTIONS_FILENAME, PretrainRun, evaluate_checkpoint, run_finished, train_run

__all__ = [
    "DEFAULTS",
    "EvalResult",
    "FINAL_FILENAME",
    "FINAL_FORMAT",
    "PREDICTIONS_FILENAME",
    "PretrainRun",
    "PretrainStage",
    "build_armed_model",
    "check_model_name",
    "create_classifier",
    "evaluate",
    "evaluate_checkpoint",
    "load_config",
    "node",
    "resolve_lr",
    "run_finished",
    "train_run",
]
