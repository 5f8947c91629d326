"""yacs path: add_condinit_config + yaml + BACKBONE_REGISTRY builders that apply the arm."""

import os

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import build_detection_train_loader
from detectron2.modeling import BACKBONE_REGISTRY, build_model
from detectron2.utils.events import EventStorage

from condinit_det.data import register_embedded_datasets
from condinit_det.init import find_attention
from condinit_det.modeling import backbones  # noqa: F401  (registers the builders)
from condinit_det.modeling.yacs_config import add_condinit_config, build_optimizer, condinit_options

torch.set_num_threads(min(2, torch.get_num_threads()))

YACS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "yacs")
TINY_YAML = os.path.join(YACS_DIR, "mask_rcnn_vit_tiny_embedded.yaml")


def _cfg(yaml=TINY_YAML, *opts):
    cfg = get_cfg()
    add_condinit_config(cfg)
    cfg.merge_from_file(yaml)
    cfg.merge_from_list(list(opts))
    return cfg


def _build(cfg):
    torch.manual_seed(0)
    return build_model(cfg)


def test_keys_and_options():
    cfg = get_cfg()
    assert add_condinit_config(cfg) is cfg
    add_condinit_config(cfg)  # idempotent
    node = cfg.MODEL.CONDINIT
    assert (node.ENABLED, node.ARM, node.SEED, list(node.INCLUDE), list(node.EXCLUDE)) == (True, "default", 0, [], [])
    assert condinit_options(node) == {}
    for key in ("VIT", "SWIN", "XCIT", "SIMPLE_FPN"):
        assert key in cfg.MODEL
    assert node.NORM is None
    cfg.merge_from_list(
        [
            "MODEL.CONDINIT.GAIN_QK",
            "0.5",
            "MODEL.CONDINIT.VALUE_MODE",
            "shared_block",
            "MODEL.CONDINIT.ALPHA1",
            "0.3",
            "MODEL.CONDINIT.NORM",
            "spectral",
        ]
    )
    # An option key reaches only the arms that accept it (so --arm all runs with them); the
    # conditioned arm's gains and value mode also reach its scale-matched control.
    assert condinit_options(cfg.MODEL.CONDINIT) == {}
    cfg.MODEL.CONDINIT.ARM = "conditioned"
    assert condinit_options(cfg.MODEL.CONDINIT) == {"gain_qk": 0.5, "value_mode": "shared_block"}
    cfg.MODEL.CONDINIT.ARM = "mimetic"
    assert condinit_options(cfg.MODEL.CONDINIT) == {"alpha1": 0.3}
    cfg.MODEL.CONDINIT.ARM = "scale_matched"
    assert condinit_options(cfg.MODEL.CONDINIT) == {"gain_qk": 0.5, "value_mode": "shared_block", "norm": "spectral"}
    for name in ("build_condinit_vit_backbone", "build_condinit_swin_fpn_backbone", "build_condinit_xcit_backbone"):
        assert BACKBONE_REGISTRY.get(name) is getattr(backbones, name)


def test_missing_keys_error():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "build_condinit_vit_backbone"
    with pytest.raises(KeyError, match="add_condinit_config"):
        build_model(cfg)


