"""The scale-matched control arm: the default init rescaled per head to the conditioned arm's norms.

Targets are taken from the conditioned arm itself (applied to a copy of the same model), so the
tests check the definition, not a re-derivation of it: every head block of W_Q, W_K and W_V has
the norm the conditioned arm gives it, and the direction the default arm gives it.
"""

import copy
import json

import pytest
import torch
from test_init_arms import LAYOUTS, build_layout  # tests/ is on sys.path (pytest, rootdir mode)
from torch import nn

from condinit_det.init import (
    ARM_OPTIONS,
    ARMS,
    PAPER_ARMS,
    apply_init,
    conditioned_head_norms,
    find_attention,
    resolve_options,
)
from condinit_det.init.spec import ArmError, apply_arm_spec, resolve_arm_node

F64 = torch.float64
QKV = ("q", "k", "v")
NORMS = ("frobenius", "spectral")
OPTION_SETS = [
    {},
    {"gain_qk": 0.5, "gain_v": 2.0},
    {"gain_qk": -0.7, "gain_v": 0.25, "value_mode": "shared_block"},  # a negative gain: its magnitude counts
]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _head_blocks(site, role):
    """``[H, rows, cols]`` float64 copy of the role's head blocks."""
    return site.weight(role).detach().to(F64).unflatten(0, (site.num_heads, -1))


def _norms(blocks, norm):
    return torch.linalg.matrix_norm(blocks, ord="fro" if norm == "frobenius" else 2)


def _randomize_biases(model):
    """Non-zero biases everywhere, so that a bias the arm touched would show."""
    g = torch.Generator().manual_seed(5)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))


def _three_copies(layout, dtype=F64):
    """The same model (random biases) three times: for scale_matched, conditioned and the default arm."""
    model, inputs = build_layout(layout, dtype)
    _randomize_biases(model)
    return model, copy.deepcopy(model), copy.deepcopy(model), inputs


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("options", OPTION_SETS, ids=["defaults", "gains", "shared_block"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_head_norms_are_the_conditioned_arms(layout, options, norm):
    matched, conditioned, default, _ = _three_copies(layout)
    apply_init(matched, "scale_matched", seed=0, norm=norm, **options)
    apply_init(conditioned, "conditioned", seed=0, **options)
    site, cond_site = find_attention(matched)[0], find_attention(conditioned)[0]
    targets = conditioned_head_norms(site, norm=norm, **options)
    for role in QKV:
        got = _norms(_head_blocks(site, role), norm)
        want = _norms(_head_blocks(cond_site, role), norm)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{layout} {role}")
        torch.testing.assert_close(got, torch.tensor(targets[role], dtype=F64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_directions_are_the_default_arms(layout, norm):
    matched, _, default, inputs = _three_copies(layout)
    apply_init(matched, "scale_matched", seed=0, norm=norm)
    site, default_site = find_attention(matched)[0], find_attention(default)[0]
    for role in QKV:
        got, ref = _head_blocks(site, role), _head_blocks(default_site, role)
        for h in range(site.num_heads):
            if got[h].norm() == 0:  # a zero target (checked below)
                continue
            torch.testing.assert_close(got[h] / got[h].norm(), ref[h] / ref[h].norm(), rtol=0, atol=1e-14)
            # One positive factor per head block.
            factor = (got[h] * ref[h]).sum() / (ref[h] * ref[h]).sum()
            assert factor > 0
            torch.testing.assert_close(got[h], factor * ref[h], rtol=0, atol=1e-14)
    out = matched.block.attn(*[x.to(F64) for x in inputs()])
    assert torch.isfinite(out[0] if isinstance(out, tuple) else out).all()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_everything_else_is_bitwise_the_default_arms(layout):
    matched, _, default, _ = _three_copies(layout)
    before = {k: v.clone() for k, v in default.state_dict().items()}
    rng = torch.get_rng_state()
    report = apply_init(matched, "scale_matched", seed=3)
    apply_init(default, "default", seed=3)
    assert torch.equal(rng, torch.get_rng_state()), "the global RNG must not advance"
    site = find_attention(matched)[0]
    changed = set(report.changed_parameters())
    assert changed == set(site.parameter_names(QKV, biases=False))  # the q/k/v weights, nothing else
    after, ref = matched.state_dict(), default.state_dict()
    assert all(torch.equal(before[k], ref[k]) for k in before)  # the default arm changes nothing
    unchanged = [k for k in ref if k not in changed]
    assert any(k.endswith("bias") for k in unchanged)  # biases (random here) are among them
    for key in unchanged:
        assert torch.equal(after[key], ref[key]), key
    for key in changed:
        assert not torch.equal(after[key], ref[key]), key


def test_the_seed_does_not_matter_and_results_are_bitwise_for_any_thread_count():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.MultiheadAttention(64, 4) for _ in range(3)])

    before = torch.get_num_threads()
    states = []
    try:
        for threads, seed in ((1, 0), (2, 0), (2, 9)):
            torch.set_num_threads(threads)
            model = build()
            apply_init(model, "scale_matched", seed=seed, norm="spectral")
            states.append(model.state_dict())
            assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in state)


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 2e-7), (torch.bfloat16, 8e-3)])
def test_low_precision_parameters_hold_the_norms_to_their_rounding(dtype, rtol):
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(64, 4).to(dtype)
    apply_init(attn, "scale_matched", seed=0, gain_qk=0.5)
    assert attn.in_proj_weight.dtype == dtype
    site = find_attention(attn)[0]
    for role, target in (("q", 0.5 * 4.0), ("k", 0.5 * 4.0), ("v", 4.0)):  # sqrt(dh = 16) = 4
        got = _norms(_head_blocks(site, role), "frobenius")
        # Rounding each entry to the dtype moves the norm by at most half an ulp, relative.
        torch.testing.assert_close(got, torch.full_like(got, target), rtol=rtol, atol=0)


