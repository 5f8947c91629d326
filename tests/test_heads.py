"""Exact per-head conditioning (condinit_det.analysis.heads) against the dense Jacobian's SVD, every layout."""

import math
from types import SimpleNamespace

import pytest
import torch
from dense_jacobian import dense_conditioning, dense_jacobian
from torch import nn

from condinit_det.analysis import AttentionFunction, choose_method, exact_conditioning, measure_site, spectrum
from condinit_det.analysis.heads import head_factors
from condinit_det.init import apply_init, find_attention

vit = pytest.importorskip("detectron2.modeling.backbone.vit")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _layouts():
    """(name, module, inputs, structure the exact method must use)."""
    swin = pytest.importorskip("detectron2.modeling.backbone.swin")
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    timm_xcit = pytest.importorskip("timm.models.xcit")
    torch.manual_seed(0)
    mask = torch.zeros(2, 4, 4)
    mask[1, 0, 1:] = -100.0
    return {
        # two sequences: the weights are shared across them, so J is not block diagonal by sequence
        "d2_vit_rel_pos": (
            vit.Attention(8, num_heads=2, use_rel_pos=True, input_size=(2, 3), rel_pos_zero_init=False),
            {"x": torch.randn(2, 2, 3, 8, generator=_gen(1))},
            "closed_form",
        ),
        "d2_swin_window": (
            swin.WindowAttention(8, window_size=(2, 2), num_heads=2),
            {"x": torch.randn(2, 4, 8, generator=_gen(2)), "mask": mask},
            "closed_form",
        ),
        "timm_vit": (
            timm_vit.Attention(8, num_heads=2, qkv_bias=True),
            {"x": torch.randn(1, 5, 8, generator=_gen(3))},
            "closed_form",
        ),
        "timm_xcit_channel": (
            timm_xcit.XCA(8, num_heads=2),
            {"x": torch.randn(1, 6, 8, generator=_gen(4))},
            "autodiff",
        ),
        # cross-attention: other key / value widths and lengths, sequence-first
        "mha_kdim_vdim": (
            nn.MultiheadAttention(8, 2, kdim=6, vdim=7),
            {
                "query": torch.randn(3, 1, 8, generator=_gen(5)),
                "key": torch.randn(6, 1, 6, generator=_gen(6)),
                "value": torch.randn(6, 1, 7, generator=_gen(7)),
            },
            "closed_form",
        ),
    }


def _close(a, b, rel=1e-9):
    return abs(a - b) <= rel * abs(b)


@pytest.fixture(params=["svd", "lanczos"])
def factor_spectrum(request, monkeypatch):
    """Both routes to a factor's extreme singular values: the full SVD (small factors) and Lanczos on its QR
    factor (above 256 singular values; here for every factor of at least 3)."""
    if request.param == "lanczos":
        monkeypatch.setattr(spectrum, "_FULL_SVD_SIZE", 2)
    return request.param


@pytest.mark.parametrize("include_output_proj", [False, True], ids=["no_wo", "with_wo"])
@pytest.mark.parametrize("name", ["d2_vit_rel_pos", "d2_swin_window", "timm_vit", "timm_xcit_channel", "mha_kdim_vdim"])
def test_exact_matches_dense(name, include_output_proj, factor_spectrum):
    module, inputs, structure = _layouts()[name]
    # mimetic's V/O product is rank 7 at vdim 7 (and conditioned's W_V has an empty row): W_O or a head
    # would be singular, so the cross-attention layer keeps its default init
    apply_init(module, "default" if name == "mha_kdim_vdim" else "mimetic", seed=0)
    site = find_attention(module)[0]
    exact = exact_conditioning(site, inputs, include_output_proj=include_output_proj)
    dense = dense_conditioning(site, inputs, include_output_proj=include_output_proj)
    assert exact.shape == dense.shape and exact.structure == structure
    assert not dense.rank_deficient and not exact.rank_deficient
    assert exact.numerical_rank == dense.numerical_rank == min(dense.shape)
    assert _close(exact.kappa, dense.kappa) and _close(exact.sigma_max, dense.sigma_max)
    assert _close(exact.sigma_min, dense.sigma_min)
    if include_output_proj:
        assert exact.kappa_heads == []  # W_O mixes the heads: no per-head blocks
    else:
        assert len(exact.kappa_heads) == site.num_heads
        assert max(exact.sigma_max_heads) == exact.sigma_max and min(exact.sigma_min_heads) == exact.sigma_min
        assert exact.kappa_heads == pytest.approx(
            [a / b for a, b in zip(exact.sigma_max_heads, exact.sigma_min_heads)], rel=1e-12
        )
        assert max(exact.kappa_heads) <= exact.kappa


