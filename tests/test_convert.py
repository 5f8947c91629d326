"""timm -> detectron2 checkpoint conversion: same features where the architectures compute the same
function, position-embedding interpolation, refusals, and the fine-tuning configs."""

import os
from functools import partial

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from detectron2.config import LazyConfig, instantiate
from detectron2.modeling import SwinTransformer, ViT
from detectron2.modeling.backbone.swin import PatchMerging as D2PatchMerging
from timm.layers import resample_abs_pos_embed
from timm.models.deit import VisionTransformerDistilled
from timm.models.swin_transformer import PatchMerging as TimmPatchMerging
from timm.models.swin_transformer import SwinTransformer as TimmSwin
from timm.models.vision_transformer import VisionTransformer
from timm.models.xcit import Xcit

from condinit_det.init import find_attention
from condinit_det.modeling.convert import ConvertedCheckpoint, convert_timm_checkpoint
from condinit_det.modeling.xcit import XCiT, XCiTDeconvPyramid

torch.set_num_threads(min(2, torch.get_num_threads()))

COCO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "COCO")
LN6 = partial(nn.LayerNorm, eps=1e-6)  # timm ViT / XCiT norms; detectron2 ViT configs use the same


def _in(path: str, module: nn.Module) -> nn.Module:
    """``module`` held at the dotted ``path`` of a container model (as in a detectron2 model)."""
    root = holder = nn.Module()
    parts = path.split(".")
    for part in parts[:-1]:
        child = nn.Module()
        holder.add_module(part, child)
        holder = child
    holder.add_module(parts[-1], module)
    return root


def _timm_vit(**kw):
    args = dict(img_size=64, patch_size=16, embed_dim=48, depth=2, num_heads=3, num_classes=5)
    args.update(kw)
    torch.manual_seed(0)
    return VisionTransformer(**args).eval()


def _d2_vit(**kw):
    args = dict(
        img_size=64,
        patch_size=16,
        embed_dim=48,
        depth=2,
        num_heads=3,
        norm_layer=LN6,
        pretrain_img_size=64,
        pretrain_use_cls_token=False,
    )
    args.update(kw)
    torch.manual_seed(1)
    return ViT(**args).eval()


# ---------------------------------------------------------------------------------------------
# ViT / DeiT
# ---------------------------------------------------------------------------------------------


def test_vit_features_match_timm():
    # No class token, global attention, no relative positions: detectron2's ViT computes timm's
    # token features (timm's final norm is not part of detectron2's ViT: compare before it).
    timm_vit = _timm_vit(class_token=False, global_pool="avg")
    ours = _d2_vit()
    model = _in("backbone.net", ours)
    converted = convert_timm_checkpoint(timm_vit.state_dict(), model)
    assert isinstance(converted, ConvertedCheckpoint) and converted.prefix == "backbone.net."
    assert set(converted) == set(model.state_dict())
    assert converted.missing == []
    assert set(converted.dropped) == {"fc_norm.weight", "fc_norm.bias", "head.weight", "head.bias"}
    model.load_state_dict(converted, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = timm_vit.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        got = ours(x)["last_feat"]
    assert got.shape == expected.shape == (2, 48, 4, 4)
    assert (got - expected).abs().max() <= 1e-5


def test_vit_class_token_checkpoint_and_pos_embed_interpolation():
    timm_vit = _timm_vit()  # class token, 4x4 grid
    pos = timm_vit.pos_embed.detach()
    ours = _d2_vit(img_size=96, pretrain_img_size=96, pretrain_use_cls_token=True, use_rel_pos=True)  # 6x6 grid
    converted = convert_timm_checkpoint(timm_vit.state_dict(), ours)
    assert "pos_embed grid interpolated (bicubic) from 4x4 to 6x6" in converted.notes
    result = ours.load_state_dict(converted, strict=False)
    assert not result.unexpected_keys
    rel = sorted(f"blocks.{i}.attn.rel_pos_{a}" for i in range(2) for a in "hw")
    assert sorted(result.missing_keys) == rel == converted.missing  # ViTDet's relative positions keep their init
    assert {"cls_token", "norm.weight", "head.weight"} <= set(converted.dropped)

    new = ours.pos_embed.detach()
    assert new.shape == (1, 1 + 36, 48)
    torch.testing.assert_close(new[:, :1], pos[:, :1], rtol=0, atol=0)  # class slot kept
    grid = pos[:, 1:].reshape(1, 4, 4, 48).permute(0, 3, 1, 2)
    explicit = F.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False)
    explicit = explicit.permute(0, 2, 3, 1).reshape(1, 36, 48)
    torch.testing.assert_close(new[:, 1:], explicit, rtol=0, atol=1e-6)
    # Not timm's default kernel: antialias=True uses another cubic kernel, even when upsampling.
    antialiased = resample_abs_pos_embed(pos, (6, 6), num_prefix_tokens=1)
    assert (new[:, 1:] - antialiased[:, 1:]).abs().max() > 1e-4
    with torch.no_grad():
        assert ours(torch.randn(1, 3, 96, 128))["last_feat"].shape == (1, 48, 6, 8)

    # A target without the class slot gets the grid only; the same grid needs no interpolation.
    same = convert_timm_checkpoint(timm_vit.state_dict(), _d2_vit())
    torch.testing.assert_close(same["pos_embed"], pos[:, 1:], rtol=0, atol=0)
    assert not any("interpolated" in n for n in same.notes)


