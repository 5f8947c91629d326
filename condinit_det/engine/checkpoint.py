"""Checkpoints of a detection run: :class:`RunCheckpointer` writes atomically with the run's metadata (arm, seed,
stage) in every file and ``model_final.safetensors`` to share, reads weights-only (``.pkl`` with ``trust_pickle``)
and converts a pretraining checkpoint (:data:`PRETRAIN_FORMAT`) to the model's backbone. Detail: docs/checkpoints.md.
"""

import os
import zipfile
from typing import Optional, Set

from detectron2.checkpoint import DetectionCheckpointer

from ..utils.checkpoint_io import (
    DETECTION_FORMAT,
    PICKLE_SUFFIXES,
    PRETRAIN_FORMAT,
    SAFETENSORS_SUFFIX,
    check_loadable,
    final_weights_file,
    load_checkpoint,
    read_safetensors_metadata,
    refuse_pickle,
    save_safetensors,
    torch_load,
)
from ..utils.fileio import atomic_torch_save, atomic_write

__all__ = ["RunCheckpointer", "check_checkpoint_file", "pretrain_checkpoint_file", "read_pretrain_meta"]

_FINAL = "model_final"


def pretrain_checkpoint_file(path: str) -> str:
    """A pretraining run directory -> its ``model_final.safetensors`` (else ``model_final.pth``); a file
    path is returned unchanged."""
    if os.path.isdir(path):
        final = final_weights_file(path, _FINAL)
        if final is None:
            raise FileNotFoundError(
                f"{path} is a directory without {_FINAL}.pth (or {_FINAL}{SAFETENSORS_SUFFIX}): point "
                "train.init_checkpoint at a finished tools/pretrain_net.py run directory or at a checkpoint file"
            )
        return final
    return path


def check_checkpoint_file(path: str) -> None:
    """Raise ValueError when ``path`` (a torch zip or safetensors checkpoint) is truncated or not a checkpoint."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.endswith(SAFETENSORS_SUFFIX):
        read_safetensors_metadata(path)
    elif not path.endswith(PICKLE_SUFFIXES + (".pyth",)) and not zipfile.is_zipfile(path):
        raise ValueError(
            f"checkpoint {path} is truncated or not a PyTorch checkpoint ({os.path.getsize(path)} bytes, no zip "
            "directory): it was probably cut short by a crash; delete it (and fix last_checkpoint) or start afresh"
        )


def read_pretrain_meta(path: str, *, trust_pickle: bool = False) -> Optional[dict]:
    """Metadata (everything but the weights) of a pretraining checkpoint, or None for other files; a ``.pth`` that
    needs full unpickling raises ``UnsafeCheckpointError`` unless ``trust_pickle``."""
    if not os.path.isfile(path) or path.endswith(PICKLE_SUFFIXES + (".pyth",)):
        return None
    if path.endswith(SAFETENSORS_SUFFIX):
        data = read_safetensors_metadata(path)
    else:
        data = torch_load(path, trust_pickle=trust_pickle, mmap=True)
    if not isinstance(data, dict) or data.get("format") != PRETRAIN_FORMAT:
        return None
    return {k: v for k, v in data.items() if k != "model"}


class RunCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` with atomic saves, safe loads and pretraining-checkpoint conversion; ``metadata``
    (arm, seed, stage, ...) goes into every checkpoint; ``trust_pickle`` loads files that need full unpickling."""

    def __init__(self, model, save_dir="", *, trust_pickle: bool = False, metadata: Optional[dict] = None, **kwargs):
        super().__init__(model, save_dir, **kwargs)
        self.trust_pickle = bool(trust_pickle)
        self.metadata = dict(metadata or {})
        self.pretrain_meta: Optional[dict] = None
        self.loaded: Set[str] = set()  # the names of the model's parameters and buffers the last load set

    def save(self, name: str, **kwargs) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {**self.metadata, "model": self.model.state_dict()}
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(kwargs)
        basename = f"{name}.pth"
        path = os.path.join(self.save_dir, basename)
        if name == _FINAL:  # the weights to share, written before the .pth that marks the run finished
            extra = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))}
            metadata = {"format": DETECTION_FORMAT, **self.metadata, **extra}
            save_safetensors(data["model"], os.path.join(self.save_dir, _FINAL + SAFETENSORS_SUFFIX), metadata)
        self.logger.info(f"Saving checkpoint to {path}")
        atomic_torch_save(data, path)
        if name != "model_best":  # --resume continues from the newest periodic checkpoint
            self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write(os.path.join(self.save_dir, "last_checkpoint"), last_filename_basename, fsync=True)

    def _load_model(self, checkpoint):
        incompatible = super()._load_model(checkpoint)
        self.loaded = set(self.model.state_dict()) - set(incompatible.missing_keys)
        return incompatible

    def _torch_load(self, f):
        try:
            return torch_load(f, trust_pickle=self.trust_pickle)
        except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as e:
            raise ValueError(
                f"checkpoint {f} cannot be read ({type(e).__name__}: {e}); it is truncated or corrupt"
            ) from None

    def _load_file(self, filename):
        if filename.endswith(SAFETENSORS_SUFFIX):
            loaded = load_checkpoint(filename)
        else:
            refuse_pickle(filename, self.trust_pickle)
            if filename.endswith(".pyth"):  # detectron2 reads pycls files with its own torch.load
                check_loadable(filename, trust_pickle=self.trust_pickle)
            loaded = super()._load_file(filename)
        if loaded.get("format") != PRETRAIN_FORMAT:
            return loaded
        from ..modeling.convert import convert_timm_checkpoint

        self.pretrain_meta = {k: v for k, v in loaded.items() if k != "model"}
        converted = convert_timm_checkpoint(
            loaded["model"],
            self.model,
            timm_model_name=loaded.get("timm_model"),
            timm_model_kwargs=loaded.get("model_kwargs"),
        )
        self.logger.info(
            f"Converted {filename} (timm {loaded.get('timm_model')}, arm {loaded.get('arm')}, "
            f"seed {loaded.get('seed')}) to {len(converted)} detectron2 parameters"
        )
        return {"model": converted, "__author__": "condinit_det.pretrain", "matching_heuristics": False}