def test_closed_form_gram_matches_dense_jacobian_blocks():
    # F_h F_h^T is J_h J_h^T itself (not only its spectrum): J restricted to head h's output rows and
    # head h's rows of W_Q, W_K, W_V, from the dense Jacobian. Off-diagonal head blocks of J are zero.
    module, inputs, _ = _layouts()["d2_vit_rel_pos"]
    apply_init(module, "default", seed=1)
    site = find_attention(module)[0]
    fn = AttentionFunction(site, inputs)
    jac = dense_jacobian(fn)  # rows (token, channel); cols vec W_Q, vec W_K, vec W_V
    factors, structure, _ = head_factors(fn)
    assert structure == "closed_form"
    heads, dh, d_in = 2, 4, 8
    rows = jac.reshape(-1, heads, dh, jac.shape[1])
    for h in range(heads):
        j_h = rows[:, h].reshape(-1, jac.shape[1]).reshape(-1, 3, heads, dh * d_in)
        own = j_h[:, :, h].reshape(j_h.shape[0], -1)
        others = torch.cat([j_h[:, :, g] for g in range(heads) if g != h], dim=1)
        assert others.abs().max() == 0
        torch.testing.assert_close(factors[h] @ factors[h].T, own @ own.T, rtol=1e-10, atol=1e-12)


def test_rank_deficient_flagged_like_dense(factor_spectrum):
    # A repeated token duplicates rows of J in every head.
    torch.manual_seed(0)
    module = vit.Attention(8, num_heads=2, use_rel_pos=True, input_size=(2, 2), rel_pos_zero_init=False)
    apply_init(module, "conditioned", seed=0)
    site = find_attention(module)[0]
    x = torch.randn(1, 2, 2, 8, generator=_gen(8))
    x[0, 1, 1] = x[0, 0, 0]
    exact, dense = exact_conditioning(site, {"x": x}), dense_conditioning(site, {"x": x})
    assert exact.rank_deficient and dense.rank_deficient and math.isinf(exact.kappa) and math.isinf(dense.kappa)
    assert exact.numerical_rank == dense.numerical_rank < min(dense.shape)
    assert _close(exact.sigma_max, dense.sigma_max)
    assert exact.sigma_min <= 1e-12 * exact.sigma_max and dense.sigma_min <= 1e-12 * dense.sigma_max
    assert all(math.isinf(k) for k in exact.kappa_heads)
    # Tall J without q/k biases: the W_Q / W_K gauge leaves a null space (numerical rank as dense).
    module = vit.Attention(4, num_heads=1, qkv_bias=False)
    site = find_attention(module)[0]
    x = torch.randn(1, 4, 4, 4, generator=_gen(9))
    exact, dense = exact_conditioning(site, {"x": x}), dense_conditioning(site, {"x": x})
    assert exact.shape == (64, 48) and exact.rank_deficient and exact.numerical_rank == dense.numerical_rank


def test_unrecognised_variant_falls_back_to_autodiff():
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(0)
    module = timm_vit.Attention(8, num_heads=2, qk_norm=True, norm_layer=nn.LayerNorm)
    site = find_attention(module)[0]
    x = {"x": torch.randn(1, 4, 8, generator=_gen(10))}
    exact, dense = exact_conditioning(site, x), dense_conditioning(site, x)
    assert exact.structure == "autodiff" and _close(exact.kappa, dense.kappa)


def test_size_limit_names_the_alternative():
    module = vit.Attention(8, num_heads=2)
    site = find_attention(module)[0]
    with pytest.raises(ValueError, match=r"above max_entries=100; use method='matrix_free'"):
        exact_conditioning(site, {"x": torch.randn(1, 2, 2, 8)}, max_entries=100)


