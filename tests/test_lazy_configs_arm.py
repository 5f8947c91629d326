"""Every lazy config gives a plain ``instantiate(cfg.model)`` the configured arm -- no project entry point.

This is what detectron2's tools/lazyconfig_train_net.py, detrex or a notebook do: load the config,
set the arm the documented way (``condinit.arm=...``), build the model.
"""

import glob
import os

import pytest
import torch
from detectron2.config import LazyConfig, instantiate

from condinit_det.init import find_attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Detector configs (the ImageNet/ and demo/pretrain_* configs build timm classifiers, not detectron2 models).
CONFIGS = sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)
    if "/common/" not in p and "/ImageNet/" not in p and not os.path.basename(p).startswith("pretrain_")
)
SMALL = [c for c in CONFIGS if c.startswith("configs/demo/")]
# tests/test_coco_configs.py::test_model_builds_takes_arm_and_runs builds these the same way (and runs them).
CHECKED_WITH_A_FORWARD = {
    f"configs/COCO/{n}"
    for n in (
        "mask_rcnn_vitdet_b_100ep.py",
        "mask_rcnn_swin_t_3x.py",
        "mask_rcnn_swin_b_3x.py",
        "mask_rcnn_xcit_s12_3x.py",
        "mask_rcnn_xcit_s12_p16_3x_in1k.py",
    )
}


def _build(name, *overrides):
    cfg = LazyConfig.apply_overrides(LazyConfig.load(os.path.join(ROOT, name)), list(overrides))
    torch.manual_seed(0)
    return instantiate(cfg.model)


def _assert_conditioned(site):
    dh = site.head_dim
    for role in ("q", "k"):
        w = site.weight(role).detach().double()
        for h in range(site.num_heads):
            s = torch.linalg.svdvals(w[h * dh : (h + 1) * dh])
            torch.testing.assert_close(s, torch.ones_like(s), atol=1e-5, rtol=0)
    torch.testing.assert_close(site.weight("v").detach(), torch.eye(site.dim_v, site.dim_v_in), atol=0, rtol=0)


def _assert_mimetic_qk_is_low_rank_plus_identity(site):
    """Per head, W_q^T W_k approximates alpha1 Z + beta1 I at rank dh: exactly rank dh, positive trace
    (the beta1 I term)."""
    dh = site.head_dim
    q, k = site.weight("q").detach().double(), site.weight("k").detach().double()
    for h in range(site.num_heads):
        prod = q[h * dh : (h + 1) * dh].T @ k[h * dh : (h + 1) * dh]
        s = torch.linalg.svdvals(prod)
        assert (s > 1e-6 * s[0]).sum() == dh
        assert torch.trace(prod) > 0  # the +beta I term dominates the trace


def test_every_detector_config_is_listed():
    assert "configs/demo/mask_rcnn_vit_tiny.py" in CONFIGS and "configs/COCO/detr_swin_b.py" in CONFIGS
    assert len(CONFIGS) >= 14
    assert CHECKED_WITH_A_FORWARD <= set(CONFIGS)


@pytest.mark.slow
@pytest.mark.parametrize("name", [c for c in CONFIGS if c not in CHECKED_WITH_A_FORWARD])
def test_plain_instantiate_carries_the_configured_arm(name):
    model = _build(name, "condinit.arm=conditioned")
    report = model.condinit_report
    assert report.arm == "conditioned" and report.sites
    sites = {s.name: s for s in find_attention(model)}
    for reported in (report.sites[0], report.sites[-1]):
        _assert_conditioned(sites[reported.name])


@pytest.mark.parametrize("name", SMALL)
def test_demo_configs_take_every_arm(name):
    default = _build(name)
    mimetic = _build(name, "condinit.arm=mimetic", "condinit.options.mimetic.alpha1=0.5")
    assert default.condinit_report.arm == "default" and mimetic.condinit_report.arm == "mimetic"
    assert mimetic.condinit_report.options["alpha1"] == 0.5
    changed = set(mimetic.condinit_report.changed_parameters())
    d, m = default.state_dict(), mimetic.state_dict()
    assert changed and all(torch.equal(d[k], m[k]) for k in d if k not in changed)
    sites = {s.name: s for s in find_attention(mimetic)}
    _assert_mimetic_qk_is_low_rank_plus_identity(sites[mimetic.condinit_report.sites[0].name])


def test_a_saved_config_still_carries_the_arm(tmp_path):
    """What default_setup dumps (config.yaml) reloads and builds the same arm, as detectron2's tools expect."""
    cfg = LazyConfig.apply_overrides(
        LazyConfig.load(os.path.join(ROOT, "configs/demo/mask_rcnn_vit_tiny.py")),
        ["condinit.arm=conditioned", "condinit.options.conditioned.gain_v=0.5"],
    )
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    saved = LazyConfig.load(str(tmp_path / "config.yaml"))
    torch.manual_seed(0)
    model = instantiate(saved.model)
    assert model.condinit_report.arm == "conditioned" and model.condinit_report.options["gain_v"] == 0.5
    site = find_attention(model)[0]
    torch.testing.assert_close(site.weight("v").detach(), 0.5 * torch.eye(site.dim_v, site.dim_v_in), atol=0, rtol=0)
