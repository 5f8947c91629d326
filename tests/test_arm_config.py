"""The detectron2-facing arm entry points: apply_arm_config and the init_arm lazy builder."""
import json

import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import LazyCall as L
from detectron2.config import instantiate
from detectron2.modeling.backbone.swin import SwinTransformer
from detectron2.modeling.backbone.vit import ViT

from condinit_det.init import find_attention
from condinit_det.modeling import ARM_REPORT_FILE, apply_arm_config, init_arm


class Detector(torch.nn.Module):
    """Stands in for a meta-arch: the ViT lives at backbone.net like in ViTDet."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Module()
        self.backbone.net = ViT(img_size=64, patch_size=16, embed_dim=64, depth=3, num_heads=4,
                                window_size=2, window_block_indexes=[0], use_rel_pos=True)
        self.head = torch.nn.Linear(64, 5)


def _build(seed=0):
    torch.manual_seed(seed)
    return Detector()


def _q_blocks_orthonormal(site):
    dh = site.head_dim
    w = site.weight("q").detach().double()
    return all(
        torch.allclose(w[h * dh:(h + 1) * dh] @ w[h * dh:(h + 1) * dh].T, torch.eye(dh, dtype=torch.float64),
                       atol=1e-5)
        for h in range(site.num_heads)
    )


def test_apply_arm_config_keeps_keys_and_saves_report(tmp_path):
    fresh = _build()
    model = _build()
    report = apply_arm_config(model, {"arm": "conditioned", "seed": 3, "include": ["backbone.net.*"]},
                              output_dir=str(tmp_path))
    assert list(model.state_dict()) == list(fresh.state_dict())
    assert [s.name for s in report.sites] == [f"backbone.net.blocks.{i}.attn" for i in range(3)]
    assert all(_q_blocks_orthonormal(s) for s in find_attention(model))
    assert torch.equal(model.head.weight, fresh.head.weight)
    saved = json.loads((tmp_path / ARM_REPORT_FILE).read_text())
    assert saved["arm"] == "conditioned" and saved["seed"] == 3
    assert "backbone.net.blocks.0.attn.qkv.weight" in saved["sites"][0]["changed"]


def test_same_seed_gives_identical_replicas():
    """What DDP relies on: every rank applies the same arm with the same seed."""
    a, b = _build(), _build()
    apply_arm_config(a, {"arm": "mimetic", "seed": 1})
    apply_arm_config(b, {"arm": "mimetic", "seed": 1})
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_checkpoint_loaded_after_the_arm_overrides_it(tmp_path):
    source = _build(seed=5)
    torch.save({"model": source.state_dict()}, tmp_path / "ckpt.pth")
    model = _build()
    apply_arm_config(model, {"arm": "conditioned", "seed": 0})
    assert _q_blocks_orthonormal(find_attention(model)[0])
    DetectionCheckpointer(model).load(str(tmp_path / "ckpt.pth"))
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), source.state_dict().values()))
    assert not _q_blocks_orthonormal(find_attention(model)[0])


def test_missing_node_means_default_and_bad_keys_are_named():
    model = _build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_arm_config(model, None)
    assert report.arm == "default"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="unknown key\\(s\\) gain; accepted: arm, seed, include, exclude, options"):
        apply_arm_config(model, {"arm": "conditioned", "gain": 2})
    with pytest.raises(ValueError, match="unknown arm 'best'"):
        apply_arm_config(model, {"arm": "best"})


def test_omegaconf_node_from_a_lazy_config():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"arm": "conditioned", "seed": 0, "include": ["backbone.net.blocks.1.*"],
                             "exclude": None, "options": {"gain_v": 0.5}})
    model = _build()
    report = apply_arm_config(model, node)
    assert [s.name for s in report.sites] == ["backbone.net.blocks.1.attn"]
    site = find_attention(model)[1]
    assert torch.equal(site.weight("v"), 0.5 * torch.eye(64))


def test_init_arm_builder_in_a_lazy_config():
    cfg = L(init_arm)(
        module=L(SwinTransformer)(pretrain_img_size=64, patch_size=4, embed_dim=32, depths=(2, 2),
                                  num_heads=(2, 4), window_size=4, out_indices=(0, 1)),
        arm="conditioned",
        seed=0,
        include=["layers.1.*"],
    )
    torch.manual_seed(0)
    swin = instantiate(cfg)
    assert isinstance(swin, SwinTransformer)
    assert [s.name for s in swin.condinit_report.sites] == ["layers.1.blocks.0.attn", "layers.1.blocks.1.attn"]
    sites = {s.name: s for s in find_attention(swin)}
    assert _q_blocks_orthonormal(sites["layers.1.blocks.0.attn"])
    assert not _q_blocks_orthonormal(sites["layers.0.blocks.0.attn"])
    out = swin(torch.randn(1, 3, 64, 64))
    assert out["p1"].shape == (1, 64, 8, 8)
