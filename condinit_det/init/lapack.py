"""The BLAS / LAPACK the arms run on: one thread per call, and calls that release the GIL.

Threads. The arms run many medium-sized operations (a batched QR per layer, a subset eigensolver
per head). Spreading each over the OpenMP / OpenBLAS threads of a machine whose cores are busy
makes the threads spin-wait for each other: measured on a 2-core machine under load, the
conditioned arm ran 20x and the subset eigensolver 8x slower with two threads than with one.
With one thread the cost is the same on an idle or a busy machine. :func:`single_threaded` sets
torch's intra-op threads and every loaded BLAS library (through ``threadpoolctl``) to one thread
and restores both after; the arms use the cores by working on several sites at once instead.

GIL-free calls. scipy's LAPACK wrappers hold Python's GIL while they run, so two threads in
``scipy.linalg.eigh`` take turns instead of using two cores. The same LAPACK routines are also
exported by the OpenBLAS that scipy ships, through their C interface (``LAPACKE_*``, ``cblas_*``),
and a ``ctypes`` call releases the GIL. The routines below call them there when they are found
(scipy's own LP64 build among the OpenBLAS libraries ``threadpoolctl`` reports, symbols prefixed
``scipy_``; checked once against ``scipy.linalg`` on a small matrix) and otherwise call
``scipy.linalg``; either way the same LAPACK routine computes the result.

Arrays are NumPy, C-contiguous, float32 or float64; symmetric inputs are read from their upper
triangle. ``route`` chooses the path: ``"auto"`` (GIL-free when available, else scipy),
``"gil_free"`` (an error when it is not available) or ``"scipy"``.

- :func:`single_threaded` — torch and the BLAS libraries on one thread inside a ``with`` block.
- :func:`gil_free` — whether the GIL-free routines are available in this process.
- :func:`gram_upper` — the upper triangle of ``a^T a`` (``?syrk``).
- :func:`top_eigenpairs` — the largest eigenvalues and their eigenvectors (``?syevr``, subset).
- :func:`all_eigenpairs` — every eigenvalue and eigenvector (``?syevd``).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Optional, Tuple

import numpy as np
import threadpoolctl
import torch

__all__ = ["ROUTES", "all_eigenpairs", "gil_free", "gram_upper", "single_threaded", "top_eigenpairs"]

ROUTES = ("auto", "gil_free", "scipy")

_ROW_MAJOR = 101  # LAPACK_ROW_MAJOR / CblasRowMajor
_UPPER = 121  # CblasUpper
_TRANS = 112  # CblasTrans
_PREFIX = "scipy_"  # scipy's LP64 OpenBLAS; its ILP64 twin adds a 64_ suffix instead

_int = ctypes.c_int
_ptr = ctypes.c_void_p
_lock = threading.Lock()
_routines: Optional[dict] = None


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


def _openblas_handles():
    """ctypes handles of the OpenBLAS libraries loaded in this process (as threadpoolctl finds them)."""
    handles = []
    controllers = threadpoolctl.ThreadpoolController().select(internal_api="openblas").lib_controllers
    for controller in controllers:
        path = controller.filepath
        if not path or not os.path.isfile(path):
            continue
        try:
            # Already loaded: RTLD_NOLOAD returns the loaded copy and never loads a second one.
            mode = os.RTLD_NOLOAD | os.RTLD_LAZY if hasattr(os, "RTLD_NOLOAD") else ctypes.DEFAULT_MODE
            handles.append(ctypes.CDLL(path, mode=mode))
        except OSError:
            continue
    return handles


def _bind(lib: ctypes.CDLL) -> Optional[dict]:
    routines = {}
    for letter, real in (("s", ctypes.c_float), ("d", ctypes.c_double)):
        syrk = getattr(lib, f"{_PREFIX}cblas_{letter}syrk", None)
        syevr = getattr(lib, f"{_PREFIX}LAPACKE_{letter}syevr", None)
        syevd = getattr(lib, f"{_PREFIX}LAPACKE_{letter}syevd", None)
        if syrk is None or syevr is None or syevd is None:
            return None
        syrk.restype = None
        syrk.argtypes = [_int, _int, _int, _int, _int, real, _ptr, _int, real, _ptr, _int]
        syevr.restype = _int
        syevr.argtypes = [_int, ctypes.c_char, ctypes.c_char, ctypes.c_char, _int, _ptr, _int, real, real,
                          _int, _int, real, ctypes.POINTER(_int), _ptr, _ptr, _int, _ptr]
        syevd.restype = _int
        syevd.argtypes = [_int, ctypes.c_char, ctypes.c_char, _int, _ptr, _int, _ptr]
        routines[np.dtype(np.float32 if letter == "s" else np.float64)] = (syrk, syevr, syevd)
    return routines


def _self_check(routines: dict) -> bool:
    import scipy.linalg

    rng = np.random.default_rng(0)
    for dtype in routines:
        a = rng.standard_normal((7, 5)).astype(dtype)
        gram = _c_gram(routines, a)
        if not np.allclose(np.triu(gram), np.triu(a.T @ a), rtol=1e-4, atol=1e-4):
            return False
        sym = (a.T @ a).astype(dtype)
        w, v = _c_top(routines, sym, 2)
        w_ref, v_ref = scipy.linalg.eigh(sym, subset_by_index=(3, 4))
        if not (np.allclose(w, w_ref, rtol=1e-4, atol=1e-4) and np.allclose(np.abs(v), np.abs(v_ref), atol=1e-3)):
            return False
        w, v = _c_all(routines, sym)
        if not np.allclose(w, np.linalg.eigvalsh(sym), rtol=1e-4, atol=1e-4):
            return False
    return True


def _find() -> Optional[dict]:
    global _routines
    with _lock:
        if _routines is None:
            import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS)

            _routines = {}
            for lib in _openblas_handles():
                bound = _bind(lib)
                if bound and _self_check(bound):
                    _routines = bound
                    break
        return _routines or None


def gil_free() -> bool:
    """Whether the routines here can run without the GIL (scipy's OpenBLAS exports them)."""
    return _find() is not None


def _routines_for(route: str) -> Optional[dict]:
    """The GIL-free routines to call for ``route``, or None for scipy.linalg."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if route == "scipy":
        return None
    routines = _find()
    if routines is None and route == "gil_free":
        raise RuntimeError("route='gil_free': this scipy build's OpenBLAS does not export LAPACKE/CBLAS routines; "
                           "use route='auto' or 'scipy'")
    return routines


def _c_gram(routines: dict, a: np.ndarray) -> np.ndarray:
    syrk = routines[a.dtype][0]
    p, q = a.shape
    out = np.zeros((q, q), dtype=a.dtype)
    syrk(_ROW_MAJOR, _UPPER, _TRANS, q, p, 1.0, a.ctypes.data, q, 0.0, out.ctypes.data, q)
    return out


def _c_top(routines: dict, sym: np.ndarray, count: int) -> Tuple[np.ndarray, np.ndarray]:
    syevr = routines[sym.dtype][1]
    n = sym.shape[0]
    a = sym.copy()  # ?syevr overwrites its input
    w = np.empty(n, dtype=sym.dtype)
    v = np.empty((n, count), dtype=sym.dtype)
    support = np.empty(2 * count, dtype=np.int32)
    found = _int(0)
    info = syevr(_ROW_MAJOR, b"V", b"I", b"U", n, a.ctypes.data, n, 0.0, 0.0, n - count + 1, n, 0.0,
                 ctypes.byref(found), w.ctypes.data, v.ctypes.data, count, support.ctypes.data)
    if info != 0 or found.value != count:
        raise np.linalg.LinAlgError(f"?syevr failed (info={info}, {found.value} of {count} eigenpairs)")
    return w[:count], v


def _c_all(routines: dict, sym: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    syevd = routines[sym.dtype][2]
    n = sym.shape[0]
    v = sym.copy()  # overwritten by the eigenvectors
    w = np.empty(n, dtype=sym.dtype)
    info = syevd(_ROW_MAJOR, b"V", b"U", n, v.ctypes.data, n, w.ctypes.data)
    if info != 0:
        raise np.linalg.LinAlgError(f"?syevd failed (info={info})")
    return w, v


def _checked(a: np.ndarray, square: bool) -> np.ndarray:
    if a.dtype not in (np.float32, np.float64) or a.ndim != 2 or (square and a.shape[0] != a.shape[1]):
        raise ValueError(f"expected a 2-D float32/float64{' square' if square else ''} array, got "
                         f"{a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def gram_upper(a: np.ndarray, *, route: str = "auto") -> np.ndarray:
    """``[q, q]`` whose upper triangle is that of ``a^T a`` (a: ``[p, q]``); the rest is not defined.

    Args:
        a: ``[p, q]`` float32 or float64.
        route: ``"auto"`` | ``"gil_free"`` | ``"scipy"`` (module doc).
    """
    a = _checked(a, square=False)
    routines = _routines_for(route)
    if routines is not None:
        return _c_gram(routines, a)
    from scipy.linalg import blas

    syrk = blas.ssyrk if a.dtype == np.float32 else blas.dsyrk
    return np.ascontiguousarray(syrk(1.0, a.T, trans=0, lower=0))  # a.T: Fortran view of a^T


def top_eigenpairs(sym: np.ndarray, count: int, *, route: str = "auto") -> Tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenvalues of ``sym`` (ascending) and their eigenvectors ``[n, count]``.

    Args:
        sym: ``[n, n]`` float32 or float64, read from its upper triangle.
        count: how many eigenpairs, 1 <= count <= n.
        route: ``"auto"`` | ``"gil_free"`` | ``"scipy"`` (module doc).
    """
    sym = _checked(sym, square=True)
    n = sym.shape[0]
    if not 1 <= count <= n:
        raise ValueError(f"count must be in [1, {n}], got {count}")
    routines = _routines_for(route)
    if routines is not None:
        return _c_top(routines, sym, count)
    import scipy.linalg

    return scipy.linalg.eigh(sym, lower=False, subset_by_index=(n - count, n - 1), driver="evr",
                             check_finite=False)


def all_eigenpairs(sym: np.ndarray, *, route: str = "auto") -> Tuple[np.ndarray, np.ndarray]:
    """Every eigenvalue of ``sym`` (ascending) and the eigenvectors as columns ``[n, n]``.

    Args:
        sym: ``[n, n]`` float32 or float64, read from its upper triangle.
        route: ``"auto"`` | ``"gil_free"`` | ``"scipy"`` (module doc).
    """
    sym = _checked(sym, square=True)
    routines = _routines_for(route)
    if routines is not None:
        return _c_all(routines, sym)
    import scipy.linalg

    return scipy.linalg.eigh(sym, lower=False, driver="evd", check_finite=False)
