"""Reading checkpoints without running code from them (a ``.pkl`` or a ``.pth`` that needs full unpickling is refused
unless trusted, ``--trust-pickle``), and writing shareable safetensors weights: docs/checkpoints.md.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import zipfile
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from .fileio import atomic_write

if TYPE_CHECKING:
    import torch

__all__ = [
    "DETECTION_FORMAT",
    "PICKLE_SUFFIXES",
    "PRETRAIN_FORMAT",
    "SAFETENSORS_SUFFIX",
    "TRUST_FLAG",
    "UnsafeCheckpointError",
    "check_loadable",
    "final_weights_file",
    "load_checkpoint",
    "read_safetensors_metadata",
    "refuse_pickle",
    "save_safetensors",
    "torch_load",
]

logger = logging.getLogger(__name__)

TRUST_FLAG = "--trust-pickle"
# The format tags of the final weights the two stages write; a detection run fine-tunes from PRETRAIN_FORMAT files.
PRETRAIN_FORMAT = "condinit_det.pretrain/v1"
DETECTION_FORMAT = "condinit_det.detection/v1"
PICKLE_SUFFIXES = (".pkl", ".pickle")
SAFETENSORS_SUFFIX = ".safetensors"
_WHAT_TO_DO = (
    f"re-save its tensors as .safetensors or a weights-only .pth, or pass {TRUST_FLAG} "
    "(trust_pickle=True in Python) if you trust where the file comes from"
)


class UnsafeCheckpointError(ValueError):
    """A checkpoint whose loading would run code stored in it (one line: the file, why, what to do)."""


def refuse_pickle(path, trust_pickle: bool = False) -> None:
    """Raise :class:`UnsafeCheckpointError` for a pickle file (``.pkl``) unless ``trust_pickle``."""
    path = os.fspath(path)
    if path.split("?")[0].endswith(PICKLE_SUFFIXES) and not trust_pickle:
        raise UnsafeCheckpointError(
            f"checkpoint {path} is a pickle file: loading it runs any code stored in it, so it is not loaded "
            f"without {TRUST_FLAG}; {_WHAT_TO_DO}"
        )


def _why(error: Exception) -> str:
    # torch's message is a paragraph; keep the part that names what the file refers to.
    m = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    return f"it refers to {m.group(1)}" if m else str(error).strip().splitlines()[0]


def torch_load(path, *, trust_pickle: bool = False, mmap: bool = False) -> Any:
    """``torch.load`` to CPU with ``weights_only=True``; a file that needs full unpickling raises
    :class:`UnsafeCheckpointError`, or, with ``trust_pickle``, is loaded in full (with a warning)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if not trust_pickle:
            raise UnsafeCheckpointError(
                f"checkpoint {path} needs full unpickling ({_why(e)}), which can run code stored in it, so it "
                f"is not loaded; {_WHAT_TO_DO}"
            ) from None
        logger.warning(f"{path}: loading with full unpickling ({TRUST_FLAG}): {_why(e)}")
        return torch.load(path, map_location="cpu", weights_only=False)


def _encode(value: Any) -> str:
    # A string that is not itself JSON text is stored as it is (readable by any tool); all else as JSON.
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str, metadata: Optional[Mapping[str, Any]] = None
) -> None:
    """Write a state dict (tensors sharing storage as copies) and JSON-able ``metadata`` as safetensors, atomically."""
    import torch
    from safetensors.torch import save

    out = {key: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True) for key, t in tensors.items()}
    meta = {str(k): _encode(v) for k, v in (metadata or {}).items()}
    atomic_write(path, save(out, metadata=meta), fsync=True)


def _not_safetensors(path: str, error: Exception) -> ValueError:
    return ValueError(f"checkpoint {path} is truncated or not a safetensors file ({type(error).__name__}: {error})")


def read_safetensors_metadata(path: str) -> Dict[str, Any]:
    """The decoded metadata of a safetensors file (reads the header only)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise _not_safetensors(path, e) from None
    return {k: _decode(v) for k, v in meta.items()}


def load_checkpoint(path, *, trust_pickle: bool = False) -> Any:
    """Load any checkpoint file the project takes, without running code from it unless ``trust_pickle``;
    ``.safetensors`` gives ``{**metadata, "model": tensors on the CPU}``."""
    path = os.fspath(path)
    if path.endswith(SAFETENSORS_SUFFIX):
        from safetensors.torch import load_file

        meta = read_safetensors_metadata(path)
        try:
            return {**meta, "model": load_file(path, device="cpu")}
        except Exception as e:  # safetensors raises its own error types for a truncated file
            raise _not_safetensors(path, e) from None
    refuse_pickle(path, trust_pickle)
    if path.endswith(PICKLE_SUFFIXES):
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")  # trusted by the caller
    return torch_load(path, trust_pickle=trust_pickle)


def check_loadable(path, *, trust_pickle: bool = False) -> None:
    """Refuse, before anything runs, a file :func:`load_checkpoint` would refuse; cheap (header or mmap)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.endswith(SAFETENSORS_SUFFIX):
        read_safetensors_metadata(path)
        return
    refuse_pickle(path, trust_pickle)
    if not path.endswith(PICKLE_SUFFIXES) and not trust_pickle:
        try:
            torch_load(path, mmap=zipfile.is_zipfile(path))
        except UnsafeCheckpointError:
            raise
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            raise ValueError(
                f"checkpoint {path} cannot be read ({type(e).__name__}: {e}); it is truncated or corrupt"
            ) from None


def final_weights_file(run_dir: str, stem: str = "model_final") -> Optional[str]:
    """``<run_dir>/<stem>.safetensors`` if it exists, else ``<stem>.pth`` if it exists, else None."""
    for suffix in (SAFETENSORS_SUFFIX, ".pth"):
        path = os.path.join(run_dir, stem + suffix)
        if os.path.isfile(path):
            return path
    return None
