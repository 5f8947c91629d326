"""The BLAS / LAPACK calls of the arms, through public entry points, and the one-thread rule.

Threads. The arms run many medium-sized operations (a batched QR per layer, a subset eigensolver
per head). Spreading each over the OpenMP / OpenBLAS threads of a machine whose cores are busy
makes the threads spin-wait for each other: measured on a 2-core machine under load, the
conditioned arm ran 20x and the subset eigensolver 8x slower with two threads than with one.
:func:`single_threaded` sets torch's intra-op threads and every loaded BLAS library (through
``threadpoolctl``) to one thread and restores both after; the arms use the cores by working on
several sites at once instead.

The GIL. NumPy's matmul releases Python's GIL (``tests/test_lapack.py`` checks it); scipy's eigensolver
wrappers hold it for much of their run, so sites on several threads take turns there. Both eigensolvers
are scipy's, on the OpenBLAS scipy ships, because the arms' values are made with that library's
roundings (``torch.linalg.eigh`` and ``numpy.linalg.eigh`` release the GIL but round differently, enough
to change a training run).

Arrays are NumPy, C-contiguous, float32 or float64; symmetric inputs are read from their upper
triangle.

- :func:`single_threaded` — torch and the BLAS libraries on one thread inside a ``with`` block.
- :func:`gram_upper` — ``a^T a`` (NumPy's matmul, ``?syrk``).
- :func:`top_eigenpairs` — the largest eigenvalues and their eigenvectors (``scipy.linalg.eigh``, ``?syevr``).
- :func:`all_eigenpairs` — every eigenvalue and eigenvector (``scipy.linalg.eigh``, ``?syevd``).
"""
from __future__ import annotations

import contextlib
from typing import Tuple

import numpy as np
import threadpoolctl
import torch

__all__ = ["all_eigenpairs", "gram_upper", "single_threaded", "top_eigenpairs"]


@contextlib.contextmanager
def single_threaded():
    """Limit torch's intra-op threads and every loaded BLAS library to one thread inside the block.

    Both are restored on exit. BLAS libraries loaded later (e.g. scipy's, on the first import of
    ``scipy.linalg``) are not limited: import them before entering.
    """
    torch_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(torch_before)


def _checked(a: np.ndarray, square: bool) -> np.ndarray:
    if a.dtype not in (np.float32, np.float64) or a.ndim != 2 or (square and a.shape[0] != a.shape[1]):
        raise ValueError(f"expected a 2-D float32/float64{' square' if square else ''} array, got "
                         f"{a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def gram_upper(a: np.ndarray) -> np.ndarray:
    """``a^T a`` (``[q, q]``, symmetric, a's dtype) for ``a`` of shape ``[p, q]``, float32 or float64.

    Callers may rely on the upper triangle only. ``a.T @ a`` of one buffer is a ``?syrk`` call in
    NumPy's BLAS, without the GIL.
    """
    a = _checked(a, square=False)
    return a.T @ a


def top_eigenpairs(sym: np.ndarray, count: int) -> Tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenvalues of ``sym`` (ascending) and their eigenvectors ``[n, count]``.

    Args:
        sym: ``[n, n]`` float32 or float64, read from its upper triangle.
        count: how many eigenpairs, 1 <= count <= n.
    """
    import scipy.linalg

    sym = _checked(sym, square=True)
    n = sym.shape[0]
    if not 1 <= count <= n:
        raise ValueError(f"count must be in [1, {n}], got {count}")
    return scipy.linalg.eigh(sym, lower=False, subset_by_index=(n - count, n - 1), driver="evr",
                             check_finite=False)


def all_eigenpairs(sym: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Every eigenvalue of ``sym`` (ascending) and the eigenvectors as columns ``[n, n]``.

    Args:
        sym: ``[n, n]`` float32 or float64, read from its upper triangle.
    """
    import scipy.linalg

    sym = _checked(sym, square=True)
    return scipy.linalg.eigh(sym, lower=False, driver="evd", check_finite=False)
