"""The structured control arm: the conditioned arm's blocks at the default init's per-head norms.

The norms are read from a copy of the same model before any arm (its default init), and the blocks from the
conditioned arm applied with the same seed, so the tests check the definition on every supported layout: each head
block of W_Q, W_K and W_V has the default init's norm and the conditioned arm's direction, and the Q/K head blocks keep
the conditioned arm's flat singular values.
"""

import copy

import pytest
import torch
from test_init_arms import LAYOUTS, build_layout  # tests/ is on sys.path (pytest, rootdir mode)
from torch import nn

from condinit_det.init import ARM_OPTIONS, apply_init, find_attention, resolve_options
from condinit_det.init.spec import resolve_arm_node

F64 = torch.float64
QKV = ("q", "k", "v")
NORMS = ("frobenius", "spectral")
OPTION_SETS = [
    {},
    {"gain_qk": 0.5, "gain_v": 2.0},
    {"gain_qk": -0.7, "gain_v": 0.25, "value_mode": "shared_block"},
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


def _three_copies(layout, dtype=F64):
    """The same freshly built model three times: for structured, conditioned and the default arm."""
    model, inputs = build_layout(layout, dtype)
    return model, copy.deepcopy(model), copy.deepcopy(model), inputs


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("options", OPTION_SETS, ids=["defaults", "gains", "shared_block"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_head_norms_are_the_default_inits_and_directions_the_conditioned_arms(layout, options, norm):
    structured, conditioned, default, inputs = _three_copies(layout)
    apply_init(structured, "structured", seed=0, norm=norm, **options)
    apply_init(conditioned, "conditioned", seed=0, **options)
    site, cond_site, default_site = (find_attention(m)[0] for m in (structured, conditioned, default))
    for role in QKV:
        got, cond = _head_blocks(site, role), _head_blocks(cond_site, role)
        default_norms = _norms(_head_blocks(default_site, role), norm)
        keeps = _norms(cond, norm) > 0  # a value head the conditioned identity leaves empty stays empty
        torch.testing.assert_close(_norms(got, norm)[keeps], default_norms[keeps], rtol=1e-12, atol=0)
        assert torch.count_nonzero(got[~keeps]) == 0
        for h in torch.nonzero(keeps).flatten().tolist():
            factor = (got[h] * cond[h]).sum() / (cond[h] * cond[h]).sum()
            assert factor > 0, f"{layout} {role}{h}"  # one positive factor per head block
            torch.testing.assert_close(got[h], factor * cond[h], rtol=0, atol=1e-14)
        if role != "v":  # the conditioned arm's flat spectrum: every singular value of a head block equal
            singular = torch.linalg.svdvals(got)
            torch.testing.assert_close(singular.amin(-1), singular.amax(-1), rtol=1e-12, atol=0)
    out = structured.block.attn(*[x.to(F64) for x in inputs()])
    assert torch.isfinite(out[0] if isinstance(out, tuple) else out).all()


@pytest.mark.parametrize("layout", ["d2_vit", "timm_xcit", "mha_separate"])
def test_seeds_reproduce_it_and_change_it_and_nothing_else_moves(layout):
    first, second, other, _ = _three_copies(layout)
    default = copy.deepcopy(first)
    rng = torch.get_rng_state()
    report = apply_init(first, "structured", seed=4)
    apply_init(second, "structured", seed=4)
    apply_init(other, "structured", seed=5)
    assert torch.equal(rng, torch.get_rng_state()), "the global RNG must not advance"
    changed = set(report.changed_parameters())
    site = find_attention(first)[0]
    assert changed == set(site.parameter_names(QKV))  # the q/k/v weights and biases (zeroed), as conditioned
    state, again, moved, ref = (m.state_dict() for m in (first, second, other, default))
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert any(not torch.equal(state[k], moved[k]) for k in changed if k.endswith("weight"))
    assert all(torch.equal(state[k], ref[k]) for k in state if k not in changed)


def test_float32_parameters_hold_the_default_norms_to_their_rounding():
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(64, 4)
    before = _norms(_head_blocks(find_attention(attn)[0], "k"), "frobenius")
    apply_init(attn, "structured", seed=0)
    assert attn.in_proj_weight.dtype == torch.float32
    after = _norms(_head_blocks(find_attention(attn)[0], "k"), "frobenius")
    torch.testing.assert_close(after, before, rtol=1e-6, atol=0)


def test_a_zero_default_block_stays_zero_and_is_reported():
    attn = nn.MultiheadAttention(16, 2)
    attn.in_proj_weight[24:32].zero_()  # the key block of head 1
    report = apply_init(attn, "structured", seed=0)
    assert torch.count_nonzero(attn.in_proj_weight[24:32]) == 0
    assert torch.count_nonzero(attn.in_proj_weight[16:24]) > 0
    assert "k1" in report.sites[0].note


def test_options_come_from_the_conditioned_arm():
    assert ARM_OPTIONS["structured"] == {"norm": "frobenius"}
    assert resolve_options("structured", {"gain_v": 0.5}) == {
        "gain_qk": 1.0,
        "gain_v": 0.5,
        "value_mode": "identity",
        "norm": "frobenius",
    }
    spec = resolve_arm_node(
        {
            "arm": "structured",
            "options": {
                "conditioned": {"gain_v": 0.5, "value_mode": "shared_block"},
                "structured": {"norm": "spectral"},
            },
        }
    )
    assert spec.arm_options == {"norm": "spectral", "gain_v": 0.5, "value_mode": "shared_block"}
    with pytest.raises(ValueError, match=r"condinit.options.structured.gain_v: the structured arm takes gain_qk"):
        resolve_arm_node({"arm": "structured", "options": {"structured": {"gain_v": 0.5}}})
    with pytest.raises(ValueError, match="condinit.options.structured: norm must be one of frobenius, spectral"):
        resolve_arm_node({"arm": "default", "options": {"structured": {"norm": "l1"}}})