def test_zero_targets_zero_the_block_and_are_reported():
    # Value width 48 over 4 heads (12 rows each) on a 20-wide value input: head 1 keeps 8 diagonal
    # ones, heads 2 and 3 none, so the conditioned arm leaves them zero: so does this arm.
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(48, 4, kdim=24, vdim=20)
    report = apply_init(attn, "scale_matched", seed=0)
    v = attn.v_proj_weight.unflatten(0, (4, 12))
    assert torch.equal(v[2:], torch.zeros_like(v[2:])) and not torch.signbit(v[2:]).any()  # +0.0
    torch.testing.assert_close(torch.linalg.matrix_norm(v[:2].double()), torch.tensor([12**0.5, 8**0.5], dtype=F64))
    assert "v2, v3" in report.sites[0].note
    # A zero gain zeroes every block of its role.
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(16, 2)
    apply_init(attn, "scale_matched", seed=0, gain_v=0.0)
    assert torch.equal(attn.in_proj_weight[32:], torch.zeros(16, 16))
    assert torch.count_nonzero(attn.in_proj_weight[:32]) == 32 * 16


def test_head_wider_than_its_input():
    # head_dim 16 > kdim 8: the conditioned K blocks have 8 orthonormal columns, norm sqrt(8).
    torch.manual_seed(0)
    matched = nn.MultiheadAttention(32, 2, kdim=8, vdim=8).double()
    conditioned = copy.deepcopy(matched)
    apply_init(matched, "scale_matched", seed=0)
    apply_init(conditioned, "conditioned", seed=0)
    for role in QKV:
        got = _norms(_head_blocks(find_attention(matched)[0], role), "frobenius")
        want = _norms(_head_blocks(find_attention(conditioned)[0], role), "frobenius")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert conditioned_head_norms(find_attention(matched)[0])["k"] == pytest.approx([8**0.5] * 2)


def test_a_zero_default_block_is_an_error_and_changes_nothing():
    attn = nn.MultiheadAttention(16, 2)
    attn.in_proj_weight[24:32].zero_()  # the key block of head 1
    before = attn.in_proj_weight.clone()
    with pytest.raises(ValueError, match=r"head 1 of the k projection of site '' is all zeros in the default init"):
        apply_init(attn, "scale_matched", seed=0)
    assert torch.equal(attn.in_proj_weight, before)  # the query blocks, checked first, were not written either


def test_include_and_exclude_patterns():
    torch.manual_seed(0)
    model = nn.Module()
    model.encoder = nn.ModuleList([nn.MultiheadAttention(16, 2) for _ in range(2)])
    model.decoder = nn.ModuleList([nn.MultiheadAttention(16, 2) for _ in range(2)])
    ref = copy.deepcopy(model)
    report = apply_init(model, "scale_matched", seed=0, include=["encoder.*", "decoder.1"], exclude=["encoder.0"])
    assert [s.name for s in report.sites] == ["encoder.1", "decoder.1"]
    for name in ("encoder.0", "decoder.0"):
        for key, value in model.get_submodule(name).state_dict().items():
            assert torch.equal(value, ref.get_submodule(name).state_dict()[key]), (name, key)
    for name in ("encoder.1", "decoder.1"):
        assert not torch.equal(model.get_submodule(name).in_proj_weight, ref.get_submodule(name).in_proj_weight)
    with pytest.raises(ValueError, match="include pattern 'backbone.*' matches no attention site"):
        apply_init(model, "scale_matched", seed=0, include=["backbone.*"])


