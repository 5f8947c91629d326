"""The arms' weights do not depend on the solver (hence on the device): signed singular vectors, no TF32."""

import pytest
import torch
from torch import nn

from condinit_det.init import apply_init, arms, find_attention, site_generator
from condinit_det.init.arms import mimetic_qk_batch, mimetic_vo, sign_convention, top_singular

F64 = torch.float64


def _flip_some(x: torch.Tensor, seed: int) -> torch.Tensor:
    """x with a random half of its columns negated (what another solver may return)."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.where(torch.rand(x.shape[:-2] + (1, x.shape[-1]), generator=g) < 0.5, -1.0, 1.0)
    return x * signs.to(x.dtype)


def test_sign_convention():
    u = torch.tensor([[0.6, -0.1], [-0.8, 0.2], [0.0, -0.97]], dtype=F64)
    v = torch.tensor([[1.0, 2.0]], dtype=F64)
    su, sv = sign_convention(u, v)
    assert torch.equal(su, torch.tensor([[-0.6, 0.1], [0.8, -0.2], [0.0, 0.97]], dtype=F64))
    assert torch.equal(sv, torch.tensor([[-1.0, -2.0]], dtype=F64))
    assert torch.equal(sign_convention(su, sv)[0], su)  # idempotent


def test_mimetic_qk_weights_do_not_depend_on_the_solvers_signs(monkeypatch):
    z = torch.randn(3, 48, 48, generator=torch.Generator().manual_seed(0), dtype=F64) / 48**0.5
    reference = mimetic_qk_batch(z, alpha=0.7, beta=0.7, head_dim=16, solver="dense")
    dense_top = arms._dense_top

    def other_signs(m, k):  # the same pairs (u_j, v_j) negated together, as another SVD may return them
        u, s, v = dense_top(m, k)
        return _flip_some(u, 1), s, _flip_some(v, 1)

    monkeypatch.setattr(arms, "_dense_top", other_signs)
    flipped = mimetic_qk_batch(z, alpha=0.7, beta=0.7, head_dim=16, solver="dense")
    for a, b in zip(reference, flipped):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(40, 40), (24, 40), (40, 24)])
def test_mimetic_vo_weights_agree_between_lapack_and_torch_eigh(shape, monkeypatch):
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=F64) / shape[0] ** 0.5
    default = torch.zeros(40, shape[0], dtype=F64)
    lapack = mimetic_vo(z, alpha=0.4, beta=0.4, dim_v=40, w_v_default=default)
    # The CUDA path: torch.linalg.eigh, whose eigenvector signs are its own.
    monkeypatch.setattr(
        arms, "_gram_eigenvectors", lambda side: _flip_some(torch.linalg.eigh(side.mT @ side)[1].flip(-1), 2)
    )
    other = mimetic_vo(z, alpha=0.4, beta=0.4, dim_v=40, w_v_default=default)
    for a, b in zip(lapack[:2], other[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_subspace_and_dense_solvers_give_the_same_weights():
    # Before the convention only their products agreed; now the blocks themselves do.
    z = torch.randn(4, 256, 256, generator=torch.Generator().manual_seed(2), dtype=F64) / 16.0
    m = z * 0.7 + 0.7 * torch.eye(256, dtype=F64)
    fast, dense = top_singular(m, 32, solver="subspace"), top_singular(m, 32, solver="dense")
    assert fast.solver == "subspace" and not fast.fallback.any()
    torch.testing.assert_close(fast.u, dense.u, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast.v, dense.v, rtol=0, atol=1e-5)


def test_mimetic_weights_pinned_by_an_independent_reference():
    """apply_init on the CPU equals the arm computed here from its definition with a full float64 SVD."""
    dim, heads = 64, 4
    dh = dim // heads
    attn = nn.MultiheadAttention(dim, heads).double()
    apply_init(attn, "mimetic", seed=5)
    (site,) = find_attention(attn)
    g = site_generator(5, site.name)
    z_qk = torch.randn(heads, dim, dim, generator=g, dtype=torch.float32).to(F64) * dim**-0.5
    z_vo = torch.randn(dim, dim, generator=g, dtype=torch.float32).to(F64) * dim**-0.5
    eye = torch.eye(dim, dtype=F64)

    def signed_svd(m):
        u, s, vh = torch.linalg.svd(m)
        v = vh.T.clone()
        for j in range(u.shape[1]):  # largest-magnitude entry of each left vector positive
            if u[u[:, j].abs().argmax(), j] < 0:
                u[:, j], v[:, j] = -u[:, j], -v[:, j]
        return u, s, v

    w = attn.in_proj_weight.detach()
    for h in range(heads):
        u, s, v = signed_svd(0.7 * z_qk[h] + 0.7 * eye)
        rows = slice(h * dh, (h + 1) * dh)
        torch.testing.assert_close(w[:dim][rows], (u[:, :dh] * s[:dh].sqrt()).T, rtol=0, atol=1e-9)
        torch.testing.assert_close(w[dim : 2 * dim][rows], (v[:, :dh] * s[:dh].sqrt()).T, rtol=0, atol=1e-9)
    u, s, v = signed_svd(0.4 * z_vo - 0.4 * eye)
    torch.testing.assert_close(w[2 * dim :], (u * s.sqrt()).T, rtol=0, atol=1e-9)
    torch.testing.assert_close(attn.out_proj.weight.detach(), v * s.sqrt(), rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "set_tf32",
    [
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
        lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
        lambda: torch.set_float32_matmul_precision("high"),
    ],
    ids=["allow_tf32", "fp32_precision", "matmul_precision"],
)
def test_tf32_is_off_inside_and_restored_after(set_tf32):
    # The flags are process-wide and need no CUDA device to be read or set.
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        set_tf32()
        with arms._full_fp32(torch.device("cuda")):
            assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        with arms._full_fp32(torch.device("cpu")):
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
