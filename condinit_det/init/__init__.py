"""Attention-weight initialization arms (pure PyTorch; no detectron2 import).

    from condinit_det.init import apply_init, find_attention
    report = apply_init(model, "conditioned", seed=0, include=["backbone.*"])

Arms (:data:`ARMS`): the paper's ``default``, ``mimetic`` and ``conditioned`` (:data:`PAPER_ARMS`),
and the control ``scale_matched`` (the default init at the conditioned arm's per-head norms); their
definitions are in :mod:`condinit_det.init.apply`.
"""
from .apply import (
    ARM_OPTIONS,
    ARMS,
    PAPER_ARMS,
    InitReport,
    SiteReport,
    apply_init,
    conditioned_head_norms,
    resolve_options,
    site_generator,
)
from .arms import (
    SOLVERS,
    TopSingular,
    haar_semi_orthogonal,
    haar_semi_orthogonal_batch,
    mimetic_noise,
    mimetic_noise_batch,
    mimetic_qk,
    mimetic_qk_batch,
    mimetic_vo,
    rectangular_identity,
    standard_normal,
    top_singular,
    working_dtype,
)
from .sites import (
    ROLES,
    AttentionLayout,
    AttentionSite,
    Projection,
    find_attention,
    fused_qkv_layout,
    register_attention_adapter,
    select_sites,
    separate_qkv_layout,
    supported_layouts,
)

__all__ = [
    "ARMS",
    "ARM_OPTIONS",
    "PAPER_ARMS",
    "ROLES",
    "SOLVERS",
    "AttentionLayout",
    "AttentionSite",
    "InitReport",
    "Projection",
    "SiteReport",
    "TopSingular",
    "apply_init",
    "conditioned_head_norms",
    "find_attention",
    "fused_qkv_layout",
    "haar_semi_orthogonal",
    "haar_semi_orthogonal_batch",
    "mimetic_noise",
    "mimetic_noise_batch",
    "mimetic_qk",
    "mimetic_qk_batch",
    "mimetic_vo",
    "rectangular_identity",
    "register_attention_adapter",
    "resolve_options",
    "select_sites",
    "separate_qkv_layout",
    "site_generator",
    "standard_normal",
    "supported_layouts",
    "top_singular",
    "working_dtype",
]
