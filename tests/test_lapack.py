"""The mimetic arm's LAPACK calls: the GIL-free route (scipy's OpenBLAS through ctypes, found with
threadpoolctl) and the scipy.linalg route give the same results, and both match NumPy's references."""
import threading

import numpy as np
import pytest
import threadpoolctl

from condinit_det.init import lapack


@pytest.fixture(params=["gil_free", "scipy"])
def route(request):
    if request.param == "gil_free" and not lapack.gil_free():
        pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    return request.param


def _spd(n, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal((n + 7, n)).astype(dtype)
    return a, (a.astype(np.float64).T @ a.astype(np.float64))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_routines_match_numpy(route, dtype, tol):
    a, gram64 = _spd(40, dtype)
    gram = lapack.gram_upper(a, route=route)
    assert gram.dtype == dtype and gram.shape == (40, 40)
    np.testing.assert_allclose(np.triu(gram), np.triu(gram64), rtol=tol, atol=tol * 40)
    sym = gram64.astype(dtype)
    ref_w, ref_v = np.linalg.eigh(gram64)
    w, v = lapack.top_eigenpairs(sym, 6, route=route)
    assert w.shape == (6,) and v.shape == (40, 6) and np.all(np.diff(w) >= 0)  # ascending
    np.testing.assert_allclose(w, ref_w[-6:], rtol=tol)
    np.testing.assert_allclose(np.abs(v.T @ ref_v[:, -6:]), np.eye(6), atol=tol * 100)  # same vectors up to sign
    w, v = lapack.all_eigenpairs(sym, route=route)
    assert v.shape == (40, 40)
    np.testing.assert_allclose(w, ref_w, rtol=tol, atol=tol * ref_w.max())
    np.testing.assert_allclose(v.T @ v, np.eye(40), atol=tol * 10)
    np.testing.assert_allclose((v * w) @ v.T, gram64, rtol=0, atol=tol * 10 * ref_w.max())


def test_both_routes_agree_bitwise_for_the_same_lapack():
    if not lapack.gil_free():
        pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    a, _ = _spd(50, np.float32, seed=3)
    results = {}
    for route in ("gil_free", "scipy", "auto"):
        gram = lapack.gram_upper(a, route=route)
        results[route] = (gram, *lapack.top_eigenpairs(gram, 5, route=route))
    for route in ("scipy", "auto"):
        np.testing.assert_array_equal(np.triu(results[route][0]), np.triu(results["gil_free"][0]))
        np.testing.assert_array_equal(results[route][1], results["gil_free"][1])
        np.testing.assert_array_equal(np.abs(results[route][2]), np.abs(results["gil_free"][2]))


def test_scipys_openblas_is_found_through_threadpoolctl():
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS)

    paths = [lib["filepath"] for lib in threadpoolctl.threadpool_info() if lib["internal_api"] == "openblas"]
    if not any("scipy" in p for p in paths):
        pytest.skip("scipy does not ship its own OpenBLAS in this environment")
    # scipy's wheels export LAPACKE and CBLAS from their OpenBLAS: the GIL-free route is available.
    assert lapack.gil_free()


def test_threads_get_their_own_results():
    if not lapack.gil_free():
        pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    mats = [_spd(60, np.float32, seed=s)[1].astype(np.float32) for s in range(4)]
    expected = [lapack.top_eigenpairs(m, 4, route="gil_free")[0] for m in mats]
    results = [None] * 4

    def work(i):
        results[i] = lapack.top_eigenpairs(mats[i], 4, route="gil_free")[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="square"):
        lapack.top_eigenpairs(np.zeros((3, 4), np.float32), 1)
    with pytest.raises(ValueError, match="count must be in"):
        lapack.top_eigenpairs(np.eye(3, dtype=np.float32), 4)
    with pytest.raises(ValueError, match="float32/float64"):
        lapack.gram_upper(np.zeros((3, 3), np.int64))
    with pytest.raises(ValueError, match="route must be one of auto, gil_free, scipy, got 'ctypes'"):
        lapack.all_eigenpairs(np.eye(3, dtype=np.float32), route="ctypes")