def test_vit_table_without_prefix_slots_gets_a_zero_class_slot():
    timm_vit = _timm_vit(no_embed_class=True)  # DeiT-3 style: class token, but no position slot for it
    pos = timm_vit.pos_embed.detach()
    assert pos.shape == (1, 16, 48)
    converted = convert_timm_checkpoint(timm_vit.state_dict(), _d2_vit(pretrain_use_cls_token=True))
    assert torch.equal(converted["pos_embed"], torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1))
    assert any("has no class slot" in n for n in converted.notes)
    odd = {**timm_vit.state_dict(), "pos_embed": torch.zeros(1, 15, 48)}
    with pytest.raises(ValueError, match=r"pos_embed of shape \(1, 15, 48\) is not a square grid \(\+1 prefix slots\)"):
        convert_timm_checkpoint(odd, _d2_vit())


def test_distilled_deit_drops_the_distillation_token():
    torch.manual_seed(0)
    deit = VisionTransformerDistilled(img_size=64, patch_size=16, embed_dim=48, depth=2, num_heads=3, num_classes=5)
    sd = deit.state_dict()
    assert sd["pos_embed"].shape == (1, 2 + 16, 48)
    ours = _d2_vit(pretrain_use_cls_token=True)
    converted = convert_timm_checkpoint(sd, ours)
    assert converted.prefix == "" and converted.missing == []
    assert {"cls_token", "dist_token", "head_dist.weight"} <= set(converted.dropped)
    assert any("distillation" in n for n in converted.notes)
    expected = torch.cat([sd["pos_embed"][:, :1], sd["pos_embed"][:, 2:]], dim=1)
    torch.testing.assert_close(converted["pos_embed"], expected, rtol=0, atol=0)
    ours.load_state_dict(converted, strict=True)


def test_vit_layerscale_and_foreign_parts_are_refused():
    with pytest.raises(
        ValueError,
        match=r"has no place for \(4\): blocks\.0\.ls1\.gamma, .*"
        r"detectron2's ViT has no LayerScale",
    ):
        convert_timm_checkpoint(_timm_vit(init_values=1e-5).state_dict(), _d2_vit(pretrain_use_cls_token=True))
    with pytest.raises(ValueError, match=r"has no place for \(8\): blocks\.0\.attn\.q_norm\.weight"):
        convert_timm_checkpoint(_timm_vit(qk_norm=True).state_dict(), _d2_vit(pretrain_use_cls_token=True))


def test_vit_head_count_is_checked_when_the_timm_model_is_named():
    # A ViT state dict does not record its head count; naming the timm model supplies it.
    torch.manual_seed(0)
    sd = VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3).state_dict()
    ours = _in("backbone.net", ViT(img_size=224, embed_dim=192, depth=12, num_heads=4, norm_layer=LN6))
    assert len(convert_timm_checkpoint(sd, ours)) == len(ours.state_dict())  # not detectable without the name
    with pytest.raises(
        ValueError,
        match=r"the timm 'vit_tiny_patch16_224' checkpoint \(embed_dim=192, 12 attention "
        r"blocks, num_heads=3\) does not fit the model's trunk, a detectron2 ViT "
        r"\(embed_dim=192, 12 attention blocks, num_heads=4\) at backbone\.net",
    ):
        convert_timm_checkpoint(sd, ours, timm_model_name="vit_tiny_patch16_224")
    with pytest.raises(ValueError, match="not a 'vit_small_patch16_224' state dict"):
        convert_timm_checkpoint(sd, ours, timm_model_name="vit_small_patch16_224")
    with pytest.raises(ValueError, match=r"it is a timm SwinTransformer, not a VisionTransformer; "):
        convert_timm_checkpoint(sd, ours, timm_model_name="swin_tiny_patch4_window7_224")


