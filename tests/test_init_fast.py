"""The arms' fast paths: float32 normal draws, batched Haar QR, the top-k singular solver and its
check and fall-back, mimetic through that solver on every layout, and one-thread execution (weights
that do not depend on the thread count)."""

import math

import pytest
import threadpoolctl
import torch
from test_init_arms import LAYOUTS, build_layout  # tests/ is on sys.path (pytest, rootdir mode)
from torch import nn

from condinit_det.init import apply as apply_module
from condinit_det.init import (
    apply_init,
    find_attention,
    haar_semi_orthogonal_batch,
    mimetic_noise_batch,
    mimetic_qk_batch,
    site_generator,
    standard_normal,
    top_singular,
    working_dtype,
)
from condinit_det.init import arms as arms_module

F64 = torch.float64


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _relative(a, b):
    return ((a - b).norm() / b.norm()).item()


def _best_rank(m, k):
    u, s, vh = torch.linalg.svd(m.to(F64), full_matrices=False)
    return (u[..., :k] * s[..., None, :k]) @ vh[..., :k, :]


# ---------------------------------------------------------------------------------------------
# Draws


def test_standard_normal_stream_and_moments():
    a = standard_normal(3, 70001, generator=_gen(1))
    b = standard_normal(3 * 70001, generator=_gen(1))
    assert a.dtype == torch.float32 and a.shape == (3, 70001)
    assert torch.equal(a.flatten(), b)  # filled row-major, whatever the shape
    assert torch.equal(a, torch.randn(3, 70001, generator=_gen(1)))  # torch's float32 stream
    assert not torch.equal(a, standard_normal(3, 70001, generator=_gen(2)))
    x = a.flatten().double()
    n = x.numel()
    assert abs(x.mean().item()) < 5 / math.sqrt(n)
    assert abs(x.std().item() - 1) < 5 / math.sqrt(2 * n)
    assert abs((x**4).mean().item() - 3) < 0.05  # Gaussian kurtosis
    assert abs(((x > 1.0).double().mean() - 0.158655).item()) < 0.003
    assert standard_normal(1, generator=_gen(0)).shape == (1,)
    assert standard_normal(0, 4, generator=_gen(0)).numel() == 0


def test_working_precision():
    assert working_dtype(torch.float64) == F64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert working_dtype(dtype) == torch.float32


def test_draws_do_not_touch_the_global_rng():
    state = torch.get_rng_state()
    standard_normal(1000, generator=_gen())
    haar_semi_orthogonal_batch(4, 8, 32, generator=_gen())
    top_singular(torch.randn(2, 40, 40, generator=_gen(), dtype=F64), 4, solver="subspace")
    assert torch.equal(state, torch.get_rng_state())


# ---------------------------------------------------------------------------------------------
# Haar blocks


@pytest.mark.parametrize("rows,cols", [(8, 48), (48, 8), (16, 16), (1, 5), (12, 40)])
@pytest.mark.parametrize("dtype,atol", [(F64, 1e-13), (torch.float32, 2e-6)])
def test_haar_batch_is_one_qr_with_positive_diagonal(rows, cols, dtype, atol):
    # (8, 48), (48, 8), (1, 5): CholeskyQR; (16, 16), (12, 40): Householder.
    count = 6
    blocks = haar_semi_orthogonal_batch(count, rows, cols, generator=_gen(3), dtype=dtype)
    assert blocks.shape == (count, rows, cols) and blocks.dtype == dtype
    h = standard_normal(count, min(rows, cols), max(rows, cols), generator=_gen(3)).to(F64)
    for i in range(count):
        q, r = torch.linalg.qr(h[i].T)  # the definition: G = H^T = Q R, diag(R) > 0
        d = torch.sign(torch.diagonal(r))
        d[d == 0] = 1
        expected = q * d
        torch.testing.assert_close(blocks[i].to(F64), expected.T if rows <= cols else expected, rtol=0, atol=atol)
        sv = torch.linalg.svdvals(blocks[i].to(F64))
        torch.testing.assert_close(sv, torch.ones_like(sv), rtol=0, atol=atol)


def test_haar_cholesky_route_falls_back_to_householder_when_not_positive_definite(monkeypatch):
    h = torch.randn(3, 4, 40, generator=_gen(0))
    h[1, 3] = h[1, 2]  # a rank-deficient block: its Gram is singular
    monkeypatch.setattr(arms_module, "standard_normal", lambda *shape, generator: h.clone())
    rows = haar_semi_orthogonal_batch(3, 4, 40, generator=_gen(0), dtype=F64)  # wide: the CholeskyQR route
    q, r = torch.linalg.qr(h[0].to(F64).T)
    torch.testing.assert_close(rows[0], (q * torch.sign(torch.diagonal(r))).T, rtol=0, atol=1e-13)
    assert torch.isfinite(rows).all()


