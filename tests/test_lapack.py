"""The mimetic arm's BLAS / LAPACK calls: results match NumPy's float64 references, threads get their own
results, and the Gram product runs without the GIL."""
import threading
import time

import numpy as np
import pytest

from condinit_det.init import lapack


def _spd(n, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal((n + 7, n)).astype(dtype)
    return a, (a.astype(np.float64).T @ a.astype(np.float64))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_routines_match_numpy(dtype, tol):
    a, gram64 = _spd(40, dtype)
    gram = lapack.gram_upper(a)
    assert gram.dtype == dtype and gram.shape == (40, 40)
    np.testing.assert_allclose(np.triu(gram), np.triu(gram64), rtol=tol, atol=tol * 40)
    sym = gram64.astype(dtype)
    ref_w, ref_v = np.linalg.eigh(gram64)
    w, v = lapack.top_eigenpairs(sym, 6)
    assert w.dtype == dtype and w.shape == (6,) and v.shape == (40, 6) and np.all(np.diff(w) >= 0)  # ascending
    np.testing.assert_allclose(w, ref_w[-6:], rtol=tol)
    np.testing.assert_allclose(np.abs(v.T @ ref_v[:, -6:]), np.eye(6), atol=tol * 100)  # same vectors up to sign
    w, v = lapack.all_eigenpairs(sym)
    assert w.dtype == dtype and v.shape == (40, 40)
    np.testing.assert_allclose(w, ref_w, rtol=tol, atol=tol * ref_w.max())
    np.testing.assert_allclose(v.T @ v, np.eye(40), atol=tol * 10)
    np.testing.assert_allclose((v * w) @ v.T, gram64, rtol=0, atol=tol * 10 * ref_w.max())


def test_symmetric_inputs_are_read_from_the_upper_triangle():
    _, gram64 = _spd(30, np.float64, seed=1)
    garbage = np.triu(gram64) + np.tril(np.full_like(gram64, 1e3), -1)
    ref_w = np.linalg.eigvalsh(gram64)
    np.testing.assert_allclose(lapack.top_eigenpairs(garbage, 4)[0], ref_w[-4:], rtol=1e-10)
    np.testing.assert_allclose(lapack.all_eigenpairs(garbage)[0], ref_w, rtol=1e-10, atol=1e-10 * ref_w.max())


def test_threads_get_their_own_results():
    mats = [_spd(60, np.float32, seed=s)[1].astype(np.float32) for s in range(4)]
    expected = [(lapack.top_eigenpairs(m, 4)[0], lapack.all_eigenpairs(m)[0]) for m in mats]
    results = [None] * 4

    def work(i):
        results[i] = (lapack.top_eigenpairs(mats[i], 4)[0], lapack.all_eigenpairs(mats[i])[0])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def _python_steps_during(fn) -> float:
    """Steps a pure-Python loop on another thread makes per second while ``fn`` runs."""
    stop, steps = threading.Event(), [0]

    def spin():
        while not stop.is_set():
            steps[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        start, t0 = steps[0], time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        return (steps[0] - start) / elapsed
    finally:
        stop.set()
        thread.join()


def test_the_gram_product_releases_the_gil():
    # A call that holds the GIL lets the other thread step only between calls; the baseline is a sleep,
    # measured under the same machine load. (scipy's eigensolver wrappers hold it for much of their run.)
    a = np.random.default_rng(0).standard_normal((600, 600)).astype(np.float32)
    with lapack.single_threaded():
        free = _python_steps_during(lambda: time.sleep(0.2))
        gram = _python_steps_during(lambda: [lapack.gram_upper(a) for _ in range(20)])
    assert gram > 0.2 * free, (gram, free)


def test_bad_arguments():
    with pytest.raises(ValueError, match="square"):
        lapack.top_eigenpairs(np.zeros((3, 4), np.float32), 1)
    with pytest.raises(ValueError, match="count must be in"):
        lapack.top_eigenpairs(np.eye(3, dtype=np.float32), 4)
    with pytest.raises(ValueError, match="float32/float64"):
        lapack.gram_upper(np.zeros((3, 3), np.int64))
    with pytest.raises(ValueError, match="square"):
        lapack.all_eigenpairs(np.zeros((2, 3), np.float64))
