"""COCO lazy configs: recipes, augmentations, and that every model builds, runs and takes its arm."""

import glob
import os

import detectron2.data.transforms as T
import numpy as np
import pytest
import torch
from detectron2.config import LazyConfig, instantiate

from condinit_det.analysis import ANALYSIS_DEFAULTS
from condinit_det.analysis.hooks import build_conditioning_hook
from condinit_det.evaluation import FastCOCOEvaluator
from condinit_det.init import find_attention, select_sites
from condinit_det.modeling.xcit import XCiT

torch.set_num_threads(min(2, torch.get_num_threads()))

COCO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "COCO")

# config -> (site kind, number of sites, site-name prefix)
MODELS = {
    "mask_rcnn_vitdet_b_100ep.py": ("d2_vit", 12, "backbone.net.blocks."),
    "mask_rcnn_swin_t_3x.py": ("d2_swin", 2 + 2 + 6 + 2, "backbone.bottom_up.layers."),
    "mask_rcnn_swin_b_3x.py": ("d2_swin", 2 + 2 + 18 + 2, "backbone.bottom_up.layers."),
    "mask_rcnn_xcit_s12_3x.py": ("timm_xcit", 12, "backbone.net.blocks."),
    "mask_rcnn_xcit_s12_p16_3x_in1k.py": ("timm_xcit", 12, "backbone.bottom_up.net.blocks."),
}
ALL_CONFIGS = sorted(MODELS) + [
    "mask_rcnn_vitdet_b_100ep_pretrained.py",
    "mask_rcnn_vitdet_b_100ep_in1k.py",
    "mask_rcnn_swin_b_3x_in1k.py",
]
# 36 epochs of coco_2017_train (117266 images after detectron2's empty-image filter) at 16 images per iteration;
# steps at epochs 27, 33.
ITERS_3X, STEPS_3X = 263848, [197886, 241861]

# Conditioning tracking (condinit_analysis): config -> (period, sites). The periods keep the hook's
# measured cost under 1% of training time (BENCHMARKS.md, "Conditioning tracking on the paper's configs").
_SWIN_B_SITES = [f"backbone.bottom_up.layers.{stage}.blocks.{block}.attn" for stage, block in ((0, 0), (2, 8), (3, 1))]
TRACKED = {
    "mask_rcnn_xcit_s12_3x.py": (5000, [f"backbone.net.blocks.{i}.attn" for i in (0, 6, 11)]),
    "mask_rcnn_xcit_s12_p16_3x_in1k.py": (5000, [f"backbone.bottom_up.net.blocks.{i}.attn" for i in (0, 6, 11)]),
    "mask_rcnn_swin_b_3x.py": (5000, _SWIN_B_SITES),
    "mask_rcnn_swin_b_3x_in1k.py": (5000, _SWIN_B_SITES),
}


def test_every_mask_rcnn_config_is_covered():
    found = {os.path.basename(p) for p in glob.glob(os.path.join(COCO_DIR, "mask_rcnn_*.py"))}
    assert found == set(ALL_CONFIGS)


def _load(name):
    return LazyConfig.load(os.path.join(COCO_DIR, name))


def _lr_at(cfg, it):
    return instantiate(cfg.lr_multiplier)(it / cfg.train.max_iter)


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_common_fields(name):
    cfg = _load(name)
    assert set(cfg) >= {"model", "dataloader", "train", "optimizer", "lr_multiplier", "condinit"}
    assert cfg.condinit.arm == "default" and cfg.condinit.seed == 0
    assert cfg.condinit.exclude is None and dict(cfg.condinit.options) == {}
    assert cfg.optimizer._target_ is torch.optim.AdamW
    assert cfg.dataloader.evaluator._target_ is FastCOCOEvaluator
    assert cfg.dataloader.train.dataset.names == "coco_2017_train"
    assert cfg.dataloader.test.dataset.names == "coco_2017_val"
    assert cfg.dataloader.train.mapper.image_format == "RGB" and cfg.model.input_format == "RGB"
    assert cfg.dataloader.train.mapper.recompute_boxes is True
    assert cfg.train.output_dir.endswith(name[: -len(".py")])
    assert cfg.train.amp.enabled is True