# ---------------------------------------------------------------------------------------------
# Top-k singular triplets

SHAPES = [(64, 64, 8), (80, 48, 12), (48, 80, 12), (40, 40, 20), (30, 16, 7)]


def _mimetic_like(batch, p, q, seed=0, alpha=0.7, beta=0.7):
    z = standard_normal(batch, p, q, generator=_gen(seed)).to(F64) / math.sqrt(p)
    m = alpha * z
    torch.diagonal(m, dim1=-2, dim2=-1).add_(beta)
    return m


@pytest.mark.parametrize("p,q,k", SHAPES)
def test_subspace_solver_matches_the_dense_svd(p, q, k):
    m = _mimetic_like(5, p, q, seed=p + q + k)
    top = top_singular(m, k, solver="subspace")
    assert top.solver == "subspace" and not top.fallback.any()
    assert (top.estimate <= 1e-4).all()
    assert top.u.shape == (5, p, k) and top.s.shape == (5, k) and top.v.shape == (5, q, k)
    best = _best_rank(m, k)
    product = (top.u * top.s.unsqueeze(-2)) @ top.v.mT
    for i in range(5):
        assert _relative(product[i], best[i]) < 1e-4
    # Orthonormal singular vectors, descending singular values equal to the dense ones.
    eye = torch.eye(k, dtype=F64)
    torch.testing.assert_close(top.u.mT @ top.u, eye.expand(5, k, k), rtol=0, atol=1e-10)
    torch.testing.assert_close(top.v.mT @ top.v, eye.expand(5, k, k), rtol=0, atol=1e-10)
    dense = top_singular(m, k, solver="dense")
    torch.testing.assert_close(top.s, dense.s, rtol=1e-6, atol=0)
    assert (top.s[:, :-1] >= top.s[:, 1:]).all()


def test_solver_check_failure_falls_back_to_dense():
    m = _mimetic_like(4, 64, 64, seed=5)
    dense = top_singular(m, 8, solver="dense")
    forced = top_singular(m, 8, solver="subspace", tol=0.0)  # no estimate can pass
    assert forced.fallback.all()
    for name in ("u", "s", "v"):
        torch.testing.assert_close(getattr(forced, name), getattr(dense, name), rtol=0, atol=1e-13)


def test_zero_gap_falls_back_and_stays_exact():
    """A matrix whose singular values are all equal has no gap: the check cannot pass."""
    m = torch.stack([0.7 * torch.eye(48, dtype=F64), _mimetic_like(1, 48, 48, seed=9)[0]])
    top = top_singular(m, 6, solver="subspace")
    assert top.fallback.tolist() == [True, False]
    assert math.isinf(top.estimate[0].item())
    product = (top.u * top.s.unsqueeze(-2)) @ top.v.mT
    ref = top_singular(m[:1], 6, solver="dense")
    torch.testing.assert_close(product[0], (ref.u[0] * ref.s[0]) @ ref.v[0].T, rtol=0, atol=1e-14)
    assert _relative(product[1], _best_rank(m[1], 6)) < 1e-4


def test_block_gap_zero_only_at_the_cut_falls_back():
    # Singular values: 6 distinct large ones, then a flat run long enough to fill the block.
    s = torch.cat([torch.linspace(3.0, 2.0, 6, dtype=F64), torch.full((58,), 1.0, dtype=F64)])
    g = _gen(4)
    u = torch.linalg.qr(standard_normal(64, 64, generator=g).to(F64))[0]
    v = torch.linalg.qr(standard_normal(64, 64, generator=g).to(F64))[0]
    m = ((u * s) @ v.T).unsqueeze(0)
    top = top_singular(m, 8, solver="subspace")
    assert top.fallback.all()


def test_auto_solver_choice():
    big = _mimetic_like(1, 256, 256)
    assert top_singular(big, 16).solver == "subspace"
    assert top_singular(big, 120).solver == "dense"  # the block would be most of the spectrum
    assert top_singular(_mimetic_like(1, 64, 64), 8).solver == "dense"  # small: dense is as fast
    with pytest.raises(ValueError, match="solver must be one of auto, dense, subspace"):
        top_singular(big, 4, solver="lanczos")
    with pytest.raises(ValueError, match="k must be in"):
        top_singular(big, 0)
    with pytest.raises(ValueError, match="k < min"):
        top_singular(_mimetic_like(1, 8, 8), 8, solver="subspace")


