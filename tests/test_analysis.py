"""Attention-Jacobian conditioning: exact vs matrix-free, bound terms, capture, training hook."""

import math

import pytest
import torch
from table_text import unpadded
from torch import nn

from condinit_det.analysis import (
    AttentionFunction,
    capture_site_inputs,
    estimate_conditioning,
    exact_conditioning,
    measure_site,
    theorem_terms,
    write_table,
)
from condinit_det.analysis.bound import lambda_softmax_condition
from condinit_det.analysis.matrix_free import JacobianOperator
from condinit_det.analysis.spectrum import extreme_singular_values, matrix_free_spectrum
from condinit_det.init import apply_init, find_attention

vit = pytest.importorskip("detectron2.modeling.backbone.vit")


@pytest.fixture(autouse=True)
def _one_thread():
    # These problems are small: one thread avoids oversubscription on a shared CPU.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _vit_site(dim, heads, arm="default", rel_pos=False, size=(3, 3), seed=0):
    torch.manual_seed(seed)
    m = vit.Attention(dim, num_heads=heads, use_rel_pos=rel_pos, input_size=size, rel_pos_zero_init=False)
    apply_init(m, arm, seed=seed)
    return find_attention(m)[0]


def _rel_err(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize(
    "dim,heads,size,arm,rel_pos",
    [
        (8, 2, (2, 3), "default", True),
        (12, 3, (2, 2), "mimetic", False),
        (8, 4, (2, 2), "conditioned", True),
    ],
)
def test_matrix_free_matches_exact_vit(dim, heads, size, arm, rel_pos):
    site = _vit_site(dim, heads, arm, rel_pos, size)
    x = torch.randn(1, *size, dim, generator=torch.Generator().manual_seed(1))
    exact = exact_conditioning(site, {"x": x})
    est = estimate_conditioning(site, {"x": x}, tol=1e-6, max_iter=40, block_size=16)
    assert exact.shape == est.shape == (size[0] * size[1] * dim, 3 * dim * dim)
    assert not exact.rank_deficient and est.converged
    assert _rel_err(est.kappa, exact.kappa) < 0.02
    assert _rel_err(est.sigma_max, exact.sigma_max) < 0.02
    assert _rel_err(est.sigma_min, exact.sigma_min) < 0.02


@pytest.mark.parametrize("arm", ["default", "mimetic", "conditioned"])
def test_matrix_free_matches_exact_mha(arm):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(8, 2)
    apply_init(m, arm, seed=3)
    site = find_attention(m)[0]
    q = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(2))
    inputs = {"query": q, "key": q, "value": q}
    exact = exact_conditioning(site, inputs)
    est = estimate_conditioning(site, inputs, tol=1e-6, block_size=16)
    assert exact.shape == (40, 192)
    assert _rel_err(est.kappa, exact.kappa) < 0.02


def _other_layouts():
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    timm_xcit = pytest.importorskip("timm.models.xcit")
    swin = pytest.importorskip("detectron2.modeling.backbone.swin")
    mask = torch.zeros(2, 4, 4)
    mask[1, 0, 1:] = -100.0
    return [
        (timm_vit.Attention(8, num_heads=2), {"x": torch.randn(1, 5, 8)}),  # scaled_dot_product_attention
        (timm_xcit.XCA(8, num_heads=2), {"x": torch.randn(1, 6, 8)}),  # cross-covariance + temperature
        (swin.WindowAttention(8, window_size=(2, 2), num_heads=2), {"x": torch.randn(2, 4, 8), "mask": mask}),
    ]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_matrix_free_matches_exact_other_layouts(index):
    torch.manual_seed(0)
    module, inputs = _other_layouts()[index]
    apply_init(module, "mimetic", seed=0)
    site = find_attention(module)[0]
    exact = exact_conditioning(site, inputs)
    est = estimate_conditioning(site, inputs, tol=1e-6, block_size=16)
    assert est.converged and _rel_err(est.kappa, exact.kappa) < 0.02


