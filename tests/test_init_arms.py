"""The arms on every supported attention layout: exact math, isolation, determinism, errors."""

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from condinit_det.init import (
    ARMS,
    AttentionLayout,
    Projection,
    apply_init,
    find_attention,
    mimetic_noise_batch,
    register_attention_adapter,
    site_generator,
)


def _d2_vit():
    from detectron2.modeling.backbone.vit import Attention

    return Attention(dim=48, num_heads=4, use_rel_pos=True, rel_pos_zero_init=False, input_size=(4, 4)), lambda: (
        torch.randn(2, 4, 4, 48),
    )


def _d2_swin():
    from detectron2.modeling.backbone.swin import WindowAttention

    return WindowAttention(dim=48, window_size=(4, 4), num_heads=4), lambda: (torch.randn(3, 16, 48),)


def _d2_mvit():
    from detectron2.modeling.backbone.mvit import MultiScaleAttention

    # q/k/v output width (64) differs from the input width (32): a stage transition.
    return MultiScaleAttention(dim=32, dim_out=64, num_heads=4, pool_kernel=(3, 3), stride_q=1, stride_kv=2), lambda: (
        torch.randn(2, 8, 8, 32),
    )


def _mha_packed():
    return nn.MultiheadAttention(48, 4, batch_first=True), lambda: (torch.randn(2, 5, 48),) * 3


def _mha_separate():
    mha = nn.MultiheadAttention(48, 4, kdim=24, vdim=20, batch_first=True)
    return mha, lambda: (torch.randn(2, 5, 48), torch.randn(2, 7, 24), torch.randn(2, 7, 20))


def _timm_vit():
    from timm.models.vision_transformer import Attention

    return Attention(dim=48, num_heads=4, qkv_bias=True), lambda: (torch.randn(2, 9, 48),)


def _timm_xcit():
    from timm.models.xcit import XCA

    return XCA(dim=48, num_heads=4, qkv_bias=True), lambda: (torch.randn(2, 9, 48),)


def _timm_swin():
    from timm.models.swin_transformer import WindowAttention

    return WindowAttention(dim=48, num_heads=4, window_size=4), lambda: (torch.randn(3, 16, 48),)


def _timm_class_attn():
    from timm.models.cait import ClassAttn

    return ClassAttn(dim=48, num_heads=4, qkv_bias=True), lambda: (torch.randn(2, 9, 48),)


def _davit_window():
    from timm.models.davit import WindowAttention

    return WindowAttention(dim=48, window_size=(4, 4), num_heads=4), lambda: (torch.randn(3, 16, 48),)


def _davit_channel():
    from timm.models.davit import ChannelAttention

    # Used by davit_tiny ... davit_giant; its value role is the fused weight's first row block.
    return ChannelAttention(dim=48, num_heads=4, qkv_bias=True), lambda: (torch.randn(2, 9, 48),)


def _davit_channel_v2():
    from timm.models.davit import ChannelAttentionV2

    return ChannelAttentionV2(dim=48, num_heads=4, qkv_bias=True), lambda: (torch.randn(2, 9, 48),)


LAYOUTS = {
    "d2_vit": _d2_vit,
    "d2_swin": _d2_swin,
    "d2_mvit": _d2_mvit,
    "mha_packed": _mha_packed,
    "mha_separate": _mha_separate,
    "timm_vit": _timm_vit,
    "timm_xcit": _timm_xcit,
    "timm_swin": _timm_swin,
    "timm_class_attn": _timm_class_attn,
    "timm_davit_window": _davit_window,
    "timm_davit_channel": _davit_channel,
    "timm_davit_channel_v2": _davit_channel_v2,
}


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


EXPECTED_KIND = {"mha_packed": "mha", "mha_separate": "mha"}
# The arms whose weights depend on the seed (scale_matched rescales the default init: no draw).
DRAWING_ARMS = ("mimetic", "conditioned", "structured")


class Wrapper(nn.Module):
    """A small model: the attention layer between other layers the arms must not touch."""

    def __init__(self, attn):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.block = nn.Module()
        self.block.attn = attn
        self.head = nn.LayerNorm(8)


def build_layout(layout, dtype=torch.float64):
    torch.manual_seed(0)
    attn, inputs = LAYOUTS[layout]()
    model = Wrapper(attn).to(dtype)
    return model, inputs