# ---------------------------------------------------------------------------------------------
# Swin
# ---------------------------------------------------------------------------------------------

SWIN = dict(patch_size=4, embed_dim=48, depths=(2, 2, 2, 2), num_heads=(3, 6, 12, 24), window_size=2)


def _timm_swin(img_size=128, **kw):
    torch.manual_seed(0)
    model = TimmSwin(img_size=img_size, num_classes=5, **{**SWIN, **kw}).eval()
    with torch.no_grad():  # non-trivial norms, so a misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
    return model


def _d2_swin(**kw):
    torch.manual_seed(1)
    return SwinTransformer(**{**SWIN, "drop_path_rate": 0.0, **kw}).eval()


def test_swin_stage_outputs_match_timm():
    # 128 px, window 2: every stage's grid (32, 16, 8, 4) is larger than the window, so timm shifts
    # every odd block as detectron2 does and the two compute the same function.
    timm_swin, ours = _timm_swin(), _d2_swin()
    model = _in("backbone.bottom_up", ours)
    converted = convert_timm_checkpoint(timm_swin.state_dict(), model)
    assert converted.prefix == "backbone.bottom_up."
    assert "backbone.bottom_up.layers.0.downsample.reduction.weight" in converted  # timm's layers.1.downsample
    assert not any(".layers.3.downsample." in k for k in converted)
    assert converted.missing == [f"backbone.bottom_up.norm{i}.{p}" for i in range(3) for p in ("bias", "weight")]
    assert set(converted.dropped) == {"head.fc.weight", "head.fc.bias"}
    result = model.load_state_dict(converted, strict=False)
    assert not result.unexpected_keys
    assert {k for k in result.missing_keys if "relative_position_index" not in k} == set(converted.missing)
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        out = ours(x)
        stages = timm_swin.forward_intermediates(x, intermediates_only=True)
        final = timm_swin.forward_features(x)
        for i in range(4):
            # detectron2 normalizes each output with norm{i}; norm0-2 keep their init, norm3 is timm's final norm
            expected = getattr(ours, f"norm{i}")(stages[i].permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            assert out[f"p{i}"].shape == expected.shape == (2, 48 * 2**i, 32 // 2**i, 32 // 2**i)
            assert (out[f"p{i}"] - expected).abs().max() <= 1e-5, i
        assert (out["p3"] - final.permute(0, 3, 1, 2)).abs().max() <= 1e-5


def test_swin_patch_merging_channel_order_is_the_same():
    torch.manual_seed(0)
    timm_pm, d2_pm = TimmPatchMerging(dim=8), D2PatchMerging(dim=8)
    with torch.no_grad():
        timm_pm.norm.weight.uniform_(0.5, 1.5)
        timm_pm.norm.bias.uniform_(-0.5, 0.5)
    d2_pm.load_state_dict(timm_pm.state_dict())  # same names, weights copied unchanged
    x = torch.randn(2, 6, 10, 8)  # (B, H, W, C)
    with torch.no_grad():
        expected = timm_pm(x).reshape(2, -1, 16)
        got = d2_pm(x.reshape(2, 60, 8), 6, 10)
    assert (got - expected).abs().max() <= 1e-6


def test_swin_official_layout_converts_to_the_same_weights():
    sd = _timm_swin().state_dict()
    official = {}
    for k, v in sd.items():
        if ".downsample." in k:
            stage, rest = k[len("layers.") :].split(".", 1)
            k = f"layers.{int(stage) - 1}.{rest}"
        official[k.replace("head.fc.", "head.")] = v
    ours = _d2_swin()
    a = convert_timm_checkpoint(sd, ours)
    b = convert_timm_checkpoint({"model": official}, ours)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_swin_final_norm_dropped_when_the_last_stage_is_not_an_output():
    converted = convert_timm_checkpoint(_timm_swin().state_dict(), _d2_swin(out_indices=(0, 1, 2)))
    assert "norm.weight" in converted.dropped and not any(k.startswith("norm3") for k in converted)


# ---------------------------------------------------------------------------------------------
# XCiT
# ---------------------------------------------------------------------------------------------

XCIT = dict(patch_size=16, embed_dim=64, depth=4, num_heads=4, eta=1.0)


def _timm_xcit():
    torch.manual_seed(0)
    return Xcit(img_size=64, num_classes=5, cls_attn_layers=1, **XCIT).eval()


def test_xcit_trunk_matches_timm_through_the_entry_point():
    timm_xcit = _timm_xcit()
    torch.manual_seed(1)
    neck = XCiTDeconvPyramid(XCiT(**XCIT, out_indices=(0, 1, 2, 3))).eval()
    model = _in("backbone.bottom_up", neck)
    converted = convert_timm_checkpoint({"state_dict": timm_xcit.state_dict()}, model)
    assert converted.prefix == "backbone.bottom_up.net."
    assert converted.trunk_missing == []
    assert converted.missing and all(k.startswith("backbone.bottom_up.fpn") for k in converted.missing)  # the neck
    assert {"cls_token", "norm.weight", "head.weight"} <= set(converted.dropped)
    model.load_state_dict(converted, strict=False)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = timm_xcit.forward_intermediates(x, indices=[0, 1, 2, 3], intermediates_only=True)
        got = neck.net(x)
    for i in range(4):
        assert got[f"block{i}"].shape == expected[i].shape == (2, 64, 4, 6)
        assert (got[f"block{i}"] - expected[i]).abs().max() <= 1e-5, i


# ---------------------------------------------------------------------------------------------
# Wrapped checkpoints and refusals
# ---------------------------------------------------------------------------------------------


def test_wrapped_checkpoints_convert_alike():
    sd = _timm_vit().state_dict()
    wrapped = {"epoch": 3, "state_dict": {"module." + k: v for k, v in sd.items()}}  # timm training script, DDP
    plain, unwrapped = convert_timm_checkpoint(sd, _d2_vit()), convert_timm_checkpoint(wrapped, _d2_vit())
    assert plain.keys() == unwrapped.keys() and all(torch.equal(plain[k], unwrapped[k]) for k in plain)


def test_another_architecture_is_refused_with_one_clear_error():
    vit_model = _in("backbone.net", _d2_vit())
    with pytest.raises(
        ValueError,
        match=r"the checkpoint \(no timm model name recorded\) does not fit the model's "
        r"trunk, a detectron2 ViT \(embed_dim=48, 2 attention blocks, num_heads=3\) "
        r"at backbone\.net: keys the trunk has no place for \(115\): "
        r"patch_embed\.norm\.weight, patch_embed\.norm\.bias, layers\.0\.blocks\.0\.",
    ):
        convert_timm_checkpoint(_timm_swin(img_size=64).state_dict(), vit_model)
    with pytest.raises(
        ValueError,
        match=r"a detectron2 ViT .*no place for \(128\): patch_embed\.proj\.0\.0\.weight, .*"
        r"blocks\.0\.attn\.qkv\.weight \(192, 64\) vs \(144, 48\)",
    ):
        convert_timm_checkpoint(_timm_xcit().state_dict(), vit_model)
    with pytest.raises(
        ValueError,
        match=r"no place for \(1\): conv1\.weight; trunk keys it lacks \(26\): "
        r"patch_embed\.proj\.weight",
    ):
        convert_timm_checkpoint({"conv1.weight": torch.zeros(1)}, vit_model)


def test_another_size_is_refused_with_one_clear_error():
    with pytest.raises(
        ValueError,
        match=r"another shape \(checkpoint vs trunk\) \(\d+\): patch_embed\.proj\.weight "
        r"\(48, 3, 16, 16\) vs \(64, 3, 16, 16\)",
    ):
        convert_timm_checkpoint(_timm_vit().state_dict(), _in("backbone.net", _d2_vit(embed_dim=64, num_heads=4)))
    with pytest.raises(
        ValueError,
        match=r"ViT \(embed_dim=48, 3 attention blocks, num_heads=3\) at <root>: "
        r"trunk keys it lacks \(12\): blocks\.2\.",
    ):
        convert_timm_checkpoint(_timm_vit().state_dict(), _d2_vit(depth=3))
    with pytest.raises(ValueError, match=r"patch_embed\.proj\.weight \(48, 3, 16, 16\) vs \(48, 3, 8, 8\)"):
        convert_timm_checkpoint(_timm_vit().state_dict(), _d2_vit(patch_size=8, pretrain_img_size=32))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.relative_position_bias_table \(9, 3\) vs \(49, 2\)"):
        convert_timm_checkpoint(_timm_swin(img_size=64).state_dict(), _d2_swin(num_heads=(2, 4, 8, 16), window_size=4))
    with pytest.raises(ValueError, match=r"trunk keys it lacks \(\d+\): layers\.2\.blocks\.2\."):
        convert_timm_checkpoint(_timm_swin(img_size=64).state_dict(), _d2_swin(depths=(2, 2, 4, 2)))
    with pytest.raises(
        ValueError,
        match=r"a condinit_det XCiT \(embed_dim=64, 4 attention blocks, num_heads=8\) .*"
        r"blocks\.0\.attn\.temperature \(4, 1, 1\) vs \(8, 1, 1\)",
    ):
        convert_timm_checkpoint(_timm_xcit().state_dict(), XCiT(**{**XCIT, "num_heads": 8}))


def test_trunk_search_errors():
    with pytest.raises(ValueError, match="no transformer trunk in Linear"):
        convert_timm_checkpoint(_timm_vit().state_dict(), nn.Linear(2, 2))
    two = nn.ModuleDict({"a": _d2_vit(), "b": _d2_vit()})
    with pytest.raises(ValueError, match=r"several transformer trunks .*a \(detectron2 ViT\), b \(detectron2 ViT\)"):
        convert_timm_checkpoint(_timm_vit().state_dict(), two)


# ---------------------------------------------------------------------------------------------
# The fine-tuning configs
# ---------------------------------------------------------------------------------------------


def _assert_conditioned(model, site_prefix):
    """One Q head block of the first site has all singular values 1 (the conditioned arm landed)."""
    site = find_attention(model)[0]
    assert site.name.startswith(site_prefix)
    block = site.weight("q").double()[: site.head_dim]
    sv = torch.linalg.svdvals(block)
    torch.testing.assert_close(sv, torch.ones_like(sv), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "name, pretrain_dir",
    [
        ("mask_rcnn_xcit_s12_p16_3x_in1k.py", "xcit_s12_p16_400ep"),
        ("mask_rcnn_vitdet_b_100ep_in1k.py", "vit_b16_deit_300ep"),
        ("mask_rcnn_swin_b_3x_in1k.py", "swin_b_300ep"),
    ],
)
def test_in1k_configs_load_build_take_the_arm_and_accept_their_checkpoint(name, pretrain_dir):
    cfg = LazyConfig.load(os.path.join(COCO_DIR, name))
    # The pretraining config's own output directory (configs/ImageNet/<pretrain_dir>.py).
    assert cfg.train.init_checkpoint == f"output/imagenet/{pretrain_dir}/{{arm}}/seed{{seed}}"
    assert cfg.train.output_dir.endswith(name[: -len(".py")])
    LazyConfig.apply_overrides(cfg, ["condinit.arm=conditioned"])
    torch.manual_seed(0)
    if "xcit" in name:  # full size: XCiT-S12/16 builds in about a second
        model = instantiate(cfg.model)
        _assert_conditioned(model, "backbone.bottom_up.net.blocks.")
        sd = Xcit(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=8, eta=1.0).state_dict()
        expected_missing = ("backbone.bottom_up.fpn", "backbone.fpn_", "proposal_generator.", "roi_heads.")
    elif "vitdet" in name:  # ViT-B width, two blocks
        cfg.model.backbone.net.depth = 2
        cfg.model.backbone.net.window_block_indexes = [0]
        model = instantiate(cfg.model)
        _assert_conditioned(model, "backbone.net.blocks.")
        sd = VisionTransformer(embed_dim=768, depth=2, num_heads=12).state_dict()  # 224 px, class token
        expected_missing = ("backbone.net.blocks.", "backbone.simfp_", "proposal_generator.", "roi_heads.")
    else:  # Swin-B widths, one block per stage
        cfg.model.backbone.bottom_up.depths = (1, 1, 1, 1)
        model = instantiate(cfg.model)
        _assert_conditioned(model, "backbone.bottom_up.layers.")
        sd = TimmSwin(embed_dim=128, depths=(1, 1, 1, 1), num_heads=(4, 8, 16, 32)).state_dict()
        expected_missing = ("backbone.bottom_up.norm", "backbone.fpn_", "proposal_generator.", "roi_heads.")
    converted = convert_timm_checkpoint(sd, model)
    assert converted.missing and all(k.startswith(expected_missing) for k in converted.missing), converted.missing
    trunk_missing = {
        "xcit": [],  # the whole XCiT-S12/16 trunk comes from the checkpoint
        "vitdet": sorted(f"backbone.net.blocks.{i}.attn.rel_pos_{a}" for i in range(2) for a in "hw"),
        "swin": [f"backbone.bottom_up.norm{i}.{p}" for i in range(3) for p in ("bias", "weight")],
    }
    assert converted.trunk_missing == trunk_missing[name.split("_")[2]]
    result = model.load_state_dict(converted, strict=False)
    assert not result.unexpected_keys
