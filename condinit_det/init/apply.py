"""Apply an arm to the attention sites of a model, in place (:func:`apply_init`); the math is in :mod:`.arms`.

Each site draws from its own CPU generator (:func:`site_generator`) and the sites are computed in order on one thread,
so a seed gives the same weights on any machine and the global RNG never advances (docs/arms.md: randomness).
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import threadpoolctl
import torch
from torch import nn

from ..utils.fileio import atomic_write
from .arms import haar_semi_orthogonal_batch, mimetic_noise_batch, mimetic_qk_batch, mimetic_vo, working_dtype
from .options import NORMS, VALUE_MODES, resolve_options
from .sites import AttentionSite, find_attention, select_sites, supported_layouts

__all__ = ["InitReport", "SiteReport", "apply_init", "conditioned_head_norms", "site_generator"]


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
        return (
            f"arm={self.arm} seed={self.seed}: {len(self.sites)} attention sites ({', '.join(kinds) or 'none'}), "
            f"{len(self.changed_parameters())} parameters changed"
        )

    def save(self, path: str) -> None:
        """Write the report as JSON atomically (a temp file in the same folder, then rename)."""
        atomic_write(path, json.dumps(self.to_dict(), indent=2))


def site_generator(seed: int, site_name: str) -> torch.Generator:
    """The CPU generator an arm uses for one site: seeded from ``seed`` and the site's name."""
    g = torch.Generator(device="cpu")
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(site_name.encode())) % (2**63))
    return g


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

    Call it after the model is built and before a checkpoint is loaded.

    Args:
        arm: one of :data:`ARMS`.
        seed: seed of the arm's per-site generators.
        include, exclude: fnmatch patterns on site names (see :func:`select_sites`).
        options: the arm's options (:data:`ARM_OPTIONS` lists them with their defaults).
    """
    resolved = resolve_options(arm, options)
    sites = find_attention(module)
    if not sites:
        raise ValueError(
            f"no attention site found in {type(module).__name__}; supported layouts: "
            f"{'; '.join(supported_layouts())}. Register others with condinit_det.init.register_attention_adapter"
        )
    sites = select_sites(sites, include, exclude)
    if arm == "mimetic":
        import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, so that _one_thread() limits it too)
    reports = []
    with torch.no_grad(), _one_thread():
        for site in sites:
            changed, note = _apply_site(site, arm, seed, resolved)
            reports.append(SiteReport(**site.describe(), changed=changed, note=note))
    return InitReport(arm=arm, seed=int(seed), options=resolved, sites=reports)


@contextlib.contextmanager
def _one_thread():
    """torch's intra-op threads and every BLAS library loaded so far on one thread inside the block."""
    torch_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(torch_before)


def _apply_site(site: AttentionSite, arm: str, seed: int, resolved: Dict[str, object]):
    """``(changed parameter names, note)`` of one site under ``arm``."""
    if arm == "conditioned":
        return _apply_conditioned(site, site_generator(seed, site.name), **resolved)
    if arm == "mimetic":
        return _apply_mimetic(site, site_generator(seed, site.name), **resolved)
    if arm == "scale_matched":
        return _apply_scale_matched(site, **resolved)
    if arm == "structured":
        return _apply_structured(site, site_generator(seed, site.name), **resolved)
    return [], ""


def _compute_device(site: AttentionSite) -> torch.device:
    """Where a site's float64 factorizations run: its parameters' CUDA device, else the CPU."""
    device = site.weight("q").device
    return device if device.type == "cuda" else torch.device("cpu")


def _write_heads(target: torch.Tensor, blocks: torch.Tensor, gain=1.0) -> None:
    """Write ``[H, dh, D]`` head blocks, times ``gain`` (a number or ``[H]``) in the working precision, into the
    ``[H * dh, D]`` rows they form, rounded once to the parameter's dtype."""
    if isinstance(gain, torch.Tensor):
        blocks = blocks * gain.to(device=blocks.device, dtype=blocks.dtype)[:, None, None]
    elif gain != 1.0:
        blocks = blocks * gain
    target.unflatten(0, blocks.shape[:2]).copy_(blocks)


