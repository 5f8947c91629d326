"""Apply an arm to the attention sites of a model, in place.

The arms (:data:`ARMS`; DESIGN.md section 3 and :mod:`condinit_det.init.arms` for the math):

- ``default``: the model as its constructor left it; nothing is changed.
- ``mimetic``: Trockman & Kolter's mimetic initialization of Q/K (per head) and V/O (per layer).
- ``conditioned``: per head, Q and K blocks ``gain_qk`` times a Haar block with orthonormal rows;
  V is ``gain_v`` times the rectangular identity ``I[D_v, D_v_in]`` (``value_mode="identity"``) or
  every head's block is ``gain_v * I[dh_v, D_v_in]`` (``"shared_block"``); q/k/v biases zero.
- ``scale_matched``: a control for ``conditioned`` that has its weight scale but not its structure.
  Every head block of W_Q, W_K and W_V keeps the default arm's values up to one positive factor
  per block, chosen so that the block's norm equals the norm the conditioned arm, with the same
  ``gain_qk``, ``gain_v`` and ``value_mode``, gives that block (``norm="frobenius"``, the default,
  or ``norm="spectral"``: the largest singular value). With ``dh = D / H`` query/key rows per head
  (input widths D_in for Q, D_k_in for K) and ``dh_v = D_v / H`` value rows per head (input width
  D_v_in), the targets of head h are

  - Q: Frobenius ``|gain_qk| * sqrt(min(dh, D_in))``, spectral ``|gain_qk|`` (orthonormal rows,
    or orthonormal columns when dh > D_in);
  - K: the same with D_k_in;
  - V, ``value_mode="identity"``: the head's rows ``h*dh_v ... (h+1)*dh_v - 1`` of ``I[D_v, D_v_in]``
    hold ``n_h = clamp(min(D_v, D_v_in) - h*dh_v, 0, dh_v)`` ones, so Frobenius
    ``|gain_v| * sqrt(n_h)``, spectral ``|gain_v|`` (0 when n_h = 0);
  - V, ``value_mode="shared_block"``: ``n_h = min(dh_v, D_v_in)`` for every head.

  A zero target (a value head whose identity rows lie past the input width, D_v > D_v_in, or a
  zero gain) sets the block to zero, as the conditioned arm does; the site's report notes it. A
  block whose default values are all zero cannot be rescaled to a non-zero target: that is an
  error. Norms and factors are computed in float64 from the stored blocks and each block is
  rounded once to the parameter's dtype, so the norms hold to that dtype's rounding. Biases, the
  output projection and every other parameter keep the default arm's values bitwise; the arm
  draws nothing, so the seed does not change its result.

All randomness comes from one CPU ``torch.Generator`` per site, seeded from ``(seed, site name)``:
the global RNG is never advanced, and a site's weights do not depend on which other sites are
included. Draws are float32 and happen on the CPU (so a seed gives the same values on every
device and for every dtype, up to rounding); the factorizations run in the parameters' working
precision (float64 for float64 parameters, else float32: exact to the dtype written; mimetic's
truncated targets stay in float64) on the parameters' device when it is a CUDA device, else on the
CPU, and the blocks are rounded once to each parameter's dtype. All heads of a layer are computed
in one batch.

On the CPU each site is computed on one thread (torch's and the BLAS libraries' thread counts are
set to one meanwhile and restored after, see :func:`condinit_det.init.lapack.single_threaded`), and
up to ``min(torch.get_num_threads(), 4)`` sites are computed at once (the arms that draw nothing
run their sites in order). Every site's values depend only on its generator and its own weights,
so weights are bitwise the same for any thread count.
"""
from __future__ import annotations

import json
import math
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..utils.fileio import atomic_write
from .arms import (
    SOLVERS,
    haar_semi_orthogonal,
    haar_semi_orthogonal_batch,
    mimetic_noise,
    mimetic_noise_batch,
    mimetic_qk_batch,
    mimetic_vo,
    working_dtype,
)
from .lapack import single_threaded
from .sites import AttentionSite, find_attention, select_sites, supported_layouts

__all__ = ["ARMS", "ARM_OPTIONS", "PAPER_ARMS", "InitReport", "SiteReport", "apply_init", "conditioned_head_norms",
           "resolve_options", "site_generator"]

# The arms of the paper's tables: what ``--arm all`` trains.
PAPER_ARMS = ("default", "mimetic", "conditioned")
# Every arm: the paper's, then the controls.
ARMS = PAPER_ARMS + ("scale_matched",)

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
        # Q/K factorization, condinit_det.init.top_singular: "auto" | "dense" | "subspace" (CPU only;
        # CUDA parameters always get the dense float64 SVD on their device)
        "solver": "auto",
    },
    # The default init rescaled per head to the conditioned arm's norms (module doc); pass the
    # options of the conditioned run it controls for.
    "scale_matched": {
        "gain_qk": 1.0,
        "gain_v": 1.0,
        "value_mode": "identity",
        "norm": "frobenius",  # "frobenius" | "spectral": which norm of each head block is matched
    },
}

