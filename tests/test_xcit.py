"""XCiT detectron2 backbone: shapes and strides, timm naming and numerics, attention sites, demo config."""

import os

import pytest
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage
from timm.models.xcit import Xcit

from condinit_det.init import apply_init, find_attention
from condinit_det.modeling.convert import convert_timm_checkpoint
from condinit_det.modeling.xcit import XCiT

torch.set_num_threads(min(2, torch.get_num_threads()))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(embed_dim=64, depth=2, num_heads=4)  # dh = 16


def _tiny(**kwargs):
    torch.manual_seed(0)
    return XCiT(**{**TINY, **kwargs}).eval()


@pytest.mark.parametrize("patch_size", [16, 8])
def test_output_shape_and_stride(patch_size):
    model = _tiny(patch_size=patch_size, out_feature="feat")
    spec = model.output_shape()
    assert list(spec) == ["feat"]
    assert spec["feat"].channels == 64 and spec["feat"].stride == patch_size
    assert model.size_divisibility == patch_size
    with torch.no_grad():
        for hp, wp in [(2, 3), (4, 4), (1, 5), (6, 2)]:  # output grid sizes
            out = model(torch.randn(2, 3, hp * patch_size, wp * patch_size))
            assert list(out) == ["feat"]
            assert out["feat"].shape == (2, 64, hp, wp)
            assert torch.isfinite(out["feat"]).all()


def test_output_is_spatially_consistent():
    # The feature map must keep the image layout: a local change to the image moves the features
    # of nearby cells much more than those of far cells (LPI and patch embedding are local; XCA
    # mixes channels, not positions).
    model = _tiny(use_pos_embed=False)
    x = torch.randn(1, 3, 64, 128)
    y = x.clone()
    y[:, :, :16, :16] += 3.0  # top-left patch only
    with torch.no_grad():
        d = (model(x)["last_feat"] - model(y)["last_feat"]).abs().sum(1)[0]  # (4, 8)
    assert d[0, 0] > 0
    assert d[0, 0] > 10 * d[-1, -1]


def test_bad_inputs_and_arguments():
    model = _tiny()
    with pytest.raises(ValueError, match="multiples of patch_size=16"):
        model(torch.randn(1, 3, 40, 48))
    with pytest.raises(ValueError, match="patch_size must be 8 or 16"):
        XCiT(patch_size=14, **TINY)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        XCiT(embed_dim=64, depth=1, num_heads=5)
    with pytest.raises(ValueError, match="divisible by 8"):
        XCiT(embed_dim=60, depth=1, num_heads=4)


def _timm_twin():
    torch.manual_seed(0)
    timm_model = Xcit(img_size=64, patch_size=16, num_classes=10, cls_attn_layers=1, eta=1.0, **TINY).eval()
    ours = XCiT(**TINY).eval()
    return timm_model, ours


def test_state_dict_keys_mirror_timm():
    timm_model, ours = _timm_twin()
    timm_sd, ours_sd = timm_model.state_dict(), ours.state_dict()
    assert set(ours_sd) <= set(timm_sd)
    for key, value in ours_sd.items():
        assert timm_sd[key].shape == value.shape, key
    extra = {k.split(".")[0] for k in set(timm_sd) - set(ours_sd)}
    assert extra == {"cls_token", "cls_attn_blocks", "norm", "head"}
    assert "blocks.1.attn.qkv.weight" in ours_sd and "pos_embed.token_projection.weight" in ours_sd


