"""Attention-weight initialization arms (pure PyTorch; no detectron2 import).

    from condinit_det.init import apply_init, find_attention
    report = apply_init(model, "conditioned", seed=0, include=["backbone.*"])

Arms (:data:`ARMS`): the paper's ``default``, ``mimetic`` and ``conditioned`` (:data:`PAPER_ARMS`),
and the control ``scale_matched``; definitions in docs/arms.md. The names are loaded on first use, so that the arms'
names and options (:mod:`.options`) are read without importing torch.
"""

from ..utils.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "options": ("ARMS", "ARM_OPTIONS", "PAPER_ARMS", "SOLVERS", "resolve_options"),
        "apply": ("InitReport", "SiteReport", "apply_init", "conditioned_head_norms", "site_generator"),
        "arms": (
            "TopSingular",
            "haar_semi_orthogonal_batch",
            "mimetic_noise_batch",
            "mimetic_qk_batch",
            "mimetic_vo",
            "standard_normal",
            "top_singular",
            "working_dtype",
        ),
        "sites": (
            "ROLES",
            "AttentionLayout",
            "AttentionSite",
            "Projection",
            "find_attention",
            "fused_qkv_layout",
            "register_attention_adapter",
            "select_sites",
            "separate_qkv_layout",
            "supported_layouts",
        ),
    },
)