def test_jacobian_products_match_finite_differences():
    # J v against central differences of the layer's own forward; J^T u is J v's adjoint.
    site = _vit_site(8, 2, "mimetic", True, (2, 2))
    fn = AttentionFunction(site, {"x": torch.randn(1, 2, 2, 8)})
    op = JacobianOperator(fn)
    theta = fn.theta()
    g = torch.Generator().manual_seed(5)
    d = torch.randn(2, fn.cols, dtype=theta.dtype, generator=g)
    u = torch.randn(2, fn.rows, dtype=theta.dtype, generator=g)
    eps = 1e-6
    site.module.eval()
    fd = torch.stack([(fn.flat(theta + eps * v) - fn.flat(theta - eps * v)) / (2 * eps) for v in d])
    jv = op.matvec(d)
    torch.testing.assert_close(jv, fd, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close((jv * u).sum(1), (d * op.rmatvec(u)).sum(1), rtol=1e-12, atol=1e-12)


def test_paper_form_without_output_projection():
    # With zero biases and no relative positions the site computes concat_h softmax(q k^T/sqrt(dh)) v.
    site = _vit_site(8, 2, "mimetic")
    with torch.no_grad():
        site.module.qkv.bias.zero_()
    x = torch.randn(1, 3, 3, 8, dtype=torch.float64)
    fn = AttentionFunction(site, {"x": x})
    wq, wk, wv = fn.weights
    tokens = x.reshape(9, 8)
    heads = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        a = torch.softmax((tokens @ wq[sl].T) @ (tokens @ wk[sl].T).T / 2.0, dim=-1)
        heads.append(a @ tokens @ wv[sl].T)
    expected = torch.cat(heads, dim=1).reshape(-1)
    site.module.eval()
    torch.testing.assert_close(fn(wq, wk, wv), expected)
    # The real output projection is back with include_output_proj=True.
    kept = AttentionFunction(site, {"x": x}, include_output_proj=True)
    assert not torch.allclose(kept(wq, wk, wv), expected)
    assert fn.output_proj == "identity" and kept.output_proj == "kept"


def test_non_square_output_projection_is_refused():
    site = _vit_site(8, 2)
    site.module.proj = nn.Linear(8, 6)
    with pytest.raises(ValueError, match="include_output_proj=True"):
        AttentionFunction(site, {"x": torch.randn(1, 2, 2, 8)})
    AttentionFunction(site, {"x": torch.randn(1, 2, 2, 8)}, include_output_proj=True)


def _known_operator(rows, cols, singular_values, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(rows, rows, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(cols, cols, generator=g, dtype=torch.float64)).Q
    k = min(rows, cols)
    s = torch.zeros(rows, cols, dtype=torch.float64)
    s[range(k), range(k)] = torch.as_tensor(singular_values, dtype=torch.float64)
    return u @ s @ v.T


@pytest.mark.parametrize("rows,cols", [(150, 220), (220, 150)])
def test_known_singular_values_recovered(rows, cols):
    # Well separated extremes: Lanczos must converge long before the basis spans the space.
    k = min(rows, cols)
    values = torch.cat([torch.tensor([10.0, 0.5]), torch.linspace(2.0, 4.0, k - 2, dtype=torch.float64)])
    a = _known_operator(rows, cols, values)
    res = matrix_free_spectrum(lambda v: v @ a.T, lambda u: u @ a, (rows, cols), tol=1e-8, max_iter=25, block_size=4)
    assert res.converged and res.products < k
    assert res.kappa == pytest.approx(20.0, rel=1e-6)
    assert res.sigma_max == pytest.approx(10.0, rel=1e-8)
    assert res.sigma_min == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize("rows,cols", [(900, 300), (300, 700)])
@pytest.mark.parametrize("kappa", [30.0, 1e9])
def test_extreme_singular_values_by_lanczos_on_r_match_the_svd(rows, cols, kappa):
    # Above 256 singular values the ends come from Lanczos on the QR factor, the smallest through triangular
    # solves: as accurate as the SVD's (about eps * sigma_max absolute) even at kappa 1e9, and the global RNG
    # is not advanced.
    k = min(rows, cols)
    values = torch.cat([torch.tensor([3.0]), torch.logspace(0, -math.log10(kappa / 3.0), k - 1, dtype=torch.float64)])
    a = _known_operator(rows, cols, values, seed=2)
    state = torch.get_rng_state()
    top, low = extreme_singular_values(a)
    assert torch.equal(state, torch.get_rng_state())
    s = torch.linalg.svdvals(a)
    assert top == pytest.approx(float(s[0]), rel=1e-11)
    assert abs(low - float(s[-1])) <= 1e-13 * top
    assert top / low == pytest.approx(kappa, rel=1e-5)


def test_extreme_singular_values_of_singular_matrices_are_zero_to_round_off():
    eps = torch.finfo(torch.float64).eps
    # A zero column makes R's diagonal zero: the triangular solves would divide by it (the full SVD then).
    a = _known_operator(500, 300, torch.linspace(1.0, 2.0, 300, dtype=torch.float64), seed=3)
    a[:, 7] = 0.0
    top, low = extreme_singular_values(a)
    assert low <= 300 * eps * top and top == pytest.approx(float(torch.linalg.svdvals(a)[0]), rel=1e-12)
    # Exactly rank deficient without a zero pivot: sigma_min is at round-off, as with the SVD.
    b = _known_operator(
        500, 300, torch.cat([torch.linspace(1.0, 2.0, 299, dtype=torch.float64), torch.zeros(1)]), seed=4
    )
    top, low = extreme_singular_values(b)
    assert top == pytest.approx(2.0, rel=1e-12) and low <= 300 * eps * top


def test_unconverged_estimate_is_flagged():
    values = (
        torch.geomspace(1.0, 1e3, 200, dtype=torch.float64)
        if hasattr(torch, "geomspace")
        else torch.logspace(0, 3, 200, dtype=torch.float64)
    )
    a = _known_operator(200, 260, values, seed=1)
    res = matrix_free_spectrum(lambda v: v @ a.T, lambda u: u @ a, (200, 260), tol=1e-8, max_iter=2, block_size=4)
    assert not res.converged and res.iterations == 2
    assert res.kappa < 1e3  # Ritz values lie inside the spectrum: kappa from below


def test_rank_deficiency_reported():
    a = _known_operator(30, 40, torch.cat([torch.linspace(1, 3, 29, dtype=torch.float64), torch.zeros(1)]))
    mf = matrix_free_spectrum(lambda v: v @ a.T, lambda u: u @ a, (30, 40), tol=1e-6)
    assert mf.rank_deficient and math.isinf(mf.kappa) and mf.sigma_max == pytest.approx(3.0, rel=1e-6)
    # An attention layer whose input repeats a token has duplicated Jacobian rows.
    site = _vit_site(8, 2, "mimetic")
    x = torch.randn(1, 2, 2, 8)
    x[0, 1, 1] = x[0, 0, 0]
    assert exact_conditioning(site, {"x": x}).rank_deficient
    assert estimate_conditioning(site, {"x": x}, block_size=16).rank_deficient


def test_query_key_gauge_makes_tall_jacobians_rank_deficient():
    # Without q/k biases, (W_Q^h, W_K^h) -> (M W_Q^h, M^-T W_K^h) leaves every logit unchanged, so J has
    # a null space of dimension num_heads * dh^2 and is rank deficient whenever rows >= cols (here 64 x 48).
    site = _vit_site(4, 1, "default")
    with torch.no_grad():
        site.module.qkv.bias.zero_()
    x = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    exact = exact_conditioning(site, {"x": x})
    assert exact.shape == (64, 48) and exact.rank_deficient and exact.numerical_rank <= 48 - 16
    est = estimate_conditioning(site, {"x": x}, block_size=16)
    assert est.rank_deficient and math.isinf(est.kappa)
    assert est.sigma_max == pytest.approx(exact.sigma_max, rel=1e-6)


def test_conditioned_arm_terms_and_bound():
    x = torch.randn(1, 4, 4, 32, generator=torch.Generator().manual_seed(0))
    tokens = x.reshape(16, 32).double()
    out = {}
    for arm in ("default", "conditioned"):
        site = _vit_site(32, 4, arm)
        wq, wk, wv = (site.weight(r).detach().double() for r in "qkv")
        out[arm] = theorem_terms(tokens, wq, wk, wv, num_heads=4)
    c, d = out["conditioned"], out["default"]
    for heads in (c.kappa_wq_heads, c.kappa_wk_heads, c.kappa_wv_heads):
        assert heads == pytest.approx([1.0] * 4, abs=1e-6)  # float32 parameters
    assert c.kappa_wv == pytest.approx(1.0, abs=1e-6) and c.kappa_x == d.kappa_x
    assert min(d.kappa_wq_heads + d.kappa_wk_heads + d.kappa_wv_heads) > 1.5
    # The weight factor kappa(W_V)(kappa(W_Q) + kappa(W_K)) drops to its minimum 2 in every head.
    weight_factor = [v * (q + k) for q, k, v in zip(c.kappa_wq_heads, c.kappa_wk_heads, c.kappa_wv_heads)]
    default_factor = [v * (q + k) for q, k, v in zip(d.kappa_wq_heads, d.kappa_wk_heads, d.kappa_wv_heads)]
    assert weight_factor == pytest.approx([2.0] * 4, abs=1e-5) and min(default_factor) > 4
    for t in (c, d):
        expected = [
            t.kappa_x**3 * lam * f + t.kappa_x * a
            for lam, f, a in zip(
                t.kappa_lambda_heads, weight_factor if t is c else default_factor, t.kappa_softmax_heads
            )
        ]
        assert t.bound_heads == pytest.approx(expected, rel=1e-9) and t.bound == max(t.bound_heads)
    # The bound holds: exact kappa of a paper-form layer (no biases, no relative positions) lies below it.
    for arm in ("default", "conditioned"):
        site = _vit_site(8, 2, arm)
        with torch.no_grad():
            site.module.qkv.bias.zero_()
        m = measure_site(site, {"x": x[:, :2, :3, :8]}, method="exact")
        assert m.kappa <= m.bound


@pytest.mark.parametrize("kdim", [8, 6])
def test_bound_covers_self_attention_only(kdim):
    # Theorem 3.1 is about one X feeding queries and keys: cross-attention gets kappa(J) and no bound.
    torch.manual_seed(0)
    m = nn.MultiheadAttention(8, 2, kdim=kdim, vdim=kdim)
    site = find_attention(m)[0]
    queries, memory = torch.randn(5, 1, 8), torch.randn(12, 1, kdim)
    cross = measure_site(site, {"query": queries, "key": memory, "value": memory}, method="exact")
    assert math.isfinite(cross.kappa) and math.isnan(cross.bound)
    if kdim == 8:
        own = measure_site(site, {"query": queries, "key": queries, "value": queries}, method="exact")
        assert own.kappa <= own.bound < math.inf


def test_lambda_softmax_condition_matches_eigenvalues():
    a = torch.softmax(torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2, -1)
    tops, bottoms = [], []
    for row in a:
        ev = torch.linalg.eigvalsh(torch.diag(row) - torch.outer(row, row))
        tops.append(ev[-1])
        bottoms.append(ev[1])  # ev[0] = 0 along the ones vector
    assert lambda_softmax_condition(a) == pytest.approx(float(max(tops) / min(bottoms)), rel=1e-9)
    assert lambda_softmax_condition(torch.full((5, 5), 0.2, dtype=torch.float64)) == pytest.approx(1.0)
    assert math.isinf(lambda_softmax_condition(torch.eye(3, dtype=torch.float64)))


class _TinyBackbone(nn.Module):
    """Two ViT blocks (windowed + global) behind a patch embedding; forward takes detectron2 inputs."""

    def __init__(self):
        super().__init__()
        self.net = vit.ViT(
            img_size=32,
            patch_size=4,
            embed_dim=8,
            depth=2,
            num_heads=2,
            window_size=4,
            window_block_indexes=[0],
            use_rel_pos=True,
            out_feature="last_feat",
        )

    def forward(self, batched_inputs):
        return self.net(torch.stack([d["image"].float() for d in batched_inputs]))


def test_capture_reduces_windows_and_tokens():
    torch.manual_seed(0)
    model = _TinyBackbone()
    sites = find_attention(model)
    assert [s.name for s in sites] == ["net.blocks.0.attn", "net.blocks.1.attn"]
    batch = [{"image": torch.randn(3, 32, 32)} for _ in range(2)]
    state = torch.get_rng_state()
    cap = capture_site_inputs(model, batch, sites, max_batch=1, max_tokens=16)
    assert torch.equal(state, torch.get_rng_state()) and model.training
    win, glob = cap["net.blocks.0.attn"], cap["net.blocks.1.attn"]
    assert win.inputs["x"].shape == glob.inputs["x"].shape == (1, 4, 4, 8)
    assert win.reduction == "first 1 of 8 along dim 0"  # 2 images of 4 windows each: the first window
    assert glob.reduction == "first 1 of 2 along dim 0; tokens 8x8 -> 4x4 (stride 2)"
    # The windowed input is the first window of the first image, as the block computes it.
    block = model.net.blocks[0]
    with torch.no_grad():
        x = model.net.patch_embed(batch[0]["image"][None]) + vit.get_abs_pos(model.net.pos_embed, True, (8, 8))
        first = block.norm1(x)[:, :4, :4]
    torch.testing.assert_close(win.inputs["x"], first)


def test_capture_mha_sequence_first():
    m = nn.MultiheadAttention(8, 2)
    site = find_attention(m)[0]

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = m

        def forward(self, x):
            return self.attn(x, x, x, key_padding_mask=torch.zeros(x.shape[1], x.shape[0], dtype=torch.bool))[0]

    wrap = Wrap()
    site = find_attention(wrap)[0]
    cap = capture_site_inputs(wrap, torch.randn(10, 3, 8), [site], max_batch=1, max_tokens=4)[site.name]
    assert cap.inputs["query"].shape == (4, 1, 8) and cap.inputs["key_padding_mask"].shape == (1, 4)
    res = estimate_conditioning(site, cap.inputs)
    assert res.shape == (32, 192) and res.converged


class _FakeResults:
    def __init__(self):
        self.records = []

    def add(self, record):
        self.records.append(record)


def test_hook_writes_storage_and_records(tmp_path):
    from detectron2.utils.events import EventStorage

    from condinit_det.analysis.hooks import ConditioningHook

    torch.manual_seed(0)
    model = _TinyBackbone()
    batch = [{"image": torch.randn(3, 32, 32)}]
    results = _FakeResults()
    hook = ConditioningHook(
        batch,
        period=2,
        results=results,
        arm="conditioned",
        seed=3,
        config="tiny.py",
        max_tokens=4,
        max_iter=10,
        block_size=16,
    )

    class Trainer:
        pass

    trainer = Trainer()
    trainer.model, trainer.iter, trainer.max_iter = model, 0, 3
    hook.trainer = trainer
    rng = torch.get_rng_state()
    with EventStorage(0) as storage:
        trainer.storage = storage
        hook.before_train()
        for it in range(3):
            trainer.iter = it
            storage.iter = it
            hook.after_step()
        hook.after_train()
    assert torch.equal(rng, torch.get_rng_state())
    iters = sorted({(r["iteration"], r["site"]) for r in results.records})
    assert iters == [(i, s) for i in (0, 2, 3) for s in ("net.blocks.0.attn", "net.blocks.1.attn")]
    rec = results.records[0]
    assert rec["kind"] == "conditioning" and rec["arm"] == "conditioned" and rec["seed"] == 3
    assert rec["config"] == "tiny.py" and rec["kappa"] > 1 and rec["bound"] > 0 and rec["converged"]
    assert rec["kappa"] == pytest.approx(rec["sigma_max"] / rec["sigma_min"])
    hist = storage.history("conditioning/net.blocks.1.attn/kappa")
    assert len(hist.values()) == 3
    # A run resumed at iteration 1 measures what the uninterrupted run measures: nothing at its start.
    hook._last_measured, trainer.iter, count = None, 1, len(results.records)
    with EventStorage(1) as storage:
        trainer.storage = storage
        hook.before_train()
    assert len(results.records) == count


def test_hook_results_file_and_builder(tmp_path):
    pytest.importorskip("condinit_det.records.results")
    from detectron2.config import LazyConfig  # noqa: F401
    from omegaconf import OmegaConf

    from condinit_det.analysis.hooks import ConditioningHook, build_conditioning_hook
    from condinit_det.records.results import ResultsFile

    cfg = OmegaConf.create(
        {
            "condinit": {"arm": "mimetic", "seed": 1},
            "train": {"output_dir": str(tmp_path)},
            "condinit_analysis": {"period": 0},
        }
    )
    assert build_conditioning_hook(cfg, batch=[{"image": torch.zeros(3, 8, 8)}]) is None
    cfg.condinit_analysis = {"period": 5, "max_tokens": 4, "sites": ["net.blocks.1.*"], "block_size": 16}
    hook = build_conditioning_hook(cfg, batch=[{"image": torch.randn(3, 32, 32)}], config_name="tiny")
    assert hook.period == 5 and hook.arm == "mimetic"

    class Trainer:
        pass

    hook.trainer = Trainer()
    hook.trainer.model, hook.trainer.iter = _TinyBackbone(), 0
    hook.measure(0)
    recs = ResultsFile(str(tmp_path)).records(kind="conditioning")
    assert [r["site"] for r in recs] == ["net.blocks.1.attn"] and recs[0]["arm"] == "mimetic"
    cfg.condinit_analysis = {"period": 5, "bogus": 1}
    with pytest.raises(ValueError, match="bogus"):
        build_conditioning_hook(cfg, batch=[{}])
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_token'\]"):
        ConditioningHook([{}], period=1, max_token=4)  # a misspelt option is refused, not ignored


def test_write_table(tmp_path):
    paths = write_table(
        [{"site": "a", "kappa": math.inf, "converged": True}], str(tmp_path), columns=("site", "kappa", "converged")
    )
    assert open(paths["csv"]).read().splitlines() == ["site,kappa,converged", "a,inf,True"]
    assert "| a | inf | yes |" in unpadded(open(paths["md"]).read())
