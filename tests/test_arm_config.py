"""The arm inside a lazy config's model node: armed(), build_armed, per-arm options, one place only."""

import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import LazyCall as L
from detectron2.config import instantiate
from detectron2.modeling.backbone.swin import SwinTransformer
from detectron2.modeling.backbone.vit import ViT
from omegaconf import OmegaConf

from condinit_det.init import find_attention
from condinit_det.init.spec import ArmError, resolve_arm_node
from condinit_det.modeling import arm as arm_module
from condinit_det.modeling import armed


class Detector(torch.nn.Module):
    """Stands in for a meta-arch: the ViT lives at backbone.net like in ViTDet."""

    def __init__(self, net: torch.nn.Module, classes: int = 5):
        super().__init__()
        self.backbone = torch.nn.Module()
        self.backbone.net = net
        self.head = torch.nn.Linear(64, classes)


def _config(arm="conditioned", **node):
    vit = L(ViT)(
        img_size=64,
        patch_size=16,
        embed_dim=64,
        depth=3,
        num_heads=4,
        window_size=2,
        window_block_indexes=[0],
        use_rel_pos=True,
    )
    cfg = OmegaConf.create(
        {"condinit": {"arm": arm, "seed": 0, "include": None, "exclude": None, "options": {}, **node}}
    )
    cfg.model = armed(L(Detector)(net=vit, classes=5))
    return cfg


def _build(cfg, seed=0):
    torch.manual_seed(seed)
    return instantiate(cfg.model)


def _q_blocks_orthonormal(site):
    dh = site.head_dim
    w = site.weight("q").detach().double()
    return all(
        torch.allclose(
            w[h * dh : (h + 1) * dh] @ w[h * dh : (h + 1) * dh].T, torch.eye(dh, dtype=torch.float64), atol=1e-5
        )
        for h in range(site.num_heads)
    )


def test_armed_node_builds_the_same_model_with_the_arm():
    default, conditioned = _build(_config("default")), _build(_config("conditioned"))
    assert isinstance(conditioned, Detector)
    assert list(conditioned.state_dict()) == list(default.state_dict())  # keys unchanged: checkpoints load
    assert conditioned.condinit_report.arm == "conditioned"
    assert [s.name for s in conditioned.condinit_report.sites] == [f"backbone.net.blocks.{i}.attn" for i in range(3)]
    assert all(_q_blocks_orthonormal(s) for s in find_attention(conditioned))
    assert not any(_q_blocks_orthonormal(s) for s in find_attention(default))
    changed = set(conditioned.condinit_report.changed_parameters())
    for name, value in default.state_dict().items():
        if name not in changed:
            assert torch.equal(value, conditioned.state_dict()[name]), name


def test_usual_override_paths_still_reach_the_model():
    cfg = _config("mimetic")
    cfg.model.net.embed_dim = 48
    cfg.model.net.num_heads = 3
    cfg.model.classes = 7
    model = _build(cfg)
    assert model.head.out_features == 7
    assert find_attention(model)[0].dim == 48
    assert model.condinit_report.arm == "mimetic"


def test_the_top_level_node_is_the_one_place_and_is_read_at_build_time():
    cfg = _config("default")
    cfg.condinit.arm = "conditioned"  # what `condinit.arm=conditioned` or --arm does
    assert _build(cfg).condinit_report.arm == "conditioned"


def test_same_seed_gives_identical_replicas():
    a, b = _build(_config("mimetic")), _build(_config("mimetic"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_checkpoint_loaded_after_the_arm_overrides_it(tmp_path):
    source = _build(_config("default"), seed=5)
    torch.save({"model": source.state_dict()}, tmp_path / "ckpt.pth")
    model = _build(_config("conditioned"))
    assert _q_blocks_orthonormal(find_attention(model)[0])
    DetectionCheckpointer(model).load(str(tmp_path / "ckpt.pth"))
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), source.state_dict().values()))
    assert not _q_blocks_orthonormal(find_attention(model)[0])


def test_options_are_given_per_arm():
    options = {"conditioned": {"gain_v": 0.5}, "mimetic": {"alpha1": 0.3}}
    model = _build(_config("conditioned", include=["backbone.net.blocks.1.*"], options=options))
    assert [s.name for s in model.condinit_report.sites] == ["backbone.net.blocks.1.attn"]
    assert torch.equal(find_attention(model)[1].weight("v"), 0.5 * torch.eye(64))
    assert _build(_config("mimetic", options=options)).condinit_report.options["alpha1"] == 0.3
    # The default arm ignores the other arms' entries, so --arm all runs with custom options.
    assert _build(_config("default", options=options)).condinit_report.arm == "default"


