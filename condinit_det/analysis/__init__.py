"""Attention-Jacobian conditioning: kappa(d vec f(X) / d vec(W_Q, W_K, W_V)) at a fixed input X.

    from condinit_det.analysis import capture_site_inputs, estimate_conditioning, exact_conditioning
    captured = capture_site_inputs(model, batched_inputs, sites)          # X per site
    result = estimate_conditioning(site, captured[site.name].inputs)    # matrix-free (jvp/vjp)
    result.kappa, result.sigma_max, result.sigma_min, result.converged
    exact = exact_conditioning(site, captured[site.name].inputs)       # exact, per head (kappa_heads)

``f`` is the site's own forward with the output projection replaced by the identity (the paper's
form; ``include_output_proj=True`` keeps it). What any training loop needs to track kappa along training (the
``condinit_analysis`` node, measuring, records) is in ``condinit_det.analysis.training``; the detectron2 training
hook lives in ``condinit_det.analysis.hooks`` (imported on first use, so the math runs without detectron2).
"""
from .bound import BoundTerms, attention_matrices, lambda_softmax_condition, theorem_terms
from .capture import CapturedInput, capture_site_inputs, reduce_site_inputs, token_matrix
from .conditioning import (
    DEFAULT_MAX_ENTRIES,
    JacobianOperator,
    attention_jacobian,
    dense_conditioning,
    estimate_conditioning,
    exact_conditioning,
)
from .functional import AttentionFunction, bind_inputs
from .heads import head_spectrum
from .measure import SiteMeasurement, default_sites, measure_site, measure_sites, resolve_sites, write_table
from .spectrum import (
    SpectrumResult,
    condition_number,
    exact_spectrum,
    extreme_singular_values,
    lanczos_extremes,
    matrix_free_spectrum,
)
from .training import (
    ANALYSIS_DEFAULTS,
    analysis_options,
    conditioning_records,
    measure_conditioning,
    measurement_options,
)

__all__ = [
    "ANALYSIS_DEFAULTS",
    "AttentionFunction",
    "BoundTerms",
    "CapturedInput",
    "ConditioningHook",
    "DEFAULT_MAX_ENTRIES",
    "JacobianOperator",
    "SiteMeasurement",
    "SpectrumResult",
    "attention_jacobian",
    "attention_matrices",
    "analysis_options",
    "bind_inputs",
    "build_conditioning_hook",
    "capture_site_inputs",
    "condition_number",
    "conditioning_records",
    "default_sites",
    "dense_conditioning",
    "estimate_conditioning",
    "exact_conditioning",
    "exact_spectrum",
    "extreme_singular_values",
    "head_spectrum",
    "lambda_softmax_condition",
    "lanczos_extremes",
    "matrix_free_spectrum",
    "measure_conditioning",
    "measure_site",
    "measure_sites",
    "measurement_options",
    "reduce_site_inputs",
    "resolve_sites",
    "theorem_terms",
    "token_matrix",
    "write_table",
]


def __getattr__(name):
    if name in ("ConditioningHook", "build_conditioning_hook"):
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
