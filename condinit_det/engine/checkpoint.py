"""Checkpoints of a run: written atomically, read with clear errors, pretraining checkpoints converted.

:class:`RunCheckpointer` is detectron2's ``DetectionCheckpointer`` with three changes:

- ``save`` writes ``<name>.pth`` and the ``last_checkpoint`` tag through a temporary file in the
  same folder and ``os.replace``, so a run killed while saving leaves the previous checkpoint and
  tag intact (no half-written file is ever read by ``--resume``);
- a truncated or corrupt checkpoint is reported as one ``ValueError`` naming the file;
- a checkpoint written by ``tools/pretrain_net.py`` (``{"format": "condinit_det.pretrain/v1",
  "model": <timm state dict>, "arm": ..., ...}``) is converted to the model's detectron2 backbone
  on load (:func:`condinit_det.modeling.convert.convert_timm_checkpoint`); its metadata is kept
  on ``pretrain_meta``.
"""
import logging
import os
import zipfile
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from detectron2.checkpoint import DetectionCheckpointer

from ..fileio import atomic_torch_save, atomic_write

__all__ = ["PRETRAIN_FORMAT", "RunCheckpointer", "check_checkpoint_file", "pretrain_checkpoint_file",
           "read_pretrain_meta"]

logger = logging.getLogger(__name__)

PRETRAIN_FORMAT = "condinit_det.pretrain/v1"
PRETRAIN_FINAL = "model_final.pth"
_LAST = "last_checkpoint"


def pretrain_checkpoint_file(path: str) -> str:
    """A pretraining run directory -> its ``model_final.pth``; a file path is returned unchanged."""
    if os.path.isdir(path):
        final = os.path.join(path, PRETRAIN_FINAL)
        if not os.path.isfile(final):
            raise FileNotFoundError(
                f"{path} is a directory without {PRETRAIN_FINAL}: point train.init_checkpoint at a finished "
                "tools/pretrain_net.py run directory or at a checkpoint file")
        return final
    return path


def check_checkpoint_file(path: str) -> None:
    """Raise ValueError when ``path`` (a torch zip checkpoint) is truncated or not a checkpoint."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.endswith((".pkl", ".pyth")):
        return
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"checkpoint {path} is truncated or not a PyTorch checkpoint ({os.path.getsize(path)} bytes, no zip "
            "directory): it was probably cut short by a crash; delete it (and fix last_checkpoint) or start afresh")


def read_pretrain_meta(path: str) -> Optional[dict]:
    """Metadata (everything but the weights) of a pretraining checkpoint, or None for other files."""
    if not os.path.isfile(path) or path.endswith((".pkl", ".pyth")):
        return None
    check_checkpoint_file(path)
    data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(data, dict) or data.get("format") != PRETRAIN_FORMAT:
        return None
    return {k: v for k, v in data.items() if k != "model"}


class RunCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` with atomic saves, clear load errors and pretraining-checkpoint conversion."""

    def __init__(self, model, save_dir="", **kwargs):
        super().__init__(model, save_dir, **kwargs)
        self.pretrain_meta: Optional[dict] = None

    def save(self, name: str, **kwargs) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(kwargs)
        basename = f"{name}.pth"
        path = os.path.join(self.save_dir, basename)
        self.logger.info(f"Saving checkpoint to {path}")
        atomic_torch_save(data, path)
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write(os.path.join(self.save_dir, _LAST), last_filename_basename, fsync=True)

    def _torch_load(self, f):
        check_checkpoint_file(f)
        try:
            return super()._torch_load(f)
        except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as e:
            raise ValueError(f"checkpoint {f} cannot be read ({type(e).__name__}: {e}); it is truncated or "
                             "corrupt") from None

    def _load_file(self, filename):
        loaded = super()._load_file(filename)
        if loaded.get("format") != PRETRAIN_FORMAT:
            return loaded
        from ..modeling.convert import convert_timm_checkpoint

        model = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        self.pretrain_meta = {k: v for k, v in loaded.items() if k != "model"}
        converted = convert_timm_checkpoint(loaded["model"], model, timm_model_name=loaded.get("timm_model"),
                                            timm_model_kwargs=loaded.get("model_kwargs"))
        logger.info(f"Converted {filename} (timm {loaded.get('timm_model')}, arm {loaded.get('arm')}, "
                    f"seed {loaded.get('seed')}) to {len(converted)} detectron2 parameters")
        return {"model": converted, "__author__": "condinit_det.pretrain", "matching_heuristics": False}
