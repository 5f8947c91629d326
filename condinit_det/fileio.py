"""Atomic file writes: readers see the old file or the new one, never half of one."""
from __future__ import annotations

import os
import tempfile
from typing import Union

__all__ = ["atomic_write"]


def atomic_write(path: str, data: Union[str, bytes], *, fsync: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temp file in the same folder and ``os.replace``.

    The folder is created if needed; the file gets the usual 0644 permissions (``mkstemp`` alone
    makes it owner-only). ``fsync`` flushes the data to disk before the rename.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        binary = isinstance(data, bytes)
        with os.fdopen(fd, "wb" if binary else "w", newline=None if binary else "") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
