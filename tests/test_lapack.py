"""The mimetic arm's LAPACK calls: the GIL-free route (scipy's OpenBLAS through ctypes) and the
scipy.linalg fall-back give the same results, and both match NumPy's references."""
import threading

import numpy as np
import pytest

from condinit_det.init import _lapack


@pytest.fixture(params=["gil_free", "scipy"])
def route(request, monkeypatch):
    if request.param == "gil_free":
        if not _lapack.gil_free():
            pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    else:
        monkeypatch.setattr(_lapack, "_routines", {})  # found nothing: scipy.linalg is called
        assert not _lapack.gil_free()
    return request.param


def _spd(n, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal((n + 7, n)).astype(dtype)
    return a, (a.astype(np.float64).T @ a.astype(np.float64))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_routines_match_numpy(route, dtype, tol):
    a, gram64 = _spd(40, dtype)
    gram = _lapack.gram_upper(a)
    assert gram.dtype == dtype and gram.shape == (40, 40)
    np.testing.assert_allclose(np.triu(gram), np.triu(gram64), rtol=tol, atol=tol * 40)
    sym = gram64.astype(dtype)
    ref_w, ref_v = np.linalg.eigh(gram64)
    w, v = _lapack.top_eigenpairs(sym, 6)
    assert w.shape == (6,) and v.shape == (40, 6) and np.all(np.diff(w) >= 0)  # ascending
    np.testing.assert_allclose(w, ref_w[-6:], rtol=tol)
    np.testing.assert_allclose(np.abs(v.T @ ref_v[:, -6:]), np.eye(6), atol=tol * 100)  # same vectors up to sign
    w, v = _lapack.all_eigenpairs(sym)
    assert v.shape == (40, 40)
    np.testing.assert_allclose(w, ref_w, rtol=tol, atol=tol * ref_w.max())
    np.testing.assert_allclose(v.T @ v, np.eye(40), atol=tol * 10)
    np.testing.assert_allclose((v * w) @ v.T, gram64, rtol=0, atol=tol * 10 * ref_w.max())


def test_both_routes_agree_bitwise_for_the_same_lapack():
    if not _lapack.gil_free():
        pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    a, _ = _spd(50, np.float32, seed=3)
    fast = (_lapack.gram_upper(a), *_lapack.top_eigenpairs(_lapack.gram_upper(a), 5))
    saved, _lapack._routines = _lapack._routines, {}
    try:
        slow = (_lapack.gram_upper(a), *_lapack.top_eigenpairs(_lapack.gram_upper(a), 5))
    finally:
        _lapack._routines = saved
    np.testing.assert_array_equal(np.triu(fast[0]), np.triu(slow[0]))
    np.testing.assert_array_equal(fast[1], slow[1])
    np.testing.assert_array_equal(np.abs(fast[2]), np.abs(slow[2]))


def test_threads_get_their_own_results():
    if not _lapack.gil_free():
        pytest.skip("this scipy build does not export LAPACKE from its OpenBLAS")
    mats = [_spd(60, np.float32, seed=s)[1].astype(np.float32) for s in range(4)]
    expected = [_lapack.top_eigenpairs(m, 4)[0] for m in mats]
    results = [None] * 4

    def work(i):
        results[i] = _lapack.top_eigenpairs(mats[i], 4)[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="square"):
        _lapack.top_eigenpairs(np.zeros((3, 4), np.float32), 1)
    with pytest.raises(ValueError, match="count must be in"):
        _lapack.top_eigenpairs(np.eye(3, dtype=np.float32), 4)
    with pytest.raises(ValueError, match="float32/float64"):
        _lapack.gram_upper(np.zeros((3, 3), np.int64))