def _apply_conditioned(
    site: AttentionSite,
    generator: torch.Generator,
    *,
    gain_qk: float,
    gain_v: float,
    value_mode: str,
    condition_output: bool = False,
    head_scales: Optional[Dict[str, torch.Tensor]] = None,
):
    """The conditioned arm on one site; ``head_scales``: role -> ``[H]`` float64 factors that multiply each head
    block of W_Q, W_K and W_V on top of its gain (the structured arm's)."""
    dh, heads = site.head_dim, site.num_heads
    device = _compute_device(site)
    work = dict(generator=generator, device=device, dtype=working_dtype(site.weight("q").dtype))
    # Draw order, fixed: when Q and K take inputs of the same width, one draw of 2*heads Gaussian
    # blocks, Q's heads 0..H-1 then K's heads 0..H-1, factorized by one batched QR; otherwise the
    # H query blocks, then the H key blocks. Then W_O (only with condition_output).
    if site.dim_in == site.dim_k_in:
        both = haar_semi_orthogonal_batch(2 * heads, dh, site.dim_in, **work)
        q_blocks, k_blocks = both[:heads], both[heads:]
    else:
        q_blocks = haar_semi_orthogonal_batch(heads, dh, site.dim_in, **work)
        k_blocks = haar_semi_orthogonal_batch(heads, dh, site.dim_k_in, **work)
    scales = head_scales or {}
    for role, blocks in (("q", q_blocks), ("k", k_blocks)):
        _write_heads(site.weight(role), blocks, gain_qk if role not in scales else gain_qk * scales[role])
    # gain_v times the rectangular identity (whole value projection, or every head's block),
    # written in place: zeros, and gain_v rounded once to the parameter's dtype on the diagonal.
    w_v = site.weight("v")
    blocks = w_v.unsqueeze(0) if value_mode == "identity" else w_v.unflatten(0, (heads, site.dim_v // heads))
    blocks.zero_()
    diagonal = torch.diagonal(blocks, dim1=-2, dim2=-1)
    if "v" in scales:
        # The diagonal entry (row i of W_V) belongs to head i // (D_v / H) in the identity mode, to head h (the
        # block's index) in the shared-block mode.
        rows = torch.arange(diagonal.shape[-1]) // (site.dim_v // heads)
        per_head = gain_v * scales["v"].cpu()
        diagonal.copy_(per_head[rows][None, :] if value_mode == "identity" else per_head[:, None].expand_as(diagonal))
    else:
        diagonal.fill_(gain_v)
    for role in ("q", "k", "v"):
        bias = site.bias(role)
        if bias is not None:
            bias.zero_()
    changed = site.parameter_names(["q", "k", "v"])
    if condition_output:
        out = site.weight("o")
        work["dtype"] = working_dtype(out.dtype)
        out.copy_(haar_semi_orthogonal_batch(1, *out.shape, **work)[0])
        changed += site.parameter_names(["o"], biases=False)
    return changed, ""


def _apply_mimetic(
    site: AttentionSite,
    generator: torch.Generator,
    *,
    alpha1: float,
    beta1: float,
    alpha2: float,
    beta2: float,
    noise: str,
    solver: str,
):
    dh, heads = site.head_dim, site.num_heads
    d_in = site.dim_in
    device = _compute_device(site)
    # Draw order, fixed: one draw of the heads' Q/K noises [H, D_in, D_k_in], then the V/O noise.
    # A best rank-r approximation moves by about eps / (relative gap at s_r) when its target is
    # rounded, and the spectrum of alpha Z + beta I is dense, so truncated targets stay in float64
    # whatever the dtype; only V/O's exact factorization runs in the working precision.
    z = mimetic_noise_batch(heads, d_in, site.dim_k_in, std=d_in**-0.5, noise=noise, generator=generator)
    w_q, w_k = mimetic_qk_batch(
        z.to(device), alpha=alpha1, beta=beta1, head_dim=dh, solver=solver if device.type == "cpu" else "dense"
    )
    del z
    _write_heads(site.weight("q"), w_q)
    _write_heads(site.weight("k"), w_k)
    d_v_in = site.dim_v_in
    truncated = site.dim_v < min(d_v_in, site.dim_out)
    z = mimetic_noise_batch(
        1,
        d_v_in,
        site.dim_out,
        std=d_v_in**-0.5,
        noise=noise,
        generator=generator,
        dtype=torch.float64 if truncated else working_dtype(site.weight("v").dtype),
    )[0]
    w_v, w_o, exact = mimetic_vo(
        z.to(device), alpha=alpha2, beta=beta2, dim_v=site.dim_v, w_v_default=site.weight("v").detach()
    )
    site.weight("v").copy_(w_v)
    site.weight("o").copy_(w_o)
    note = ""
    if not exact:
        note = (
            f"value width {site.dim_v} < min(D_v_in, D_out): W_v^T W_o^T is the best rank-{site.dim_v} "
            "approximation of the mimetic target"
        )
    return site.parameter_names(["q", "k", "v", "o"], biases=False), note


def conditioned_head_norms(
    site: AttentionSite,
    *,
    gain_qk: float = 1.0,
    gain_v: float = 1.0,
    value_mode: str = "identity",
    norm: str = "frobenius",
) -> Dict[str, List[float]]:
    """The norm the conditioned arm gives each head block of W_Q, W_K and W_V of ``site``.

    Args:
        site: an attention site (:func:`condinit_det.init.find_attention`).
        gain_qk, gain_v, value_mode: the conditioned arm's options.
        norm: ``"frobenius"`` or ``"spectral"``.

    Returns ``{"q": [H floats], "k": [...], "v": [...]}``, head h first (formulas: docs/arms.md,
    scale_matched).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if value_mode not in VALUE_MODES:
        raise ValueError(f"value_mode must be one of {', '.join(VALUE_MODES)}, got {value_mode!r}")
    heads, dh, dh_v = site.num_heads, site.head_dim, site.dim_v // site.num_heads

    def target(gain: float, ones: int) -> float:
        # `ones` orthonormal rows (or columns) scaled by `gain`: ||.||_F = |gain| sqrt(ones), ||.||_2 = |gain|.
        if ones == 0:
            return 0.0
        return abs(gain) * (math.sqrt(ones) if norm == "frobenius" else 1.0)

    if value_mode == "identity":
        diagonal = min(site.dim_v, site.dim_v_in)
        value_ones = [min(max(diagonal - h * dh_v, 0), dh_v) for h in range(heads)]
    else:
        value_ones = [min(dh_v, site.dim_v_in)] * heads
    return {
        "q": [target(gain_qk, min(dh, site.dim_in))] * heads,
        "k": [target(gain_qk, min(dh, site.dim_k_in))] * heads,
        "v": [target(gain_v, ones) for ones in value_ones],
    }


def _block_norms(blocks: torch.Tensor, norm: str) -> torch.Tensor:
    """``[H]`` Frobenius or spectral norms of ``[H, rows, cols]`` blocks."""
    return torch.linalg.matrix_norm(blocks, ord="fro" if norm == "frobenius" else 2)


def _apply_scale_matched(site: AttentionSite, *, gain_qk: float, gain_v: float, value_mode: str, norm: str):
    targets = conditioned_head_norms(site, gain_qk=gain_qk, gain_v=gain_v, value_mode=value_mode, norm=norm)
    device = _compute_device(site)
    heads = site.num_heads
    rescaled = {}
    for role in ("q", "k", "v"):
        # Factors from the stored values in float64; one rounding to the parameter's dtype on write.
        blocks = site.weight(role).detach().to(device=device, dtype=torch.float64).unflatten(0, (heads, -1))
        current = _block_norms(blocks, norm)
        wanted = torch.tensor(targets[role], dtype=torch.float64, device=device)
        empty = (current == 0) & (wanted > 0)
        if bool(empty.any()):
            h = int(empty.nonzero()[0])
            raise ValueError(
                f"scale_matched: head {h} of the {role} projection of site {site.name!r} is all zeros in the "
                f"default init, so it cannot be rescaled to norm {targets[role][h]:.6g}; the arm rescales a "
                "non-zero default init (apply it to a freshly built model)"
            )
        factors = wanted / torch.where(current > 0, current, 1.0)
        # A zero target writes +0.0 (as the conditioned arm's zero_()), not the -0.0 of negative entries * 0.
        rescaled[role] = torch.where((wanted > 0)[:, None, None], blocks * factors[:, None, None], 0.0)
    # Written only once every role is checked, so that an error leaves the site as it was.
    for role, blocks in rescaled.items():
        site.weight(role).copy_(blocks.flatten(0, 1))
    zeroed = [f"{role}{h}" for role in ("q", "k", "v") for h in range(heads) if targets[role][h] == 0]
    note = ""
    if zeroed:
        note = (
            f"zero target, block set to zero: {', '.join(zeroed)} (the conditioned arm gives these head blocks no "
            "non-zero entry)"
        )
    return site.parameter_names(["q", "k", "v"], biases=False), note


def _apply_structured(
    site: AttentionSite, generator: torch.Generator, *, gain_qk: float, gain_v: float, value_mode: str, norm: str
):
    """The conditioned arm's blocks (the same draws for the same seed), each head block of W_Q, W_K and W_V rescaled
    to the norm the block it replaces has: the default init's, measured on the weights present."""
    targets = conditioned_head_norms(site, gain_qk=gain_qk, gain_v=gain_v, value_mode=value_mode, norm=norm)
    scales, zeroed = {}, []
    for role in ("q", "k", "v"):
        blocks = site.weight(role).detach().to(torch.float64).unflatten(0, (site.num_heads, -1))
        default = _block_norms(blocks, norm).cpu()
        conditioned = torch.tensor(targets[role], dtype=torch.float64)
        scales[role] = torch.where(conditioned > 0, default / torch.where(conditioned > 0, conditioned, 1.0), 0.0)
        zeroed += [f"{role}{h}" for h in range(site.num_heads) if scales[role][h] == 0]
    changed, _ = _apply_conditioned(
        site, generator, gain_qk=gain_qk, gain_v=gain_v, value_mode=value_mode, head_scales=scales
    )
    note = ""
    if zeroed:
        note = (
            f"block set to zero: {', '.join(zeroed)} (zero in the weights present, or no non-zero entry in the "
            "conditioned arm's)"
        )
    return changed, note