def _site_names(cfg):
    """Every attention-site name of the config's backbone, from its widths and depths (no build)."""
    backbone = cfg.model.backbone
    if "bottom_up" in backbone and "depths" in backbone.bottom_up:  # Swin
        return [
            f"backbone.bottom_up.layers.{stage}.blocks.{i}.attn"
            for stage, depth in enumerate(backbone.bottom_up.depths)
            for i in range(depth)
        ]
    if "bottom_up" in backbone:  # XCiT's deconvolution neck around the trunk
        return [f"backbone.bottom_up.net.blocks.{i}.attn" for i in range(backbone.bottom_up.net.depth)]
    return [f"backbone.net.blocks.{i}.attn" for i in range(backbone.net.depth)]


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_conditioning_tracking_node(name):
    cfg = _load(name)
    assert "condinit_analysis" in cfg
    node = dict(cfg.condinit_analysis)
    assert set(node) <= set(ANALYSIS_DEFAULTS)
    if name not in TRACKED:  # ViTDet-B and Swin-T: the node is there, off
        assert node["period"] == 0
        assert build_conditioning_hook(cfg, batch=[{"image": torch.zeros(3, 32, 32)}]) is None
        return
    period, sites = TRACKED[name]
    assert (node["period"], list(node["sites"])) == (period, sites)
    assert set(sites) <= set(_site_names(cfg)), "a tracked site is not an attention site of the backbone"
    # The measurement settings are the hook's defaults: exact kappa at 16 tokens of one image.
    for key in ("method", "max_tokens", "max_batch", "num_images", "include_output_proj"):
        assert node[key] == ANALYSIS_DEFAULTS[key], key
    hook = build_conditioning_hook(cfg, batch=[{"image": torch.zeros(3, 32, 32)}], config_name=name)
    assert hook.period == period and hook.options["sites"] == sites
    assert hook.options["method"] == "auto" and (hook.options["max_batch"], hook.options["max_tokens"]) == (1, 16)


def test_vitdet_recipe_and_pretrained_variant():
    cfg = _load("mask_rcnn_vitdet_b_100ep.py")
    assert cfg.train.init_checkpoint == ""
    assert list(cfg.condinit.include) == ["backbone.net.*"]
    assert cfg.dataloader.train.total_batch_size == 64
    assert cfg.train.max_iter == 184375
    sched = cfg.lr_multiplier
    assert list(sched.scheduler.milestones) == [163889, 177546]
    assert sched.warmup_length == pytest.approx(250 / 184375)
    assert _lr_at(cfg, 100) < 0.5 and _lr_at(cfg, 1000) == pytest.approx(1.0)
    assert _lr_at(cfg, 170000) == pytest.approx(0.1) and _lr_at(cfg, 180000) == pytest.approx(0.01)
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.weight_decay == 0.1
    lr_factor = cfg.optimizer.params.lr_factor_func
    assert lr_factor("backbone.net.blocks.11.mlp.fc1.weight") == pytest.approx(0.7)
    assert lr_factor("backbone.net.patch_embed.proj.weight") == pytest.approx(0.7**13)
    assert lr_factor("roi_heads.box_predictor.cls_score.weight") == 1.0
    net = cfg.model.backbone.net
    assert (net.embed_dim, net.depth, net.num_heads, net.drop_path_rate) == (768, 12, 12, 0.1)

    pre = _load("mask_rcnn_vitdet_b_100ep_pretrained.py")
    assert pre.train.init_checkpoint.startswith("detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_base.pth")
    # Same model, data, optimizer and schedule: only the starting weights differ.
    for key in ("model", "dataloader", "optimizer", "lr_multiplier", "condinit"):
        assert LazyConfig.to_py(pre[key], prefix=key + ".") == LazyConfig.to_py(cfg[key], prefix=key + "."), key
    assert pre.train.max_iter == cfg.train.max_iter


def test_detr_schedule_counts_epochs_of_the_filtered_train_set():
    # 500 epochs of 117266 images at 64 images per iteration; the LR drops after epoch 400.
    cfg = _load("detr_vitdet_b.py")
    assert cfg.dataloader.train.total_batch_size == 64
    assert cfg.train.max_iter == 916141
    assert list(cfg.lr_multiplier.scheduler.milestones) == [732912]


@pytest.mark.parametrize(
    "name, backbone",
    [
        (
            "mask_rcnn_swin_t_3x.py",
            dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], drop_path_rate=0.2),
        ),
        (
            "mask_rcnn_swin_b_3x.py",
            dict(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], drop_path_rate=0.3),
        ),
        ("mask_rcnn_xcit_s12_3x.py", dict(embed_dim=384, depth=12, num_heads=8, eta=1.0, drop_path_rate=0.05)),
    ],
)
def test_3x_recipes(name, backbone):
    cfg = _load(name)
    assert cfg.train.init_checkpoint == ""
    assert cfg.dataloader.train.total_batch_size == 16
    assert cfg.train.max_iter == ITERS_3X
    assert list(cfg.lr_multiplier.scheduler.milestones) == STEPS_3X
    assert _lr_at(cfg, 10) < 0.05 and _lr_at(cfg, 600) == pytest.approx(1.0)
    assert _lr_at(cfg, STEPS_3X[0] + 1) == pytest.approx(0.1) and _lr_at(cfg, STEPS_3X[1] + 1) == pytest.approx(0.01)
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.weight_decay == 0.05
    assert cfg.optimizer.params.weight_decay_norm == 0.0
    if "swin" in name:
        trunk = cfg.model.backbone.bottom_up
        assert list(cfg.condinit.include) == ["backbone.bottom_up.*"]
        assert list(cfg.model.backbone.in_features) == ["p0", "p1", "p2", "p3"]
        assert cfg.optimizer.params.overrides["relative_position_bias_table"] == {"weight_decay": 0.0}
    else:
        trunk = cfg.model.backbone.net
        assert trunk._target_ is XCiT and trunk.patch_size == 16 and trunk.sync_bn is True
        assert list(cfg.condinit.include) == ["backbone.net.*"]
        assert cfg.model.backbone.square_pad == 0
    for key, value in backbone.items():
        got = trunk[key]
        assert (list(got) if isinstance(value, list) else got) == value, key