def test_options_and_their_errors():
    assert "scale_matched" in ARMS and ARMS.index("scale_matched") == ARMS.index("conditioned") + 1
    assert PAPER_ARMS == ("default", "mimetic", "conditioned")
    assert ARM_OPTIONS["scale_matched"] == {"norm": "frobenius"}  # the gains and value mode: the conditioned arm's
    assert resolve_options("scale_matched", {"gain_v": 0.5, "norm": "spectral"}) == {
        "gain_qk": 1.0,
        "gain_v": 0.5,
        "value_mode": "identity",
        "norm": "spectral",
    }
    bad = [
        (
            {"condition_output": True},
            "option(s) condition_output are not accepted by the 'scale_matched' arm; "
            "accepted: gain_qk, gain_v, value_mode, norm",
        ),
        ({"alpha1": 0.5}, "option(s) alpha1 are not accepted by the 'scale_matched' arm"),
        ({"norm": "nuclear"}, "norm must be one of frobenius, spectral, got 'nuclear'"),
        ({"value_mode": "diag"}, "value_mode must be one of identity, shared_block, got 'diag'"),
        ({"gain_qk": "1"}, "gain_qk must be a finite number, got '1'"),
        ({"gain_v": float("nan")}, "gain_v must be a finite number, got nan"),
        ({"gain_v": True}, "gain_v must be a finite number, got True"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            resolve_options("scale_matched", options)
    with pytest.raises(ValueError, match="norm must be one of frobenius, spectral"):
        apply_init(nn.MultiheadAttention(16, 2), "scale_matched", seed=0, norm="max")


def test_init_report():
    torch.manual_seed(0)
    model = nn.Sequential(nn.MultiheadAttention(16, 2), nn.Linear(16, 16), nn.MultiheadAttention(16, 2))
    report = apply_init(model, "scale_matched", seed=4, gain_v=0.5)
    assert report.arm == "scale_matched" and report.seed == 4
    assert report.options == {"gain_qk": 1.0, "gain_v": 0.5, "value_mode": "identity", "norm": "frobenius"}
    assert [s.name for s in report.sites] == ["0", "2"]
    assert report.changed_parameters() == ["0.in_proj_weight", "2.in_proj_weight"]
    assert all(s.note == "" for s in report.sites)
    assert report.summary() == "arm=scale_matched seed=4: 2 attention sites (mha), 2 parameters changed"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["sites"][1]["changed"] == ["2.in_proj_weight"] and data["options"]["gain_v"] == 0.5


def test_arm_node_accepts_the_arm():
    spec = resolve_arm_node(
        {
            "arm": "scale_matched",
            "seed": 2,
            "options": {
                "conditioned": {"gain_v": 0.5, "condition_output": True},
                "scale_matched": {"norm": "spectral"},
            },
        }
    )
    assert spec.arm == "scale_matched" and spec.arm_options == {"gain_v": 0.5, "norm": "spectral"}
    assert spec.identity()["options"] == {"gain_qk": 1.0, "gain_v": 0.5, "value_mode": "identity", "norm": "spectral"}
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.MultiheadAttention(16, 2))
    report = apply_arm_spec(trunk, spec, site_prefix="backbone.")
    assert [s.name for s in report.sites] == ["backbone.0"]
    with pytest.raises(
        ValueError, match=r"condinit.options.scale_matched.gain_v: .* write condinit.options.conditioned"
    ):
        resolve_arm_node({"arm": "scale_matched", "options": {"scale_matched": {"gain_v": 0.5}}})
    with pytest.raises(ValueError, match="condinit.options.scale_matched: norm must be one of frobenius, spectral"):
        resolve_arm_node({"arm": "scale_matched", "options": {"scale_matched": {"norm": "l1"}}})
    with pytest.raises(ArmError, match="all zeros in the default init"):
        zero = nn.Sequential(nn.MultiheadAttention(16, 2))
        zero[0].in_proj_weight.zero_()
        apply_arm_spec(zero, spec)