def _forward(attn, inputs, dtype=torch.float64):
    out = attn(*[x.to(dtype) for x in inputs])
    return out[0] if isinstance(out, tuple) else out


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_is_found_with_its_dimensions(layout):
    model, _ = build_layout(layout)
    (site,) = find_attention(model)
    assert site.name == "block.attn"
    assert site.kind == EXPECTED_KIND.get(layout, layout)
    assert site.num_heads == 4
    assert site.dim_in == (32 if layout == "d2_mvit" else 48)
    assert site.dim == (64 if layout == "d2_mvit" else 48)
    assert site.head_dim == site.dim // 4
    if layout == "mha_separate":
        assert (site.dim_k_in, site.dim_v_in) == (24, 20)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("gain_qk,gain_v", [(1.0, 1.0), (0.5, 2.0)])
def test_conditioned_blocks_are_perfectly_conditioned(layout, gain_qk, gain_v):
    model, inputs = build_layout(layout)
    site = find_attention(model)[0]
    out_before = site.weight("o").clone()
    apply_init(model, "conditioned", seed=3, gain_qk=gain_qk, gain_v=gain_v)
    dh = site.head_dim
    blocks = []
    for role in ("q", "k"):
        w = site.weight(role)
        for h in range(site.num_heads):
            block = w[h * dh : (h + 1) * dh]
            sv = torch.linalg.svdvals(block)
            assert torch.allclose(sv, torch.full_like(sv, gain_qk), atol=1e-6 * gain_qk), (role, h, sv)
            assert sv.max() / sv.min() == pytest.approx(1.0, abs=1e-6)
            blocks.append(block.clone())
    # Every head block (Q and K alike) is a different draw.
    for i in range(len(blocks)):
        for j in range(i + 1, len(blocks)):
            if blocks[i].shape == blocks[j].shape:
                assert not torch.allclose(blocks[i], blocks[j])
    identity = torch.eye(site.dim_v, site.dim_v_in, dtype=torch.float64)
    assert torch.equal(site.weight("v"), gain_v * identity)
    for role in ("q", "k", "v"):
        bias = site.bias(role)
        if bias is not None:
            assert torch.count_nonzero(bias) == 0
    assert torch.equal(site.weight("o"), out_before)
    # The value path keeps the input: x W_V^T = gain_v * x on the first D_v coordinates.
    x = torch.randn(5, site.dim_v_in, dtype=torch.float64)
    v = x @ site.weight("v").T
    k = min(site.dim_v, site.dim_v_in)
    assert torch.allclose(v[:, :k], gain_v * x[:, :k])
    assert torch.isfinite(_forward(site.module, inputs())).all()


def test_conditioned_value_identity_selects_head_coordinates():
    model, _ = build_layout("timm_vit")
    site = find_attention(model)[0]
    apply_init(model, "conditioned", seed=0)
    x = torch.randn(3, 48, dtype=torch.float64)
    v = x @ site.weight("v").T
    dh = site.head_dim
    for h in range(site.num_heads):
        assert torch.equal(v[:, h * dh : (h + 1) * dh], x[:, h * dh : (h + 1) * dh])


def test_conditioned_shared_block_and_output_ablations():
    model, _ = build_layout("timm_vit")
    site = find_attention(model)[0]
    apply_init(model, "conditioned", seed=0, value_mode="shared_block", condition_output=True)
    dh = site.head_dim
    w_v = site.weight("v")
    for h in range(site.num_heads):
        assert torch.equal(w_v[h * dh : (h + 1) * dh], torch.eye(dh, 48, dtype=torch.float64))
    sv = torch.linalg.svdvals(site.weight("o"))
    assert torch.allclose(sv, torch.ones_like(sv), atol=1e-6)


def _replay_mimetic_noise(site, seed):
    """Recompute the arm's draws: one [H, D_in, D_k_in] draw of the heads' Q/K noises, then the V/O
    noise (std 1/sqrt(D_in))."""
    g = site_generator(seed, site.name)
    qk = mimetic_noise_batch(
        site.num_heads, site.dim_in, site.dim_k_in, std=site.dim_in**-0.5, noise="normal", generator=g
    )
    vo = mimetic_noise_batch(1, site.dim_v_in, site.dim_out, std=site.dim_v_in**-0.5, noise="normal", generator=g)[0]
    return list(qk), vo


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mimetic_products_match_the_targets(layout):
    model, inputs = build_layout(layout)
    site = find_attention(model)[0]
    a1, b1, a2, b2 = 0.7, 0.7, 0.4, 0.4
    apply_init(model, "mimetic", seed=11)
    qk_noise, vo_noise = _replay_mimetic_noise(site, 11)
    dh = site.head_dim
    for h, z in enumerate(qk_noise):
        w_q = site.weight("q")[h * dh : (h + 1) * dh]
        w_k = site.weight("k")[h * dh : (h + 1) * dh]
        target = a1 * z + b1 * torch.eye(*z.shape, dtype=torch.float64)
        u, s, vh = torch.linalg.svd(target, full_matrices=False)
        best = u[:, :dh] @ torch.diag(s[:dh]) @ vh[:dh]
        assert torch.allclose(w_q.T @ w_k, best, atol=1e-10)
    target_vo = a2 * vo_noise - b2 * torch.eye(*vo_noise.shape, dtype=torch.float64)
    product = site.weight("v").T @ site.weight("o").T
    assert torch.allclose(product, target_vo, atol=1e-10)
    assert torch.isfinite(_forward(site.module, inputs())).all()


