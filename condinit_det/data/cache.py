"""Datasets generated on first use into a folder, atomically, for every embedded dataset.

A dataset ``<version>`` lives in ``$CONDINIT_DATA/<version>`` (default ``~/.cache/condinit_det/<version>``,
:func:`cache_root`) unless a root is passed. A generated dataset root holds its files and ``manifest.json``
(the generator's parameters, written last). It is built in a temporary sibling folder
``.<root name>.tmp-<host>-<pid>-*`` and renamed into place, so an interrupted run never leaves half a
dataset, concurrent first uses are safe (the loser of the rename keeps the winner's copy), and a temporary
folder whose process is gone is removed by the next generation on that host.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Optional

import cv2
import numpy as np

__all__ = ["EMBEDDED_PREFIX", "cache_root", "generate_atomically", "read_manifest", "same_generator", "write_png"]

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_KEYS = ("version", "seed", "num_images", "spec", "classes")
# Embedded datasets are named "embedded:<name>" where a path is expected (e.g. a pretraining data.root).
EMBEDDED_PREFIX = "embedded:"


def cache_root(version: str) -> Path:
    """``$CONDINIT_DATA/<version>`` if the variable is set (and not empty), else ``~/.cache/condinit_det/<version>``."""
    base = os.environ.get("CONDINIT_DATA")
    return Path(base or "~/.cache/condinit_det").expanduser() / version


def write_png(path: Path, img: np.ndarray) -> None:
    """Write an HxW or HxWx3 (BGR) uint8 image as PNG; fast compression, and the same bytes for the same pixels."""
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise RuntimeError(f"OpenCV failed to encode {path}")
    Path(path).write_bytes(buf.tobytes())


def read_manifest(root: Path) -> Optional[dict]:
    """The root's manifest, or None when it has none (or an unreadable one)."""
    try:
        with open(Path(root) / MANIFEST) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def same_generator(found: dict, expected: dict) -> bool:
    """Whether a manifest records the expected generator parameters (JSON round trip: tuples are lists)."""
    return all(json.loads(json.dumps(found.get(k))) == json.loads(json.dumps(expected.get(k))) for k in _KEYS)


def _temp_prefix(root: Path) -> str:
    return f".{root.name}.tmp-"


def _remove_abandoned_temp_dirs(root: Path) -> None:
    """Delete temp folders left by a generator on this host whose process is gone (e.g. killed)."""
    host = socket.gethostname()
    if not root.parent.is_dir():
        return
    for path in root.parent.glob(_temp_prefix(root) + "*"):
        parts = path.name[len(_temp_prefix(root)):].split("-")
        if len(parts) < 3 or parts[0] != host or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by someone else


def generate_atomically(root: Path, expected: dict, write: Callable[[Path], dict], *, replace_stale: bool) -> Path:
    """Make sure ``root`` holds the dataset ``expected`` (its manifest) describes; return ``root``.

    write: fills a temporary folder with the dataset and returns extra manifest entries.
    replace_stale: replace a dataset made with other parameters, or a folder without a manifest
    (both expected only in a cache); otherwise such a root raises a ValueError saying what was found.
    """
    version = expected["version"]

    def complete() -> bool:
        found = read_manifest(root)
        if found is not None and same_generator(found, expected):
            return True
        if root.exists() and not replace_stale:
            if found is not None:
                raise ValueError(
                    f"{root} holds a dataset generated with other parameters "
                    f"(seed={found.get('seed')}, num_images={found.get('num_images')}); expected seed="
                    f"{expected['seed']}, num_images={expected['num_images']}. Delete it or pass another root.")
            if any(root.iterdir()):
                raise ValueError(f"{root} is not a complete {version} dataset (it holds files but no {MANIFEST}); "
                                 "delete it or pass another root")
        return False

    if complete():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_temp_dirs(root)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_temp_prefix(root)}{socket.gethostname()}-{os.getpid()}-", dir=root.parent))
    try:
        extra = write(tmp)
        with open(tmp / MANIFEST, "w") as f:
            json.dump(dict(expected, **extra), f, indent=1)
        if complete():  # another process finished first
            return root
        stale = None
        if root.exists():  # a stale or incomplete cache, or an empty folder: move it aside, delete it after
            stale = Path(tempfile.mkdtemp(prefix=f".{root.name}.stale-", dir=root.parent))
            os.rename(root, stale / root.name)
        try:
            os.rename(tmp, root)
        except OSError:
            if not complete():  # another process renamed its copy first: keep it if it is valid
                raise
        else:
            logger.info("Generated the %s dataset at %s", version, root)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root