def test_matches_timm_numerically_after_checkpoint_conversion():
    timm_model, ours = _timm_twin()
    converted = convert_timm_checkpoint(timm_model.state_dict(), ours)
    assert ours.load_state_dict(converted, strict=True)
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        expected = timm_model.forward_intermediates(x, indices=[TINY["depth"] - 1], intermediates_only=True)[0]
        got = ours(x)["last_feat"]
    assert got.shape == expected.shape == (2, 64, 3, 5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_convert_checkpoint_official_layout_and_errors():
    timm_model, _ = _timm_twin()
    sd = {k.replace("pos_embed.", "pos_embeder."): v for k, v in timm_model.state_dict().items()}
    model = torch.nn.Module()
    model.backbone = torch.nn.Module()
    model.backbone.net = XCiT(**TINY)
    converted = convert_timm_checkpoint({"model": sd}, model)
    assert converted.prefix == "backbone.net." and converted.missing == []
    assert "backbone.net.pos_embed.token_projection.weight" in converted
    assert {"cls_token", "norm.weight", "head.weight"} <= set(converted.dropped)
    assert any(k.startswith("cls_attn_blocks.") for k in converted.dropped)
    assert set(converted) == set(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"condinit_det XCiT .* at backbone\.net: keys the trunk has no place for "
        r"\(1\): dist_token; pretrain",
    ):
        convert_timm_checkpoint({**sd, "dist_token": torch.zeros(1)}, model)
    with pytest.raises(ValueError, match=r"trunk keys it lacks \(\d+\): patch_embed\."):
        convert_timm_checkpoint({"head.weight": torch.zeros(1)}, model)


def test_default_init_matches_timm_statistics():
    model = XCiT(embed_dim=128, depth=1, num_heads=4)
    qkv = model.blocks[0].attn.qkv
    assert abs(qkv.weight.std().item() - 0.02) < 0.002  # truncated normal std 0.02
    assert torch.all(qkv.bias == 0)
    assert torch.all(model.blocks[0].gamma1 == 1.0)


def test_sync_bn_keeps_names_and_runs_in_eval():
    plain, synced = _tiny(), _tiny(sync_bn=True)
    assert set(plain.state_dict()) == set(synced.state_dict())
    bns = [m for m in synced.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(isinstance(m, torch.nn.SyncBatchNorm) for m in bns)
    synced.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(synced(x)["last_feat"], plain(x)["last_feat"])


def test_activation_checkpointing_gives_same_gradients():
    grads = []
    for ckpt in (False, True):
        model = _tiny(use_act_checkpoint=ckpt).train()
        torch.manual_seed(1)
        model(torch.randn(2, 3, 32, 32))["last_feat"].square().mean().backward()
        grads.append(model.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_find_attention_and_conditioned_arm():
    model = _tiny()
    sites = find_attention(model)
    assert [s.name for s in sites] == ["blocks.0.attn", "blocks.1.attn"]
    for site in sites:
        assert site.kind == "timm_xcit"
        assert (site.dim_in, site.dim, site.dim_v, site.num_heads, site.head_dim) == (64, 64, 64, 4, 16)
    proj_before = model.blocks[0].attn.proj.weight.clone()
    report = apply_init(model, "conditioned", seed=3)
    assert [s.name for s in report.sites] == ["blocks.0.attn", "blocks.1.attn"]
    site = find_attention(model)[0]
    for role in ("q", "k"):
        w = site.weight(role).double()
        for h in range(4):
            block = w[h * 16 : (h + 1) * 16]
            torch.testing.assert_close(block @ block.T, torch.eye(16, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(site.weight("v"), torch.eye(64))
    assert torch.all(site.bias("q") == 0)
    assert torch.equal(model.blocks[0].attn.proj.weight, proj_before)  # W_O keeps its default init
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 32, 32))["last_feat"]).all()


def test_demo_config_builds_trains_one_step():
    cfg = LazyConfig.load(os.path.join(REPO, "configs/demo/mask_rcnn_xcit_tiny.py"))
    assert cfg.condinit.arm == "default" and list(cfg.condinit.include) == ["backbone.net.*"]
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    assert isinstance(model.backbone.net, XCiT)
    sites = find_attention(model)
    assert [s.name for s in sites] == [f"backbone.net.blocks.{i}.attn" for i in range(4)]
    assert {s.kind for s in sites} == {"timm_xcit"}

    model.train()
    inst = Instances((128, 128))
    inst.gt_boxes = Boxes(torch.tensor([[10.0, 12.0, 50.0, 60.0], [70.0, 64.0, 120.0, 110.0]]))
    inst.gt_classes = torch.tensor([0, 3])
    masks = torch.zeros(2, 128, 128, dtype=torch.bool)
    masks[0, 12:60, 10:50] = True
    masks[1, 64:110, 70:120] = True
    inst.gt_masks = BitMasks(masks)
    batch = [{"image": torch.randint(0, 255, (3, 128, 128)).float(), "instances": inst}] * 2
    with EventStorage(0):
        losses = model(batch)
    assert {"loss_cls", "loss_box_reg", "loss_mask", "loss_rpn_cls", "loss_rpn_loc"} <= set(losses)
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    grad = model.backbone.net.blocks[0].attn.qkv.weight.grad
    assert grad is not None and grad.abs().sum() > 0