@pytest.mark.parametrize(
    "loader, check",
    [
        ("coco_loader_multiscale_crop", lambda h, w: 480 <= min(h, w) <= 800 and max(h, w) <= 1333),
        ("coco_loader_lsj", lambda h, w: h <= 1024 and w <= 1024),
    ],
)
def test_train_augmentations(loader, check):
    cfg = _load("mask_rcnn_swin_t_3x.py" if "multiscale" in loader else "mask_rcnn_vitdet_b_100ep.py")
    augs = T.AugmentationList(instantiate(cfg.dataloader.train.mapper.augmentations))
    rng_state = np.random.get_state()
    np.random.seed(0)
    try:
        shapes = set()
        for _ in range(12):
            aug_input = T.AugInput(np.zeros((480, 640, 3), dtype=np.uint8))
            augs(aug_input)
            h, w = aug_input.image.shape[:2]
            assert check(h, w), (h, w)
            shapes.add((h, w))
        assert len(shapes) > 3  # the scale is random
    finally:
        np.random.set_state(rng_state)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_builds_takes_arm_and_runs(name):
    kind, num_sites, prefix = MODELS[name]
    cfg = _load(name)
    # CPU-sized forward: no 1024 square canvas for ViTDet, 50 proposals instead of 1000.
    if "square_pad" in cfg.model.backbone:
        cfg.model.backbone.square_pad = 0
    cfg.model.proposal_generator.post_nms_topk = (1000, 50)
    torch.manual_seed(0)
    before = instantiate(cfg.model).state_dict()
    # The documented way: the arm is set in condinit and a plain instantiate applies it.
    LazyConfig.apply_overrides(cfg, ["condinit.arm=conditioned"])
    torch.manual_seed(0)
    model = instantiate(cfg.model)

    backbone_sites = ["backbone." + s.name for s in find_attention(model.backbone)]
    assert len(backbone_sites) == num_sites
    assert backbone_sites == _site_names(cfg)
    if name in TRACKED:  # the conditioning hook's sites are sites of the built model
        tracked = TRACKED[name][1]
        assert [s.name for s in select_sites(find_attention(model), include=tracked)] == tracked
    assert [s.name for s in find_attention(model)] == backbone_sites  # no attention outside the backbone
    assert all(n.startswith(prefix) and n.endswith(".attn") for n in backbone_sites)

    report = model.condinit_report
    assert report.arm == "conditioned"
    assert [s.name for s in report.sites] == backbone_sites
    assert {s.kind for s in report.sites} == {kind}
    changed = {p for s in report.sites for p in s.changed}
    assert all(s.changed for s in report.sites)
    after = model.state_dict()
    for key, value in before.items():
        if key not in changed:
            assert torch.equal(value, after[key]), f"{key} changed outside the arm's sites"
        elif key.endswith(".weight"):  # biases were zero and are set to zero again
            assert not torch.equal(value, after[key]), f"{key} reported changed but equal"

    # The conditioned invariant on the last site: every Q and K head block has orthonormal rows.
    site = find_attention(model)[-1]
    for role in ("q", "k"):
        w = site.weight(role).double()
        for h in range(site.num_heads):
            block = w[h * site.head_dim : (h + 1) * site.head_dim]
            torch.testing.assert_close(
                block @ block.T, torch.eye(site.head_dim, dtype=torch.float64), atol=1e-5, rtol=0
            )

    model.eval()
    image = torch.randint(0, 256, (3, 192, 256), generator=torch.Generator().manual_seed(0)).float()
    with torch.no_grad():
        out = model([{"image": image, "height": 192, "width": 256}])
    inst = out[0]["instances"]
    assert inst.image_size == (192, 256)
    assert len(inst) <= 50 and inst.pred_masks.shape[1:] == (192, 256)
    assert torch.isfinite(inst.pred_boxes.tensor).all()
