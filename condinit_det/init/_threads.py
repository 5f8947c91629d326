"""Run the arms' linear algebra on one thread.

The arms run many medium-sized operations (a batched QR per layer, a subset eigensolver per
head). Spreading each over the OpenMP / OpenBLAS threads of a machine whose cores are busy makes
the threads spin-wait for each other: measured on a 2-core machine under load, the conditioned arm
ran 20x and the subset eigensolver 8x slower with two threads than with one. With one thread the
cost is the same on an idle or a busy machine.

:func:`single_threaded` sets torch's intra-op threads and the thread count of the OpenBLAS that
scipy ships (found among the loaded libraries, as threadpoolctl does) to one, and restores both.
Where the OpenBLAS cannot be found (not loaded yet, another platform) only torch is limited.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from typing import List, Tuple

import torch

__all__ = ["loaded_openblas_libraries", "single_threaded"]

# (get, set) symbol pairs of the OpenBLAS builds in use: scipy's wheels prefix them.
_OPENBLAS_SYMBOLS = (
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)


def loaded_openblas_libraries() -> List[ctypes.CDLL]:
    """Handles of every OpenBLAS library loaded in this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    found = []
    for path in sorted(paths):
        if not os.path.isfile(path) or ".so" not in os.path.basename(path):
            continue
        try:
            found.append(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY) if hasattr(os, "RTLD_NOLOAD")
                         else ctypes.CDLL(path))
        except OSError:
            continue
    return found


def _loaded_openblas() -> List[Tuple[object, object]]:
    """``(get, set)`` thread-count functions of every OpenBLAS library loaded in this process."""
    found = []
    for lib in loaded_openblas_libraries():
        for get_name, set_name in _OPENBLAS_SYMBOLS:
            get_fn, set_fn = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get_fn is not None and set_fn is not None:
                get_fn.restype, get_fn.argtypes = ctypes.c_int, []
                set_fn.restype, set_fn.argtypes = None, [ctypes.c_int]
                found.append((get_fn, set_fn))
                break
    return found


@contextlib.contextmanager
def single_threaded():
    """Limit torch and scipy's OpenBLAS to one thread inside the block; restore them after."""
    torch_before = torch.get_num_threads()
    blas = _loaded_openblas()
    blas_before = [get_fn() for get_fn, _ in blas]
    torch.set_num_threads(1)
    for _, set_fn in blas:
        set_fn(1)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        for (_, set_fn), n in zip(blas, blas_before):
            set_fn(n)