_VALUE_MODES = ("identity", "shared_block")
_NORMS = ("frobenius", "spectral")
# Arms that draw nothing and cost little: their sites run in order on one thread.
_DRAWLESS_ARMS = ("default", "scale_matched")


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
    if arm in ("conditioned", "scale_matched") and resolved["value_mode"] not in _VALUE_MODES:
        raise ValueError(f"value_mode must be one of {', '.join(_VALUE_MODES)}, got {resolved['value_mode']!r}")
    if arm == "scale_matched":
        if resolved["norm"] not in _NORMS:
            raise ValueError(f"norm must be one of {', '.join(_NORMS)}, got {resolved['norm']!r}")
        for key in ("gain_qk", "gain_v"):
            value = resolved[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
    if arm == "mimetic" and resolved["noise"] not in ("normal", "uniform"):
        raise ValueError(f"noise must be 'normal' or 'uniform', got {resolved['noise']!r}")
    if arm == "mimetic" and resolved["solver"] not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {resolved['solver']!r}")
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
    workers = _worker_count(sites, arm)
    if arm == "mimetic":
        import scipy.linalg  # noqa: F401  (load its OpenBLAS now, so that single_threaded() limits it)
    # Each site runs on one thread (see condinit_det.init.lapack: on a busy machine the
    # OpenMP/OpenBLAS threads of these medium-sized operations spin-wait for each other); the
    # cores are used by working on up to `workers` sites at once instead, which pays because the
    # torch and NumPy kernels release the GIL (scipy's eigensolvers mostly take turns).
    # A site's values depend only on its own generator, so the result is the same for any worker count.
    with single_threaded():
        if workers > 1:
            # torch keeps MKL's and OpenMP's thread counts per thread, so single_threaded() here does not reach the
            # workers; pinned to one thread too, a worker's MKL QR rounds as the sequential path's does (left at
            # the default, it rounds by how many threads it finds free: the weights then vary from run to run).
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="condinit-init",
                                    initializer=torch.set_num_threads, initargs=(1,)) as pool:
                outcomes = list(pool.map(lambda site: _apply_site(site, arm, seed, resolved), sites))
        else:
            outcomes = [_apply_site(site, arm, seed, resolved) for site in sites]
    reports = [SiteReport(**site.describe(), changed=changed, note=note)
               for site, (changed, note) in zip(sites, outcomes)]
    return InitReport(arm=arm, seed=int(seed), options=resolved, sites=reports)


# At most this many sites are worked on at once (each holds its float64 temporaries: for mimetic
# on a 1280-wide layer with 16 heads, about 0.5 GB).
_MAX_WORKERS = 4


def _worker_count(sites: Sequence[AttentionSite], arm: str) -> int:
    """Sites worked on at once: torch's thread count, capped; 1 on CUDA, with shared weights, or for an
    arm that draws nothing."""
    if arm in _DRAWLESS_ARMS or len(sites) < 2:
        return 1
    owners: Dict[int, set] = {}  # storage -> the sites writing into it
    for site in sites:
        if _compute_device(site).type != "cpu":
            return 1
        for role in ("q", "k", "v", "o"):
            owners.setdefault(site.weight(role).untyped_storage().data_ptr(), set()).add(site.name)
    if any(len(names) > 1 for names in owners.values()):
        return 1  # two sites write the same tensor: keep their order
    return max(1, min(torch.get_num_threads(), _MAX_WORKERS, len(sites)))


def _apply_site(site: AttentionSite, arm: str, seed: int, resolved: Dict[str, object]):
    with torch.no_grad():  # grad mode is per thread
        generator = site_generator(seed, site.name)
        if arm == "conditioned":
            return _apply_conditioned(site, generator, **resolved)
        if arm == "mimetic":
            return _apply_mimetic(site, generator, **resolved)
        if arm == "scale_matched":
            return _apply_scale_matched(site, **resolved)
        return [], ""


def _compute_device(site: AttentionSite) -> torch.device:
    """Where a site's float64 factorizations run: its parameters' CUDA device, else the CPU."""
    device = site.weight("q").device
    return device if device.type == "cuda" else torch.device("cpu")


def _write(target: torch.Tensor, value: torch.Tensor) -> None:
    """Copy ``value`` (working precision) into ``target``, rounded once to its dtype (``copy_`` converts)."""
    target.copy_(value)


def _write_heads(target: torch.Tensor, blocks: torch.Tensor, gain: float = 1.0) -> None:
    """Write ``[H, dh, D]`` head blocks into the ``[H * dh, D]`` rows they form (head h: rows h*dh...).

    The gain is applied in the working precision, before the single rounding to the parameter's dtype.
    """
    _write(target.unflatten(0, blocks.shape[:2]), blocks if gain == 1.0 else blocks * gain)


