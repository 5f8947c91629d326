"""Checkpoints of a pretraining run, written atomically and loadable weights-only: ``checkpoint_epoch<NNNN>.pth``
(the training state after NNNN epochs) and the final weights, ``model_final.safetensors`` (to share) and
``model_final.pth`` (what detection fine-tunes from). Details: docs/checkpoints.md."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Optional

from fvcore.common.checkpoint import Checkpointer, PeriodicCheckpointer

from ..utils.checkpoint_io import load_checkpoint, save_safetensors
from ..utils.fileio import atomic_torch_save

FINAL_FILENAME = "model_final.pth"
FINAL_SAFETENSORS = "model_final.safetensors"
_CHECKPOINT = re.compile(r"^checkpoint_epoch(\d{4,})\.pth$")


def find_checkpoints(run_dir: str) -> Dict[int, str]:
    """epoch -> path of every ``checkpoint_epochNNNN.pth`` in ``run_dir``."""
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    return {int(m.group(1)): os.path.join(run_dir, m.group(0)) for m in map(_CHECKPOINT.match, names) if m}


def last_checkpoint(run_dir: str) -> Optional[str]:
    """Path of the checkpoint with the most completed epochs, or None."""
    found = find_checkpoints(run_dir)
    return found[max(found)] if found else None


class EpochCheckpointer(Checkpointer):
    """fvcore's ``Checkpointer`` for epoch checkpoints: ``save("checkpoint_epoch_<index>")`` (0-based) writes
    ``checkpoint_epoch<index + 1:04d>.pth`` atomically; the newest is the last; loads are weights-only by default."""

    def __init__(
        self, model, run_dir: str, *, trust_pickle: bool = False, save_to_disk: bool = True, **checkpointables
    ):
        super().__init__(model, run_dir, save_to_disk=save_to_disk, **checkpointables)
        self.trust_pickle = bool(trust_pickle)

    def save(self, name: str, **kwargs) -> None:
        data = {"model": self.model.state_dict()}
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(kwargs)
        epochs = int(name.rpartition("_")[2]) + 1  # PeriodicCheckpointer's name: checkpoint_epoch_<epoch index>
        path = os.path.join(self.save_dir, f"checkpoint_epoch{epochs:04d}.pth")
        self.logger.info(f"Saving checkpoint to {path}")
        atomic_torch_save(data, path)

    def get_checkpoint_file(self) -> str:
        return last_checkpoint(self.save_dir) or ""

    def _load_file(self, f: str):
        return load_checkpoint(f, trust_pickle=self.trust_pickle)


def periodic_checkpointer(checkpointer: EpochCheckpointer, *, keep: int) -> PeriodicCheckpointer:
    """fvcore's ``PeriodicCheckpointer`` saving every epoch and keeping the ``keep`` newest, an earlier run's too."""
    periodic = PeriodicCheckpointer(checkpointer, period=1, max_to_keep=keep, file_prefix="checkpoint_epoch")
    existing = [path for _, path in sorted(find_checkpoints(checkpointer.save_dir).items())]
    if checkpointer.save_to_disk:
        for path in existing[: max(len(existing) - keep, 0)]:
            os.remove(path)
        existing = existing[-keep:]
    periodic.recent_checkpoints = existing
    return periodic


def save_final(payload: Dict[str, Any], run_dir: str) -> None:
    """Write ``model_final.safetensors`` (``payload["model"]``, every other entry as metadata), then
    ``model_final.pth`` (the payload): the .pth is the commit point a finished run is known by."""
    meta = {k: v for k, v in payload.items() if k != "model"}
    save_safetensors(payload["model"], os.path.join(run_dir, FINAL_SAFETENSORS), meta)
    atomic_torch_save(payload, os.path.join(run_dir, FINAL_FILENAME))
