"""kappa of the attention Jacobian ``J = d vec f(X) / d vec(W_Q, W_K, W_V)`` at a fixed input X, exact per head or
matrix-free (:func:`choose_method`). Names load on first use: :mod:`.options` (the methods and the config node's
keys) without torch, the detectron2 hook (:mod:`.hooks`) only when asked for. See docs/conditioning.md.
"""

from ..utils.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "options": ("ANALYSIS_DEFAULTS", "DEFAULT_MAX_ENTRIES", "METHODS"),
        "bound": ("theorem_terms",),
        "capture": ("capture_site_inputs",),
        "functional": ("AttentionFunction",),
        "heads": ("exact_conditioning",),
        "matrix_free": ("estimate_conditioning",),
        "measure": (
            "SiteMeasurement",
            "choose_method",
            "measure_site",
            "measure_sites",
            "resolve_sites",
            "write_table",
        ),
        "spectrum": ("SpectrumResult",),
        "training": ("conditioning_records", "measure_conditioning"),
        "hooks": ("ConditioningHook", "build_conditioning_hook"),
    },
)