def _apply_conditioned(site: AttentionSite, generator: torch.Generator, *, gain_qk: float, gain_v: float,
                       value_mode: str, condition_output: bool):
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
    _write_heads(site.weight("q"), q_blocks, gain_qk)
    _write_heads(site.weight("k"), k_blocks, gain_qk)
    # gain_v times the rectangular identity (whole value projection, or every head's block),
    # written in place: zeros, and gain_v rounded once to the parameter's dtype on the diagonal.
    w_v = site.weight("v")
    blocks = w_v.unsqueeze(0) if value_mode == "identity" else w_v.unflatten(0, (heads, site.dim_v // heads))
    blocks.zero_()
    torch.diagonal(blocks, dim1=-2, dim2=-1).fill_(gain_v)
    roles = ["q", "k", "v"]
    for role in roles:
        bias = site.bias(role)
        if bias is not None:
            bias.zero_()
    if condition_output:
        out = site.weight("o")
        _write(out, haar_semi_orthogonal(out.shape[0], out.shape[1], generator=generator, device=device,
                                         dtype=working_dtype(out.dtype)))
        roles.append("o")
    changed = site.parameter_names(roles[:3]) + (site.parameter_names(["o"], biases=False) if condition_output else [])
    return changed, ""


def _apply_mimetic(site: AttentionSite, generator: torch.Generator, *, alpha1: float, beta1: float,
                   alpha2: float, beta2: float, noise: str, solver: str):
    dh, heads = site.head_dim, site.num_heads
    d_in = site.dim_in
    device = _compute_device(site)
    # Draw order, fixed: one draw of the heads' Q/K noises [H, D_in, D_k_in], then the V/O noise.
    # A best rank-r approximation moves by about eps / (relative gap at s_r) when its target is
    # rounded, and the singular spectrum of alpha Z + beta I is dense (measured: 8e-5 relative at
    # D = 768 with a float32 target), so truncated targets stay in float64 whatever the dtype;
    # only V/O's exact factorization runs in the working precision.
    z = mimetic_noise_batch(heads, d_in, site.dim_k_in, std=d_in ** -0.5, noise=noise, generator=generator)
    w_q, w_k = mimetic_qk_batch(z.to(device), alpha=alpha1, beta=beta1, head_dim=dh,
                                solver=solver if device.type == "cpu" else "dense")
    del z
    _write_heads(site.weight("q"), w_q)
    _write_heads(site.weight("k"), w_k)
    d_v_in = site.dim_v_in
    truncated = site.dim_v < min(d_v_in, site.dim_out)
    z = mimetic_noise(d_v_in, site.dim_out, std=d_v_in ** -0.5, noise=noise, generator=generator,
                      dtype=torch.float64 if truncated else working_dtype(site.weight("v").dtype))
    w_v, w_o, exact = mimetic_vo(z.to(device), alpha=alpha2, beta=beta2, dim_v=site.dim_v,
                                 w_v_default=site.weight("v").detach())
    _write(site.weight("v"), w_v)
    _write(site.weight("o"), w_o)
    note = "" if exact else (
        f"value width {site.dim_v} < min(D_v_in, D_out): W_v^T W_o^T is the best rank-{site.dim_v} "
        "approximation of the mimetic target")
    changed = site.parameter_names(["q", "k", "v", "o"], biases=False)
    return changed, note


def conditioned_head_norms(site: AttentionSite, *, gain_qk: float = 1.0, gain_v: float = 1.0,
                           value_mode: str = "identity", norm: str = "frobenius") -> Dict[str, List[float]]:
    """The norm the conditioned arm gives each head block of W_Q, W_K and W_V of ``site``.

    Args:
        site: an attention site (:func:`condinit_det.init.find_attention`).
        gain_qk, gain_v, value_mode: the conditioned arm's options.
        norm: ``"frobenius"`` or ``"spectral"``.

    Returns ``{"q": [H floats], "k": [...], "v": [...]}``, head h first; the formulas are in the
    module doc (scale_matched).
    """
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {', '.join(_NORMS)}, got {norm!r}")
    if value_mode not in _VALUE_MODES:
        raise ValueError(f"value_mode must be one of {', '.join(_VALUE_MODES)}, got {value_mode!r}")
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
                "non-zero default init (apply it to a freshly built model)")
        factors = wanted / torch.where(current > 0, current, 1.0)
        # A zero target writes +0.0 (as the conditioned arm's zero_()), not the -0.0 of negative entries * 0.
        rescaled[role] = torch.where((wanted > 0)[:, None, None], blocks * factors[:, None, None], 0.0)
    # Written only once every role is checked, so that an error leaves the site as it was.
    for role, blocks in rescaled.items():
        _write(site.weight(role), blocks.flatten(0, 1))
    zeroed = [f"{role}{h}" for role in ("q", "k", "v") for h in range(heads) if targets[role][h] == 0]
    note = "" if not zeroed else (
        f"zero target, block set to zero: {', '.join(zeroed)} (the conditioned arm gives these head blocks no "
        "non-zero entry)")
    return site.parameter_names(["q", "k", "v"], biases=False), note