def test_the_scale_matched_control_takes_the_conditioned_runs_options():
    options = {"conditioned": {"gain_v": 0.5}, "scale_matched": {"norm": "spectral"}}
    conditioned = _build(_config("conditioned", options=options))
    matched = _build(_config("scale_matched", options=options))
    default = _build(_config("default"))
    assert matched.condinit_report.options == {
        "gain_qk": 1.0,
        "gain_v": 0.5,
        "value_mode": "identity",
        "norm": "spectral",
    }
    changed = set(matched.condinit_report.changed_parameters())
    assert changed == {f"backbone.net.blocks.{i}.attn.qkv.weight" for i in range(3)}
    for name, value in default.state_dict().items():
        if name not in changed:
            assert torch.equal(value, matched.state_dict()[name]), name
    for site, cond_site in zip(find_attention(matched), find_attention(conditioned)):
        for role in ("q", "k", "v"):
            got = torch.linalg.matrix_norm(site.weight(role).detach().double().unflatten(0, (4, 16)), ord=2)
            want = torch.linalg.matrix_norm(cond_site.weight(role).detach().double().unflatten(0, (4, 16)), ord=2)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "node, message",
    [
        (
            {"arm": "best"},
            "condinit.arm='best' is not an arm; accepted: default, mimetic, conditioned, scale_matched, structured",
        ),
        ({"arm": "conditioned", "gain": 2}, "unknown key\\(s\\) gain; accepted: arm, seed, include, exclude, options"),
        (
            {"arm": "conditioned", "options": {"gain_qk": 2.0}},
            "condinit.options takes one entry per arm: write condinit.options.conditioned.gain_qk=... \\(entries",
        ),
        (
            {"arm": "scale_matched", "options": {"scale_matched": {"norm": "l2"}}},
            "condinit.options.scale_matched: norm must be one of frobenius, spectral, got 'l2'",
        ),
        ({"arm": "conditioned", "options": {"bogus": {"x": 1}}}, "condinit.options.bogus: 'bogus' is not an arm"),
        (
            {"arm": "default", "options": {"mimetic": {"gain_qk": 2.0}}},
            "condinit.options.mimetic: option\\(s\\) gain_qk are not accepted by the 'mimetic' arm; accepted: alpha1",
        ),
        ({"arm": "default", "options": {"default": {"alpha1": 2.0}}}, "not accepted by the 'default' arm"),
        ({"arm": "conditioned", "seed": "x"}, "condinit.seed must be an integer or None"),
    ],
)
def test_bad_arm_nodes_are_refused_before_the_build(node, message):
    with pytest.raises(ValueError, match=message):
        resolve_arm_node(node)


def test_missing_node_means_default_and_negative_seed_means_zero():
    assert resolve_arm_node(None).arm == "default"
    assert resolve_arm_node({"arm": "mimetic", "seed": -1}).seed == 0


def test_arm_errors_of_the_model_are_arm_errors():
    with pytest.raises(ArmError, match="include pattern 'nothing.\\*' matches no attention site"):
        _build(_config("conditioned", include=["nothing.*"]))


def test_an_armed_backbone_names_sites_as_in_the_full_model():
    swin = armed(
        L(SwinTransformer)(
            pretrain_img_size=64,
            patch_size=4,
            embed_dim=32,
            depths=(2, 2),
            num_heads=(2, 4),
            window_size=4,
            out_indices=(0, 1),
        ),
        condinit={"arm": "conditioned", "seed": 0, "include": ["backbone.layers.1.*"]},
        site_prefix="backbone.",
    )
    torch.manual_seed(0)
    built = instantiate(swin)
    assert isinstance(built, SwinTransformer)
    assert [s.name for s in built.condinit_report.sites] == [
        "backbone.layers.1.blocks.0.attn",
        "backbone.layers.1.blocks.1.attn",
    ]
    sites = {s.name: s for s in find_attention(built)}
    assert _q_blocks_orthonormal(sites["layers.1.blocks.0.attn"])
    assert not _q_blocks_orthonormal(sites["layers.0.blocks.0.attn"])
    assert built(torch.randn(1, 3, 64, 64))["p1"].shape == (1, 64, 8, 8)


def test_an_arm_applied_in_two_places_is_refused():
    cfg = _config("conditioned")
    cfg.model.net = armed(cfg.model.net, condinit={"arm": "conditioned"}, site_prefix="backbone.net.")
    with pytest.raises(ValueError, match="the arm is applied in two places"):
        _build(cfg)
    with pytest.raises(ValueError, match="armed already"):
        armed(cfg.model)


def test_an_arm_set_in_two_disagreeing_places_is_refused_by_a_plain_instantiate():
    """No project entry point: a literal or overridden model.condinit that disagrees with condinit fails."""
    cfg = _config("conditioned")
    cfg.model.condinit = {"arm": "mimetic"}
    with pytest.raises(
        ValueError,
        match="the arm is set in two places that disagree: condinit .*'conditioned'.* and "
        "the condinit of the armed .* node .*'mimetic'",
    ):
        instantiate(cfg.model)
    cfg.model.condinit = {"arm": "conditioned", "seed": 0}  # agrees with condinit: accepted
    assert instantiate(cfg.model).condinit_report.arm == "conditioned"
    cfg = _config("conditioned")
    cfg.model.net = armed(cfg.model.net, condinit={"arm": "mimetic"}, site_prefix="backbone.net.")
    with pytest.raises(ValueError, match="the arm is set in two places that disagree"):
        _build(cfg)


def test_other_ranks_leave_the_arm_to_the_ddp_broadcast(monkeypatch):
    default = _build(_config("default"))
    from detectron2.utils import comm

    monkeypatch.setattr(comm, "get_rank", lambda: 1)
    with arm_module.rank0_computes_arm():
        skipped = _build(_config("conditioned"))
    assert skipped.condinit_report.sites == [] and skipped.condinit_report.arm == "conditioned"
    assert all(torch.equal(x, y) for x, y in zip(default.state_dict().values(), skipped.state_dict().values()))
    assert _build(_config("conditioned")).condinit_report.sites  # outside the context every rank computes it