def test_mimetic_noise_scale_is_one_over_sqrt_d():
    """Recover Z from the weights alone (Z = (W_v^T W_o^T + b2 I) / a2) and check its std."""
    attn = nn.MultiheadAttention(256, 8).double()
    apply_init(attn, "mimetic", seed=5, alpha2=0.5, beta2=0.3)
    w_v = attn.in_proj_weight[512:]
    z = (w_v.T @ attn.out_proj.weight.T + 0.3 * torch.eye(256, dtype=torch.float64)) / 0.5
    assert z.std().item() == pytest.approx(256**-0.5, rel=0.02)
    assert z.mean().abs().item() < 3 * 256**-0.5 / 256


def test_mimetic_uniform_noise_has_same_scale():
    attn = nn.MultiheadAttention(256, 8).double()
    apply_init(attn, "mimetic", seed=5, noise="uniform")
    z = (attn.in_proj_weight[512:].T @ attn.out_proj.weight.T + 0.4 * torch.eye(256, dtype=torch.float64)) / 0.4
    assert z.std().item() == pytest.approx(256**-0.5, rel=0.02)
    assert z.abs().max().item() <= 3**0.5 * 256**-0.5 + 1e-9


def test_mimetic_rank_limited_value_width_is_reported():
    from timm.models.vision_transformer import Attention

    # Value width 16 < model width 48: the V/O product can only be a rank-16 approximation.
    attn = Attention(dim=48, num_heads=4, attn_head_dim=4).double()
    report = apply_init(attn, "mimetic", seed=0)
    assert "rank-16" in report.sites[0].note


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_default_arm_changes_nothing(layout):
    model, _ = build_layout(layout)
    before = _state(model)
    report = apply_init(model, "default", seed=0)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [s.name for s in report.sites] == ["block.attn"]
    assert report.sites[0].changed == []


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("arm", ARMS)
def test_isolation_and_determinism(layout, arm):
    model, inputs = build_layout(layout)
    before = _state(model)
    rng = torch.get_rng_state()
    report = apply_init(model, arm, seed=7)
    assert torch.equal(rng, torch.get_rng_state()), "the global RNG must not advance"
    after = _state(model)
    changed = set(report.sites[0].changed)
    for name, value in before.items():
        if name not in changed:
            assert torch.equal(value, after[name]), f"{name} is not a target but changed"
    if arm != "default":
        assert any(not torch.equal(before[n], after[n]) for n in changed)
    # Same seed: bitwise identical. Different seed: different for the arms that draw.
    same, _ = build_layout(layout)
    apply_init(same, arm, seed=7)
    assert all(torch.equal(after[k], v) for k, v in same.state_dict().items())
    other, _ = build_layout(layout)
    apply_init(other, arm, seed=8)
    differs = any(not torch.equal(after[k], v) for k, v in other.state_dict().items())
    assert differs == (arm in DRAWING_ARMS)
    # The forward still runs and, for the non-default arms, its output changed.
    torch.manual_seed(1)
    x = inputs()
    y_armed = _forward(model.block.attn, x)
    fresh, _ = build_layout(layout)
    y_fresh = _forward(fresh.block.attn, x)
    assert y_armed.shape == y_fresh.shape and torch.isfinite(y_armed).all()
    assert torch.equal(y_armed, y_fresh) == (arm == "default")


@pytest.mark.parametrize("arm", ["mimetic", "conditioned"])
def test_low_precision_parameters_are_computed_in_float32(arm):
    """float32 parameters: the float32 working precision agrees with float64 parameters' values
    to float32 accuracy; float16 / bfloat16 parameters get those float32 values, rounded once."""
    ref = nn.MultiheadAttention(32, 4).double()
    f32 = copy.deepcopy(ref).float()
    apply_init(ref, arm, seed=2)
    apply_init(f32, arm, seed=2)
    assert f32.in_proj_weight.dtype == torch.float32
    assert (f32.in_proj_weight.double() - ref.in_proj_weight).abs().max() < 1e-5
    assert (f32.out_proj.weight.double() - ref.out_proj.weight).abs().max() < 1e-5
    for dtype in (torch.float16, torch.bfloat16):
        low = copy.deepcopy(ref).to(dtype)
        apply_init(low, arm, seed=2)
        assert low.in_proj_weight.dtype == dtype
        assert torch.equal(low.in_proj_weight, f32.in_proj_weight.to(dtype))


