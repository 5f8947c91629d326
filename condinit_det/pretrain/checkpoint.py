"""Checkpoints of a pretraining run: one per epoch, written atomically, and the final weights to fine-tune from.

Files in a run directory::

    checkpoint_epoch0007.pth   training state after 7 epochs (the newest ``keep`` are kept)
    model_final.pth            the weights detection fine-tunes from (:data:`FINAL_FORMAT`)

A file is written to a temporary name in the same folder, flushed to disk and renamed, so a
crash (even SIGKILL) leaves either the previous checkpoint or the new one, never a torn file.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
from typing import Any, Dict, List, Optional

import torch

__all__ = [
    "CHECKPOINT_PATTERN",
    "FINAL_FILENAME",
    "FINAL_FORMAT",
    "atomic_torch_save",
    "checkpoint_path",
    "find_checkpoints",
    "last_checkpoint",
    "load_final",
    "prune_checkpoints",
    "remove_stale_temp_files",
]

FINAL_FILENAME = "model_final.pth"
FINAL_FORMAT = "condinit_det.pretrain/v1"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint_epoch(\d{4,})\.pth$")
_TEMP_SUFFIX = ".pth.tmp"


def checkpoint_path(run_dir: str, epoch: int) -> str:
    """``<run_dir>/checkpoint_epoch<NNNN>.pth``: the state after ``epoch`` completed epochs."""
    return os.path.join(run_dir, f"checkpoint_epoch{int(epoch):04d}.pth")


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` to a temp file in the same folder, fsync, ``os.replace`` (then fsync the folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def remove_stale_temp_files(run_dir: str) -> List[str]:
    """Delete temp files of writes that never finished (a killed run); returns their paths."""
    stale = glob.glob(os.path.join(run_dir, f".*{_TEMP_SUFFIX}"))
    for path in stale:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    return stale


def find_checkpoints(run_dir: str) -> Dict[int, str]:
    """epoch -> path of every ``checkpoint_epochNNNN.pth`` in ``run_dir``."""
    found = {}
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            m = CHECKPOINT_PATTERN.match(name)
            if m:
                found[int(m.group(1))] = os.path.join(run_dir, name)
    return found


def last_checkpoint(run_dir: str) -> Optional[str]:
    """Path of the checkpoint with the most completed epochs, or None."""
    found = find_checkpoints(run_dir)
    return found[max(found)] if found else None


def prune_checkpoints(run_dir: str, keep: int) -> None:
    """Keep the ``keep`` newest epoch checkpoints (at least one)."""
    found = find_checkpoints(run_dir)
    for epoch in sorted(found)[: max(len(found) - max(int(keep), 1), 0)]:
        try:
            os.remove(found[epoch])
        except FileNotFoundError:
            pass


def load_final(path: str) -> Dict[str, Any]:
    """Read a ``model_final.pth`` written by :mod:`condinit_det.pretrain`; checks its format tag."""
    data = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(data, dict) or data.get("format") != FINAL_FORMAT or "model" not in data:
        raise ValueError(f"{path} is not a {FINAL_FORMAT} file (a dict with 'format' and 'model')")
    return data