def test_measure_site_methods_and_per_head_fields():
    torch.manual_seed(0)
    module = vit.Attention(16, num_heads=4, use_rel_pos=True, input_size=(2, 2), rel_pos_zero_init=False)
    apply_init(module, "conditioned", seed=0)
    site = find_attention(module)[0]
    x = {"x": torch.randn(1, 2, 2, 16, generator=_gen(11))}
    auto = measure_site(site, x, method="auto", bound=False)
    assert auto.method == "exact" and auto.structure == "closed_form" and auto.converged
    assert _close(auto.kappa, dense_conditioning(site, x).kappa) and len(auto.kappa_heads) == 4
    free = measure_site(site, x, method="auto", max_entries=10, bound=False)  # does not fit: matrix-free
    assert free.method == "lanczos" and free.kappa_heads == [] and free.structure == ""
    # The one rule: "auto" is exact exactly when one head's factor (4 tokens x 4 channels by 3 x 4 x 4) fits.
    fn = AttentionFunction(site, x)
    assert [choose_method(fn, "auto", max_entries=n) for n in (16 * 48, 16 * 48 - 1)] == ["exact", "matrix_free"]
    assert choose_method(fn, "matrix_free") == "matrix_free" and choose_method(fn, "exact", max_entries=1) == "exact"
    with pytest.raises(ValueError, match=r"method must be one of \('auto', 'exact', 'matrix_free'\), got 'dense'"):
        measure_site(site, x, method="dense")


def test_coco_vitdet_b_hook_measures_exactly_at_its_token_budget():
    # The hook of configs/COCO/mask_rcnn_vitdet_b_100ep.py at period > 0 keeps 16 tokens per site and
    # method "auto"; at ViT-B width (768, 12 heads) one head's factor is 1024 x 3072, so auto is exact.
    import os

    from detectron2.config import LazyConfig

    from condinit_det.analysis import DEFAULT_MAX_ENTRIES
    from condinit_det.analysis.heads import factor_entries
    from condinit_det.analysis.hooks import build_conditioning_hook

    path = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "COCO", "mask_rcnn_vitdet_b_100ep.py")
    cfg = LazyConfig.apply_overrides(LazyConfig.load(path), ["condinit_analysis.period=1000", "train.output_dir=''"])
    hook = build_conditioning_hook(cfg, batch=[{"image": torch.zeros(3, 32, 32)}])
    assert hook.period == 1000 and hook.options["method"] == "auto" and hook.options["sites"] is None
    assert (hook.options["max_batch"], hook.options["max_tokens"]) == (1, 16)
    module = vit.Attention(768, num_heads=12, use_rel_pos=True, input_size=(14, 14))
    site = find_attention(module)[0]
    entries = factor_entries(AttentionFunction(site, {"x": torch.randn(1, 4, 4, 768)}))
    assert entries == 1024 * 3072 <= DEFAULT_MAX_ENTRIES


def test_kappa_plot_marks_and_counts_the_measured_points(monkeypatch):
    """Two measurements joined by a line are not a trajectory: every measured point is a marker, and the legend says
    how many there are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from condinit_det.report import plots

    drawn = {}

    def capture(path, draw, title, xlabel, ylabel):
        fig, ax = plt.subplots()
        draw(ax)
        drawn.update(
            title=title,
            xlabel=xlabel,
            lines={line.get_label(): (line.get_marker(), len(line.get_xdata())) for line in ax.get_lines()},
        )
        plt.close(fig)

    monkeypatch.setattr(plots, "_save", capture)
    five, two = np.array([0, 80, 160, 240, 320]), np.array([0, 400])
    sr = SimpleNamespace(
        scale=1.0,
        stage=SimpleNamespace(unit="epoch"),
        kappa={
            "default": (five, np.full(5, 4.0), np.full(5, 3.0), np.full(5, 5.0)),
            "conditioned": (two, np.array([2.0, 3.0]), np.array([1.0, 2.0]), np.array([3.0, 4.0])),
        },
    )
    assert plots._kappa_plot("kappa.png", sr)
    assert drawn["lines"] == {
        "default (median over sites, 5 measured points)": ("o", 5),
        "conditioned (median over sites, 2 measured points)": ("o", 2),
    }
    assert "markers: measured points" in drawn["title"]
    # The x axis is the stage's unit (a pretraining run measures per epoch).
    assert drawn["xlabel"] == "epoch" and "vs epoch" in drawn["title"]
