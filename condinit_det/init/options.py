"""The arms and their options: names, defaults and validation (no torch import, so that the commands and the
records read them at once). The math is in :mod:`.arms`, applying it in :mod:`.apply`; docs/arms.md has both."""

from __future__ import annotations

import math
from typing import Dict

__all__ = [
    "ARMS",
    "ARM_GROUPS",
    "ARM_OPTIONS",
    "CONTROLS",
    "FACTORIAL_ARMS",
    "NORMS",
    "PAPER_ARMS",
    "SHARED_OPTIONS",
    "SOLVERS",
    "VALUE_MODES",
    "arm_keywords",
    "resolve_options",
]

# The arms of the paper's tables: what ``--arm all`` trains.
PAPER_ARMS = ("default", "mimetic", "conditioned")
# The conditioned arm's controls: each swaps one of its two factors, structure and scale, for the default init's.
CONTROLS = ("scale_matched", "structured")
# Every arm: the paper's, then the controls.
ARMS = PAPER_ARMS + CONTROLS
# The structure x scale design (docs/arms.md): random or conditioned structure, at the default init's scale or the
# conditioned arm's, one arm per cell.
FACTORIAL_ARMS = ("default", "scale_matched", "structured", "conditioned")
# The names --arm takes for several arms.
ARM_GROUPS = {"all": PAPER_ARMS, "factorial": FACTORIAL_ARMS}
# The conditioned arm's options that its controls take from it (condinit.options.conditioned): one change of a gain
# moves all three arms of the design.
SHARED_OPTIONS = ("gain_qk", "gain_v", "value_mode")

# Per arm, the options a config sets under condinit.options.<arm>, with their defaults.
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
    # The default init rescaled per head block to the conditioned arm's norms (docs/arms.md).
    "scale_matched": {"norm": "frobenius"},  # "frobenius" | "spectral": which norm of each head block is matched
    # The conditioned arm's blocks rescaled per head block to the default init's norms (docs/arms.md).
    "structured": {"norm": "frobenius"},
}

VALUE_MODES = ("identity", "shared_block")  # the conditioned value projection (docs/arms.md)
NORMS = ("frobenius", "spectral")  # what the controls match per head block
# The mimetic arm's Q/K factorization (condinit_det.init.top_singular).
SOLVERS = ("auto", "dense", "subspace")


def arm_keywords(arm: str) -> Dict[str, object]:
    """The keyword options :func:`~condinit_det.init.apply_init` takes for ``arm``, with their defaults: the arm's own
    and, for a control (:data:`CONTROLS`), the conditioned arm's :data:`SHARED_OPTIONS`."""
    shared = {key: ARM_OPTIONS["conditioned"][key] for key in SHARED_OPTIONS} if arm in CONTROLS else {}
    return {**shared, **ARM_OPTIONS[arm]}


def resolve_options(arm: str, options: dict) -> Dict[str, object]:
    """The arm's options (:func:`arm_keywords`) with defaults filled in; raises ValueError on unknown arms or
    options, or values the arm does not accept."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; accepted arms: {', '.join(ARMS)}")
    accepted = arm_keywords(arm)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"option(s) {', '.join(unknown)} are not accepted by the {arm!r} arm; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    resolved = {**accepted, **options}
    if "value_mode" in resolved and resolved["value_mode"] not in VALUE_MODES:
        raise ValueError(f"value_mode must be one of {', '.join(VALUE_MODES)}, got {resolved['value_mode']!r}")
    if arm in CONTROLS:
        if resolved["norm"] not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {resolved['norm']!r}")
        for key in ("gain_qk", "gain_v"):
            value = resolved[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
    if arm == "mimetic" and resolved["noise"] not in ("normal", "uniform"):
        raise ValueError(f"noise must be 'normal' or 'uniform', got {resolved['noise']!r}")
    if arm == "mimetic" and resolved["solver"] not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {resolved['solver']!r}")
    return resolved
