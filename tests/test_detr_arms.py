"""The init arms reach exactly the attention sites that the condinit patterns name."""

from functools import partial

import pytest
import torch
from detectron2.modeling import ViT
from torch import nn

from condinit_det.init import apply_init, find_attention
from condinit_det.modeling.detr import DETRInstanceSeg, HungarianMatcher, MaskHead, SetCriterion, Transformer

BACKBONE = ["backbone.blocks.0.attn", "backbone.blocks.1.attn"]
ENCODER = ["transformer.encoder.layers.0.self_attn", "transformer.encoder.layers.1.self_attn"]
DEC_SELF = ["transformer.decoder.layers.0.self_attn", "transformer.decoder.layers.1.self_attn"]
DEC_CROSS = ["transformer.decoder.layers.0.cross_attn", "transformer.decoder.layers.1.cross_attn"]


def _model():
    torch.manual_seed(0)
    backbone = ViT(
        img_size=64,
        patch_size=16,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=2,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        pretrain_img_size=64,
        pretrain_use_cls_token=False,
        out_feature="last_feat",
    )
    return DETRInstanceSeg(
        backbone=backbone,
        in_feature="last_feat",
        transformer=Transformer(
            d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64, dropout=0.0
        ),
        num_classes=2,
        num_queries=4,
        criterion=SetCriterion(num_classes=2, matcher=HungarianMatcher()),
        pixel_mean=[0.0, 0.0, 0.0],
        pixel_std=[1.0, 1.0, 1.0],
        mask_head=MaskHead(hidden_dim=32, num_heads=4, num_upsample=1),
    )


def test_sites_and_kinds():
    sites = find_attention(_model())
    names = [s.name for s in sites]
    assert sorted(names) == sorted(BACKBONE + ENCODER + DEC_SELF + DEC_CROSS)
    kinds = {s.name: s.kind for s in sites}
    assert all(kinds[n] == "mha" for n in ENCODER + DEC_SELF + DEC_CROSS)
    # The mask head's attention maps have no values / output projection: not a site.
    assert not any(n.startswith("mask_head") for n in names)
    for s in sites:
        if s.kind == "mha":
            assert (s.dim_in, s.dim, s.num_heads, s.head_dim) == (32, 32, 4, 8)


@pytest.mark.parametrize(
    "include,expected",
    [
        (["backbone.*"], BACKBONE),
        (["transformer.*"], ENCODER + DEC_SELF + DEC_CROSS),
        (["transformer.encoder.*"], ENCODER),
        (["transformer.decoder.layers.*.self_attn"], DEC_SELF),
        (["transformer.decoder.layers.*.cross_attn"], DEC_CROSS),
        (None, BACKBONE + ENCODER + DEC_SELF + DEC_CROSS),
    ],
)
@pytest.mark.parametrize("arm", ["conditioned", "mimetic"])
def test_arm_changes_exactly_the_named_sites(arm, include, expected):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_init(model, arm, seed=0, include=include).to_dict()
    assert sorted(s["name"] for s in report["sites"]) == sorted(expected)
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    # Every changed tensor belongs to a named site, and every named site changed.
    assert changed, "the arm changed nothing"
    assert all(any(k.startswith(site + ".") for site in expected) for k in changed), changed
    assert all(any(k.startswith(site + ".") for k in changed) for site in expected)
    reported = sorted(p for s in report["sites"] for p in s["changed"])
    assert set(reported) >= {k for k in changed if k.endswith("weight")}


def test_exclude_and_default_arm():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_init(
        model, "conditioned", seed=0, include=["transformer.*"], exclude=["transformer.decoder.layers.0.*"]
    ).to_dict()
    names = sorted(s["name"] for s in report["sites"])
    assert names == sorted(ENCODER + DEC_SELF[1:] + DEC_CROSS[1:])
    assert torch.equal(
        before["transformer.decoder.layers.0.cross_attn.in_proj_weight"],
        model.state_dict()["transformer.decoder.layers.0.cross_attn.in_proj_weight"],
    )
    model = _model()
    apply_init(model, "default", seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_conditioned_value_projection_is_identity_in_cross_attention():
    model = _model()
    apply_init(model, "conditioned", seed=0, include=DEC_CROSS[:1])
    w = model.transformer.decoder.layers[0].cross_attn.in_proj_weight
    assert torch.allclose(w[64:], torch.eye(32))
    for h in range(4):
        q = w[h * 8 : (h + 1) * 8]
        assert torch.allclose(q @ q.T, torch.eye(8), atol=1e-5)