def test_mimetic_qk_batch_is_the_best_rank_dh_approximation():
    z = standard_normal(3, 256, 256, generator=_gen(7)).to(F64) / 16
    w_q, w_k = mimetic_qk_batch(z, alpha=0.7, beta=0.7, head_dim=32)  # auto: the subspace solver
    target = 0.7 * z + 0.7 * torch.eye(256, dtype=F64)
    best = _best_rank(target, 32)
    for h in range(3):
        assert _relative(w_q[h].T @ w_k[h], best[h]) < 1e-4
        # Balanced factors: W_q W_q^T = W_k W_k^T = diag(S).
        torch.testing.assert_close(w_q[h] @ w_q[h].T, w_k[h] @ w_k[h].T, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# The arms through the fast paths, on every layout, float32 and float64 parameters


def _replay_qk(site, seed):
    """The arm's Q/K noise draw for a site (float64, as the arm computes with it for every dtype)."""
    g = site_generator(seed, site.name)
    return mimetic_noise_batch(
        site.num_heads, site.dim_in, site.dim_k_in, std=site.dim_in**-0.5, noise="normal", generator=g
    ), g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mimetic_subspace_solver_on_every_layout(layout, dtype, monkeypatch):
    model, _ = build_layout(layout, dtype)
    site = find_attention(model)[0]

    def no_dense(*args, **kwargs):
        raise AssertionError("the subspace solver fell back to the dense one")

    with monkeypatch.context() as patch:
        patch.setattr(torch.linalg, "svd", no_dense)  # the dense solver's SVD; nothing else in the arm uses it
        report = apply_init(model, "mimetic", seed=4, solver="subspace")
    assert report.options["solver"] == "subspace"
    z, g = _replay_qk(site, 4)
    dh = site.head_dim
    target = 0.7 * z + 0.7 * torch.eye(site.dim_in, site.dim_k_in, dtype=F64)
    best = _best_rank(target, dh)
    for h in range(site.num_heads):
        w_q = site.weight("q")[h * dh : (h + 1) * dh].to(F64)
        w_k = site.weight("k")[h * dh : (h + 1) * dh].to(F64)
        assert _relative(w_q.T @ w_k, best[h]) < 1e-4, (layout, h)
    vo = mimetic_noise_batch(1, site.dim_v_in, site.dim_out, std=site.dim_v_in**-0.5, noise="normal", generator=g)[0]
    target_vo = 0.4 * vo - 0.4 * torch.eye(site.dim_v_in, site.dim_out, dtype=F64)
    product = site.weight("v").to(F64).T @ site.weight("o").to(F64).T
    assert _relative(product, target_vo) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_conditioned_in_parameter_dtype(layout, dtype):
    model, _ = build_layout(layout, dtype)
    site = find_attention(model)[0]
    apply_init(model, "conditioned", seed=6, gain_qk=0.5)
    dh = site.head_dim
    for role in ("q", "k"):
        w = site.weight(role)
        assert w.dtype == dtype
        for h in range(site.num_heads):
            sv = torch.linalg.svdvals(w[h * dh : (h + 1) * dh].to(F64))
            assert (sv - 0.5).abs().max() <= 1e-5 * 0.5
    assert torch.equal(site.weight("v"), torch.eye(site.dim_v, site.dim_v_in, dtype=dtype))


def test_mimetic_solvers_agree_and_dense_is_the_reference():
    attn = nn.MultiheadAttention(256, 8).double()
    fast, dense = attn, nn.MultiheadAttention(256, 8).double()
    dense.load_state_dict(fast.state_dict())
    apply_init(fast, "mimetic", seed=3)  # auto: subspace at this size
    apply_init(dense, "mimetic", seed=3, solver="dense")
    for h in range(8):
        rows = slice(h * 32, (h + 1) * 32)
        pf = fast.in_proj_weight[rows].T @ fast.in_proj_weight[256:512][rows]
        pd = dense.in_proj_weight[rows].T @ dense.in_proj_weight[256:512][rows]
        assert _relative(pf, pd) < 1e-4
    assert torch.equal(fast.in_proj_weight[512:], dense.in_proj_weight[512:])  # V/O does not use it
    with pytest.raises(ValueError, match="solver must be one of auto, dense, subspace"):
        apply_init(attn, "mimetic", seed=0, solver="qr")


# ---------------------------------------------------------------------------------------------
# Threads


@pytest.mark.parametrize("width,heads", [(64, 4), (96, 3)], ids=["cholesky_qr", "householder_qr"])
@pytest.mark.parametrize("arm", ["conditioned", "mimetic"])
def test_weights_do_not_depend_on_the_thread_count(arm, width, heads):
    # 96 wide with 3 heads: the conditioned arm's [32, 96] blocks take MKL's Householder QR, which rounds by its
    # thread count; the arm runs it on one thread whatever torch's setting, so 1 and 2 threads agree bit for bit.
    def model():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.MultiheadAttention(width, heads) for _ in range(5)])

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = model()
        apply_init(one, arm, seed=2)
        torch.set_num_threads(2)
        for _ in range(4):
            two = model()
            rng = torch.get_rng_state()
            apply_init(two, arm, seed=2)
            assert torch.equal(rng, torch.get_rng_state())
            assert torch.get_num_threads() == 2  # restored
            for k, v in one.state_dict().items():
                assert torch.equal(v, two.state_dict()[k]), k
    finally:
        torch.set_num_threads(before)


