"""Attention-weight initialization arms (pure PyTorch; no detectron2 import).

    from condinit_det.init import apply_init, find_attention
    report = apply_init(model, "conditioned", seed=0, include=["backbone.*"])

Arms (:data:`ARMS`): the paper's ``default``, ``mimetic`` and ``conditioned`` (:data:`PAPER_ARMS`),
and the conditioned arm's controls ``scale_matched`` and ``structured`` (:data:`CONTROLS`; with default and
conditioned, the structure x scale design :data:`FACTORIAL_ARMS`); definitions in docs/arms.md. The names are
loaded on first use, so that the arms' names and options (:mod:`.options`) are read without importing torch.
"""

from ..utils.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "options": (
            "ARMS",
            "ARM_OPTIONS",
            "CONTROLS",
            "FACTORIAL_ARMS",
            "PAPER_ARMS",
            "SHARED_OPTIONS",
            "SOLVERS",
            "arm_keywords",
            "resolve_options",
        ),
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