def test_site_draws_do_not_depend_on_other_sites():
    torch.manual_seed(0)
    a = nn.Sequential(nn.MultiheadAttention(16, 2), nn.MultiheadAttention(16, 2))
    b = nn.Sequential(nn.MultiheadAttention(16, 2), nn.MultiheadAttention(16, 2))
    b.load_state_dict(a.state_dict())
    apply_init(a, "conditioned", seed=0)
    apply_init(b, "conditioned", seed=0, include=["1"])
    assert torch.equal(a[1].in_proj_weight, b[1].in_proj_weight)
    assert not torch.equal(a[0].in_proj_weight, b[0].in_proj_weight)


def test_include_and_exclude_patterns():
    model = nn.Module()
    model.encoder = nn.ModuleList([nn.MultiheadAttention(16, 2) for _ in range(2)])
    model.decoder = nn.ModuleList([nn.MultiheadAttention(16, 2) for _ in range(2)])
    report = apply_init(model, "conditioned", seed=0, include=["encoder.*", "decoder.1"], exclude=["encoder.0"])
    assert [s.name for s in report.sites] == ["encoder.1", "decoder.1"]
    with pytest.raises(ValueError, match=r"include pattern 'backbone\.\*' matches no attention site.*encoder\.0"):
        apply_init(model, "conditioned", seed=0, include=["backbone.*"])
    with pytest.raises(ValueError, match="exclude pattern 'nothing' matches no attention site"):
        apply_init(model, "conditioned", seed=0, exclude="nothing")


def test_errors_name_what_is_accepted():
    attn = nn.MultiheadAttention(16, 2)
    with pytest.raises(
        ValueError, match="unknown arm 'orthogonal'; accepted arms: default, mimetic, conditioned, scale_matched"
    ):
        apply_init(attn, "orthogonal", seed=0)
    with pytest.raises(ValueError, match="not accepted by the 'conditioned' arm; accepted: gain_qk"):
        apply_init(attn, "conditioned", seed=0, alpha1=0.5)
    with pytest.raises(ValueError, match="value_mode must be one of identity, shared_block"):
        apply_init(attn, "conditioned", seed=0, value_mode="diag")
    with pytest.raises(ValueError, match="noise must be 'normal' or 'uniform'"):
        apply_init(attn, "mimetic", seed=0, noise="laplace")
    with pytest.raises(ValueError, match=r"no attention site found in Sequential; supported layouts: .*d2_vit"):
        apply_init(nn.Sequential(nn.Linear(4, 4)), "conditioned", seed=0)


class ToyAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_out = nn.Linear(dim, dim)


def _toy_layout(m):
    return AttentionLayout(
        num_heads=m.heads,
        projections={
            role: Projection(f"to_{name}.weight", bias=f"to_{name}.bias")
            for role, name in zip("qkvo", ("q", "k", "v", "out"))
        },
    )


def test_user_adapter_and_head_count_error():
    register_attention_adapter("toy", ToyAttention, _toy_layout)
    model = nn.Sequential(ToyAttention(12, 3))
    report = apply_init(model, "conditioned", seed=0)
    assert report.sites[0].kind == "toy"
    assert torch.equal(model[0].to_v.weight, torch.eye(12))
    assert torch.count_nonzero(model[0].to_q.bias) == 0
    with pytest.raises(ValueError, match="num_heads=5 does not divide the query/key width 12"):
        bad = ToyAttention(12, 3)
        bad.heads = 5
        find_attention(bad)


def test_mimetic_refuses_head_wider_than_the_key_input():
    attn = nn.MultiheadAttention(32, 2, kdim=8, vdim=8)  # head_dim 16 > kdim 8
    with pytest.raises(ValueError, match="head_dim <= min"):
        apply_init(attn, "mimetic", seed=0)


def test_report_is_json_and_saved_atomically(tmp_path):
    import json

    attn = nn.MultiheadAttention(16, 2)
    report = apply_init(attn, "mimetic", seed=4)
    path = tmp_path / "sub" / "report.json"
    report.save(str(path))
    data = json.loads(path.read_text())
    assert data["arm"] == "mimetic" and data["seed"] == 4
    assert data["sites"][0]["changed"] == ["in_proj_weight", "out_proj.weight"]
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def test_init_library_works_without_detectron2():
    code = (
        "import sys; sys.modules['detectron2'] = None\n"
        "import torch, condinit_det\n"
        "from condinit_det.init import apply_init\n"
        "r = apply_init(torch.nn.MultiheadAttention(16, 2), 'conditioned', seed=0)\n"
        "assert len(r.sites) == 1\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
