"""DaViT attention sites: window attention and channel attention (roles by what each block does)."""

import copy

import pytest
import torch

from condinit_det.init import apply_init, find_attention

timm = pytest.importorskip("timm")
from timm.models.davit import ChannelAttention, ChannelAttentionV2, WindowAttention  # noqa: E402

DIM, HEADS = 48, 4
DH = DIM // HEADS


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _module(kind):
    torch.manual_seed(0)
    if kind == "window":
        return WindowAttention(dim=DIM, window_size=(3, 3), num_heads=HEADS).double()
    if kind == "channel":
        return ChannelAttention(dim=DIM, num_heads=HEADS, qkv_bias=True).double()
    return ChannelAttentionV2(dim=DIM, num_heads=HEADS, qkv_bias=True).double()


KINDS = ["window", "channel", "channel_v2"]


def _uniform_attention_output(site, x, over_channels):
    """The module's output when every attention weight is equal: each output is the mean of the
    values over the tokens of the window (spatial) or over the head's channels (channel attention)."""
    v = x @ site.weight("v").T + site.bias("v")  # [B, N, D]
    if over_channels:
        b, n, _ = v.shape
        mixed = v.view(b, n, HEADS, DH).mean(-1, keepdim=True).expand(b, n, HEADS, DH).reshape(b, n, DIM)
    else:
        mixed = v.mean(1, keepdim=True).expand_as(v)
    out = site.module.proj
    return mixed @ out.weight.T + out.bias


@pytest.mark.parametrize("kind", KINDS)
def test_roles_are_what_the_forward_does(kind):
    """Zeroing the query role makes every attention weight equal; zeroing the value role leaves the
    output projection's bias. Both pin which fused rows are Q, K and V."""
    attn = _module(kind)
    (site,) = find_attention(attn)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    q_zero = copy.deepcopy(attn)
    (q_site,) = find_attention(q_zero)
    q_site.weight("q").zero_()
    q_site.bias("q").zero_()
    expected = _uniform_attention_output(q_site, x, over_channels=kind != "window")
    torch.testing.assert_close(q_zero(x), expected, rtol=1e-10, atol=1e-10)
    v_zero = copy.deepcopy(attn)
    (v_site,) = find_attention(v_zero)
    v_site.weight("v").zero_()
    v_site.bias("v").zero_()
    torch.testing.assert_close(v_zero(x), v_zero.proj.bias.expand(2, 9, DIM), rtol=0, atol=1e-12)
    # Zeroing the key role also makes the weights equal (the logits are products of Q and K).
    k_zero = copy.deepcopy(attn)
    (k_site,) = find_attention(k_zero)
    k_site.weight("k").zero_()
    k_site.bias("k").zero_()
    torch.testing.assert_close(
        k_zero(x), _uniform_attention_output(k_site, x, kind != "window"), rtol=1e-10, atol=1e-10
    )
    assert site.num_heads == HEADS and site.dim == DIM


def test_channel_attention_value_is_the_first_row_block():
    """ChannelAttention computes softmax(k^T v) q^T: the first fused block carries the values."""
    attn = _module("channel")
    (site,) = find_attention(attn)
    assert site.kind == "timm_davit_channel"
    assert (site.projections["v"].rows, site.projections["q"].rows, site.projections["k"].rows) == (
        slice(0, DIM),
        slice(DIM, 2 * DIM),
        slice(2 * DIM, 3 * DIM),
    )
    apply_init(attn, "conditioned", seed=0)
    w = attn.qkv.weight
    assert torch.equal(w[:DIM], torch.eye(DIM, dtype=torch.float64))
    for block in (w[DIM : 2 * DIM], w[2 * DIM :]):
        for h in range(HEADS):
            sv = torch.linalg.svdvals(block[h * DH : (h + 1) * DH])
            torch.testing.assert_close(sv, torch.ones_like(sv), rtol=0, atol=1e-12)
    assert torch.count_nonzero(attn.qkv.bias) == 0


def test_channel_attention_v2_uses_the_standard_order():
    attn = _module("channel_v2")
    (site,) = find_attention(attn)
    assert site.kind == "timm_davit_channel_v2" and site.num_heads == attn.groups
    apply_init(attn, "conditioned", seed=0)
    assert torch.equal(attn.qkv.weight[2 * DIM :], torch.eye(DIM, dtype=torch.float64))


@pytest.mark.parametrize("cls", [ChannelAttention, WindowAttention, ChannelAttentionV2])
def test_head_count_must_divide_the_width(cls):
    kwargs = {"window_size": (3, 3)} if cls is WindowAttention else {}
    attn = cls(dim=DIM, num_heads=5, **kwargs)
    with pytest.raises(ValueError, match="num_heads=5 does not divide the query/key width 48"):
        find_attention(attn)


@pytest.fixture(scope="module")
def davit_tiny():
    torch.manual_seed(0)
    return timm.create_model("davit_tiny", pretrained=False).eval()


def test_davit_tiny_has_one_site_per_attention_block(davit_tiny):
    sites = find_attention(davit_tiny)
    blocks = [name for name, m in davit_tiny.named_modules() if type(m).__name__ in ("SpatialBlock", "ChannelBlock")]
    assert len(blocks) == 12  # depths (1, 1, 3, 1), a spatial and a channel block each
    assert [s.name for s in sites] == [f"{b}.attn" for b in blocks]
    kinds = [s.kind for s in sites]
    assert kinds == ["timm_davit_window", "timm_davit_channel"] * 6
    assert [s.num_heads for s in sites] == [3, 3, 6, 6] + [12] * 6 + [24, 24]
    assert all(s.head_dim == 32 for s in sites)


@pytest.mark.parametrize("arm", ["default", "conditioned", "mimetic"])
def test_arms_on_the_whole_davit_tiny(davit_tiny, arm):
    model = copy.deepcopy(davit_tiny)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_init(model, arm, seed=1)
    assert len(report.sites) == 12
    after = model.state_dict()
    changed = set(report.changed_parameters())
    assert all(torch.equal(before[k], after[k]) for k in before if k not in changed)
    assert (len(changed) > 0) == (arm != "default")
    if arm == "conditioned":
        for site in find_attention(model):
            for role in ("q", "k"):
                w = site.weight(role)
                for h in range(site.num_heads):
                    sv = torch.linalg.svdvals(w[h * 32 : (h + 1) * 32].double())
                    torch.testing.assert_close(sv, torch.ones_like(sv), rtol=0, atol=1e-5)
            assert torch.equal(site.weight("v"), torch.eye(site.dim, dtype=site.weight("v").dtype))
    out = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 1000) and torch.isfinite(out).all()
