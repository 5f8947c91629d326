"""Apply an arm to the attention sites of a model, in place.

All randomness comes from one ``torch.Generator`` per site, seeded from ``(seed, site name)``:
the global RNG is never advanced, and a site's weights do not depend on which other sites are
included. Blocks are computed in float64 on the CPU and cast to each parameter's dtype/device.
"""
from __future__ import annotations

import contextlib
import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..fileio import atomic_write
from .arms import haar_semi_orthogonal, mimetic_noise, mimetic_qk, mimetic_vo, rectangular_identity
from .sites import AttentionSite, find_attention, select_sites, supported_layouts

__all__ = ["ARMS", "ARM_OPTIONS", "InitReport", "SiteReport", "apply_init", "site_generator"]

ARMS = ("default", "mimetic", "conditioned")

ARM_OPTIONS: Dict[str, Dict[str, object]] = {
    "default": {},
    "conditioned": {
        "gain_qk": 1.0,  # every singular value of each Q/K head block
        "gain_v": 1.0,  # scale of the value projection's rectangular identity
        "value_mode": "identity",  # "identity": W_V = I[D_v, D_in]; "shared_block": every head I[dh, D_in]
        "condition_output": False,  # ablation: also give W_O orthonormal rows/columns (kappa 1)
    },
    "mimetic": {
        "alpha1": 0.7,
        "beta1": 0.7,
        "alpha2": 0.4,
        "beta2": 0.4,
        "noise": "normal",  # "normal" | "uniform"; std 1/sqrt(D) either way
    },
}

_VALUE_MODES = ("identity", "shared_block")


@dataclass
class SiteReport:
    """What the arm did to one site."""

    name: str
    kind: str
    dim_in: int
    dim: int
    dim_v: int
    dim_out: int
    num_heads: int
    head_dim: int
    changed: List[str] = field(default_factory=list)
    note: str = ""


@dataclass
class InitReport:
    """The outcome of :func:`apply_init`: the arm, its resolved options, and every touched site."""

    arm: str
    seed: int
    options: Dict[str, object]
    sites: List[SiteReport]

    def to_dict(self) -> dict:
        return asdict(self)

    def changed_parameters(self) -> List[str]:
        return [name for site in self.sites for name in site.changed]

    def summary(self) -> str:
        kinds = sorted({s.kind for s in self.sites})
        return (f"arm={self.arm} seed={self.seed}: {len(self.sites)} attention sites ({', '.join(kinds) or 'none'}), "
                f"{len(self.changed_parameters())} parameters changed")

    def save(self, path: str) -> None:
        """Write the report as JSON atomically (a temp file in the same folder, then rename)."""
        atomic_write(path, json.dumps(self.to_dict(), indent=2))


def site_generator(seed: int, site_name: str) -> torch.Generator:
    """The CPU generator an arm uses for one site: seeded from ``seed`` and the site's name."""
    g = torch.Generator(device="cpu")
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(site_name.encode())) % (2 ** 63))
    return g