def _blas_threads():
    return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]


def test_tied_weights_are_written_in_site_order():
    torch.manual_seed(0)
    a, b = nn.MultiheadAttention(16, 2), nn.MultiheadAttention(16, 2)
    b.in_proj_weight = a.in_proj_weight  # tied
    tied = nn.Sequential(a, b)
    apply_init(tied, "conditioned", seed=0)
    # The second site writes last.
    last = nn.MultiheadAttention(16, 2)
    apply_init(nn.Sequential(nn.MultiheadAttention(16, 2), last), "conditioned", seed=0, include=["1"])
    assert torch.equal(tied[1].in_proj_weight, last.in_proj_weight)


@pytest.mark.parametrize("arm", ["conditioned", "mimetic"])
def test_arms_run_on_one_thread_and_restore_the_counts(arm, monkeypatch):
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, so that it is limited too)

    calls = []
    name = "haar_semi_orthogonal_batch" if arm == "conditioned" else "mimetic_vo"
    original = getattr(apply_module, name)

    def spy(*args, **kwargs):  # the thread counts each site sees
        calls.append((torch.get_num_threads(), _blas_threads()))
        return original(*args, **kwargs)

    monkeypatch.setattr(apply_module, name, spy)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
            blas_before = _blas_threads()
            assert blas_before and all(n == 2 for n in blas_before)
            apply_init(nn.Sequential(*[nn.MultiheadAttention(64, 4) for _ in range(3)]), arm, seed=0)
            assert len(calls) == 3
            assert all(torch_threads == 1 and all(n == 1 for n in blas) for torch_threads, blas in calls)
            assert torch.get_num_threads() == 2 and _blas_threads() == blas_before  # restored
    finally:
        torch.set_num_threads(before)


def test_thread_counts_are_restored_after_an_error():
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS)

    attn = nn.MultiheadAttention(16, 2)
    with torch.no_grad():
        attn.in_proj_weight[16:24].zero_()  # key head 0: scale_matched cannot rescale it
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
            blas_before = _blas_threads()
            with pytest.raises(ValueError, match="all zeros"):
                apply_init(attn, "scale_matched", seed=0)
            assert torch.get_num_threads() == 2 and _blas_threads() == blas_before
    finally:
        torch.set_num_threads(before)


def test_module_exports_the_fast_functions():
    import condinit_det.init as init

    for name in (
        "standard_normal",
        "haar_semi_orthogonal_batch",
        "mimetic_qk_batch",
        "top_singular",
        "mimetic_noise_batch",
        "TopSingular",
        "SOLVERS",
    ):
        assert name in init.__all__ and hasattr(init, name)
    assert arms_module.SOLVERS == ("auto", "dense", "subspace")


def test_float32_parameters_get_the_float64_truncation():
    """A best rank-dh approximation is sensitive to the rounding of its target (dense spectrum), so
    mimetic Q/K keep a float64 target for float32 parameters: their products equal the float64
    parameters' ones to float32 rounding. V/O's exact factorization runs in float32."""
    from timm.models.vision_transformer import Attention

    torch.manual_seed(0)
    f32 = Attention(384, num_heads=6)
    f64 = Attention(384, num_heads=6).double()
    apply_init(f32, "mimetic", seed=1)
    report = apply_init(f64, "mimetic", seed=1)
    assert report.options["solver"] == "auto"
    s32, s64 = find_attention(f32)[0], find_attention(f64)[0]
    dh = s32.head_dim
    for h in range(s32.num_heads):
        rows = slice(h * dh, (h + 1) * dh)
        p32 = s32.weight("q")[rows].to(F64).T @ s32.weight("k")[rows].to(F64)
        p64 = s64.weight("q")[rows].T @ s64.weight("k")[rows]
        assert _relative(p32, p64) < 1e-6, h
    vo32 = s32.weight("v").to(F64).T @ s32.weight("o").to(F64).T
    vo64 = s64.weight("v").T @ s64.weight("o").T
    assert _relative(vo32, vo64) < 1e-5