def test_conditioned_arm_applied_by_build_model():
    base = _build(_cfg(TINY_YAML, "MODEL.CONDINIT.ENABLED", "False"))
    model = _build(_cfg(TINY_YAML, "MODEL.CONDINIT.ARM", "conditioned", "MODEL.CONDINIT.SEED", "7"))
    sites = find_attention(model)
    assert [s.name for s in sites] == [f"backbone.net.blocks.{i}.attn" for i in range(4)]
    report = model.backbone.condinit_report
    assert report.arm == "conditioned" and report.seed == 7
    assert [s.name for s in report.sites] == [s.name for s in sites]
    changed = {p for s in report.sites for p in s.changed}
    assert "backbone.net.blocks.0.attn.qkv.weight" in changed

    site = sites[1]
    q = site.weight("q").double()
    for h in range(site.num_heads):
        block = q[h * site.head_dim : (h + 1) * site.head_dim]
        torch.testing.assert_close(block @ block.T, torch.eye(site.head_dim, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(site.weight("v"), torch.eye(site.dim_v, site.dim_in))

    # The arm draws from its own generator: everything outside the changed projections (heads
    # built after the backbone included) is bitwise the same as without the arm.
    ref, got = base.state_dict(), model.state_dict()
    assert set(ref) == set(got)
    for key in ref:
        if key not in changed:
            assert torch.equal(ref[key], got[key]), key
    assert not torch.equal(ref["backbone.net.blocks.1.attn.qkv.weight"], got["backbone.net.blocks.1.attn.qkv.weight"])


def test_default_arm_is_bitwise_the_disabled_build():
    off = _build(_cfg(TINY_YAML, "MODEL.CONDINIT.ENABLED", "False")).state_dict()
    default = _build(_cfg(TINY_YAML))
    assert default.backbone.condinit_report.arm == "default"
    assert len(default.backbone.condinit_report.sites) == 4
    on = default.state_dict()
    assert set(on) == set(off)
    assert all(torch.equal(on[k], off[k]) for k in off)


def test_scale_matched_arm_applied_by_build_model():
    base = _build(_cfg(TINY_YAML, "MODEL.CONDINIT.ENABLED", "False")).state_dict()
    model = _build(
        _cfg(
            TINY_YAML,
            "MODEL.CONDINIT.ARM",
            "scale_matched",
            "MODEL.CONDINIT.GAIN_V",
            "0.5",
            "MODEL.CONDINIT.NORM",
            "spectral",
        )
    )
    report = model.backbone.condinit_report
    assert report.arm == "scale_matched"
    assert report.options == {"gain_qk": 1.0, "gain_v": 0.5, "value_mode": "identity", "norm": "spectral"}
    changed = set(report.changed_parameters())
    got = model.state_dict()
    assert all(torch.equal(base[k], got[k]) for k in base if k not in changed)
    site = find_attention(model)[0]
    dh = site.head_dim
    for role, target in (("q", 1.0), ("k", 1.0), ("v", 0.5)):
        blocks = site.weight(role).detach().double().unflatten(0, (site.num_heads, dh))
        norms = torch.linalg.matrix_norm(blocks, ord=2)
        torch.testing.assert_close(norms, torch.full_like(norms, target), rtol=1e-6, atol=0)


def test_include_exclude_select_sites():
    model = _build(_cfg(TINY_YAML, "MODEL.CONDINIT.ARM", "conditioned", "MODEL.CONDINIT.EXCLUDE", "['*.blocks.0.*']"))
    names = [s.name for s in model.backbone.condinit_report.sites]
    assert names == [f"backbone.net.blocks.{i}.attn" for i in (1, 2, 3)]


def test_embedded_yaml_trains_one_step():
    register_embedded_datasets()
    cfg = _cfg(TINY_YAML, "MODEL.CONDINIT.ARM", "conditioned", "SOLVER.IMS_PER_BATCH", "2")
    model = _build(cfg)
    model.train()
    optimizer = build_optimizer(cfg, model)
    assert isinstance(optimizer, torch.optim.AdamW)
    no_decay = [g for g in optimizer.param_groups if g["weight_decay"] == 0.0]
    assert any(p is model.backbone.net.pos_embed for g in no_decay for p in g["params"])
    batch = next(iter(build_detection_train_loader(cfg)))
    assert len(batch) == 2 and batch[0]["image"].shape[1:] == (128, 128)
    before = model.backbone.net.blocks[0].attn.qkv.weight.detach().clone()
    with EventStorage(0):
        losses = model(batch)
    total = sum(losses.values())
    assert torch.isfinite(total)
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
    assert not torch.equal(before, model.backbone.net.blocks[0].attn.qkv.weight)


@pytest.mark.parametrize(
    "opts, kind, names, strides",
    [
        (
            [
                "MODEL.BACKBONE.NAME",
                "build_condinit_xcit_backbone",
                "MODEL.XCIT.PATCH_SIZE",
                "8",
                "MODEL.XCIT.EMBED_DIM",
                "64",
                "MODEL.XCIT.DEPTH",
                "2",
                "MODEL.XCIT.NUM_HEADS",
                "4",
                "MODEL.SIMPLE_FPN.TOP_BLOCK",
                "True",
            ],
            "timm_xcit",
            ["backbone.net.blocks.0.attn", "backbone.net.blocks.1.attn"],
            {"p2": 4, "p3": 8, "p4": 16, "p5": 32},  # p5: max-pooled p4
        ),
        (
            [
                "MODEL.BACKBONE.NAME",
                "build_condinit_swin_fpn_backbone",
                "MODEL.SWIN.EMBED_DIM",
                "32",
                "MODEL.SWIN.DEPTHS",
                "[1, 1, 1, 1]",
                "MODEL.SWIN.NUM_HEADS",
                "[1, 2, 4, 8]",
                "MODEL.SWIN.WINDOW_SIZE",
                "4",
                "MODEL.FPN.IN_FEATURES",
                "['p0', 'p1', 'p2', 'p3']",
                "MODEL.SIMPLE_FPN.SQUARE_PAD",
                "0",
                "MODEL.CONDINIT.INCLUDE",
                "['backbone.bottom_up.*']",
            ],
            "d2_swin",
            [f"backbone.bottom_up.layers.{i}.blocks.0.attn" for i in range(4)],
            {"p2": 4, "p3": 8, "p4": 16, "p5": 32, "p6": 64},
        ),
    ],
)
def test_xcit_and_swin_builders(opts, kind, names, strides):
    cfg = _cfg(TINY_YAML, "MODEL.CONDINIT.ARM", "conditioned", *opts)
    model = _build(cfg).eval()
    assert {k: v.stride for k, v in model.backbone.output_shape().items()} == strides
    report = model.backbone.condinit_report
    assert [s.name for s in report.sites] == names and {s.kind for s in report.sites} == {kind}
    assert all(s.changed for s in report.sites)
    with torch.no_grad():
        out = model([{"image": torch.rand(3, 128, 128) * 255}])
    assert out[0]["instances"].image_size == (128, 128)


def test_swin_bad_out_feature():
    cfg = _cfg(
        TINY_YAML, "MODEL.BACKBONE.NAME", "build_condinit_swin_fpn_backbone", "MODEL.SWIN.OUT_FEATURES", "['res2']"
    )
    with pytest.raises(ValueError, match="not a Swin stage"):
        build_model(cfg)


def test_coco_yaml_merges():
    cfg = _cfg(os.path.join(YACS_DIR, "mask_rcnn_xcit_s12_3x.yaml"))
    assert cfg.MODEL.BACKBONE.NAME == "build_condinit_xcit_backbone"
    assert (cfg.MODEL.XCIT.EMBED_DIM, cfg.MODEL.XCIT.DEPTH, cfg.MODEL.XCIT.NUM_HEADS) == (384, 12, 8)
    assert cfg.SOLVER.OPTIMIZER == "ADAMW" and cfg.SOLVER.BASE_LR == 1e-4 and cfg.SOLVER.WEIGHT_DECAY == 0.05
    assert cfg.SOLVER.MAX_ITER == 263848 and tuple(cfg.SOLVER.STEPS) == (197886, 241861)
    assert cfg.DATASETS.TRAIN == ("coco_2017_train",) and cfg.MODEL.WEIGHTS == ""
    assert list(cfg.MODEL.CONDINIT.INCLUDE) == ["backbone.net.*"]
    cfg.SOLVER.OPTIMIZER = "LAMB"
    with pytest.raises(ValueError, match="SOLVER.OPTIMIZER='LAMB' is not supported"):
        build_optimizer(cfg, torch.nn.Linear(2, 2))