def resolve_options(arm: str, options: dict) -> Dict[str, object]:
    """The arm's options with defaults filled in; raises ValueError on unknown arms or options."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; accepted arms: {', '.join(ARMS)}")
    accepted = ARM_OPTIONS[arm]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"option(s) {', '.join(unknown)} are not accepted by the {arm!r} arm; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    resolved = {**accepted, **options}
    if arm == "conditioned" and resolved["value_mode"] not in _VALUE_MODES:
        raise ValueError(f"value_mode must be one of {', '.join(_VALUE_MODES)}, got {resolved['value_mode']!r}")
    if arm == "mimetic" and resolved["noise"] not in ("normal", "uniform"):
        raise ValueError(f"noise must be 'normal' or 'uniform', got {resolved['noise']!r}")
    return resolved


def apply_init(
    module: nn.Module,
    arm: str,
    *,
    seed: int,
    include: Optional[Sequence[str]] = None,
    exclude: Optional[Sequence[str]] = None,
    **options,
) -> InitReport:
    """Apply ``arm`` in place to the attention sites of ``module`` and report what changed.

    arm: one of :data:`ARMS`. seed: seed of the arm's generators.
    include / exclude: fnmatch patterns on site names (see :func:`select_sites`).
    options: the arm's options (:data:`ARM_OPTIONS` lists them with their defaults).
    Call it after the model is built and before a checkpoint is loaded.
    """
    resolved = resolve_options(arm, options)
    sites = find_attention(module)
    if not sites:
        raise ValueError(
            f"no attention site found in {type(module).__name__}; supported layouts: "
            f"{'; '.join(supported_layouts())}. Register others with condinit_det.init.register_attention_adapter"
        )
    sites = select_sites(sites, include, exclude)
    reports = []
    # The conditioned arm's draws are small QRs ([D_in, dh]); spreading each over OpenMP threads
    # costs more than it saves, badly so on a busy machine. Mimetic's D x D factorizations keep them.
    threads = 1 if arm == "conditioned" else torch.get_num_threads()
    with torch.no_grad(), _num_threads(threads):
        for site in sites:
            generator = site_generator(seed, site.name)
            if arm == "conditioned":
                changed, note = _apply_conditioned(site, generator, **resolved)
            elif arm == "mimetic":
                changed, note = _apply_mimetic(site, generator, **resolved)
            else:
                changed, note = [], ""
            reports.append(SiteReport(**site.describe(), changed=changed, note=note))
    return InitReport(arm=arm, seed=int(seed), options=resolved, sites=reports)


@contextlib.contextmanager
def _num_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write(target: torch.Tensor, value: torch.Tensor) -> None:
    target.copy_(value.to(dtype=target.dtype, device=target.device))


def _apply_conditioned(site: AttentionSite, generator: torch.Generator, *, gain_qk: float, gain_v: float,
                       value_mode: str, condition_output: bool):
    dh, heads = site.head_dim, site.num_heads
    # Draw order, fixed: per head, Q then K; then W_O (only with condition_output).
    for h in range(heads):
        rows = slice(h * dh, (h + 1) * dh)
        _write(site.weight("q")[rows], gain_qk * haar_semi_orthogonal(dh, site.dim_in, generator=generator))
        _write(site.weight("k")[rows], gain_qk * haar_semi_orthogonal(dh, site.dim_k_in, generator=generator))
    if value_mode == "identity":
        value = rectangular_identity(site.dim_v, site.dim_v_in)
    else:
        dh_v = site.dim_v // heads
        value = rectangular_identity(dh_v, site.dim_v_in).repeat(heads, 1)
    _write(site.weight("v"), gain_v * value)
    roles = ["q", "k", "v"]
    for role in roles:
        bias = site.bias(role)
        if bias is not None:
            bias.zero_()
    if condition_output:
        out = site.weight("o")
        _write(out, haar_semi_orthogonal(out.shape[0], out.shape[1], generator=generator))
        roles.append("o")
    changed = site.parameter_names(roles[:3]) + (site.parameter_names(["o"], biases=False) if condition_output else [])
    return changed, ""


def _apply_mimetic(site: AttentionSite, generator: torch.Generator, *, alpha1: float, beta1: float,
                   alpha2: float, beta2: float, noise: str):
    dh = site.head_dim
    d_in = site.dim_in
    # Draw order, fixed: one Z per head for Q/K, then one Z for V/O.
    for h in range(site.num_heads):
        z = mimetic_noise(d_in, site.dim_k_in, std=d_in ** -0.5, noise=noise, generator=generator)
        w_q, w_k = mimetic_qk(z, alpha=alpha1, beta=beta1, head_dim=dh)
        rows = slice(h * dh, (h + 1) * dh)
        _write(site.weight("q")[rows], w_q)
        _write(site.weight("k")[rows], w_k)
    d_v_in = site.dim_v_in
    z = mimetic_noise(d_v_in, site.dim_out, std=d_v_in ** -0.5, noise=noise, generator=generator)
    w_v, w_o, exact = mimetic_vo(z, alpha=alpha2, beta=beta2, dim_v=site.dim_v,
                                 w_v_default=site.weight("v").detach().cpu())
    _write(site.weight("v"), w_v)
    _write(site.weight("o"), w_o)
    note = "" if exact else (
        f"value width {site.dim_v} < min(D_v_in, D_out): W_v^T W_o^T is the best rank-{site.dim_v} "
        "approximation of the mimetic target")
    changed = site.parameter_names(["q", "k", "v", "o"], biases=False)
    return changed, note
