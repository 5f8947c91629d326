"""Atomic file writes (readers see the old file or the new one, never half of one), and JSON records read back."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from typing import Any, Union

__all__ = ["TEMP_SUFFIX", "atomic_torch_save", "atomic_write", "read_json", "remove_stale_temp_files"]

# Temp files are ".<name>.<random><TEMP_SUFFIX>" beside the file they replace.
TEMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def _replacing(path: str, *, binary: bool, fsync: bool):
    """Yield a file object writing a temp file in ``path``'s folder; on success it replaces ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb" if binary else "w", newline=None if binary else "") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp alone makes it owner-only
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if fsync:  # make the rename itself durable
        with contextlib.suppress(OSError):
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def atomic_write(path: str, data: Union[str, bytes], *, fsync: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temp file beside it and ``os.replace`` (creating the
    folder; mode 0644); ``fsync`` flushes the data and the rename to disk."""
    with _replacing(path, binary=isinstance(data, bytes), fsync=fsync) as f:
        f.write(data)


def read_json(path: str, advice: str = "") -> Any:
    """The JSON value in ``path``, or None without such a file; a file that is not JSON raises ValueError saying so,
    followed by ``advice`` (what the user can do, such as ``"; move it aside"``)."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}){advice}") from None


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save(obj)`` to ``path`` atomically and durably (checkpoints)."""
    import torch

    with _replacing(path, binary=True, fsync=True) as f:
        torch.save(obj, f)


def remove_stale_temp_files(folder: str) -> None:
    """Delete the temp files of writes a killed process never finished."""
    for path in glob.glob(os.path.join(folder, f".*{TEMP_SUFFIX}")):
        with contextlib.suppress(OSError):
            os.remove(path)
