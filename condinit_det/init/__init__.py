"""Attention-weight initialization arms (pure PyTorch; no detectron2 import).

    from condinit_det.init import apply_init, find_attention
    report = apply_init(model, "conditioned", seed=0, include=["backbone.*"])
"""
from .apply import ARM_OPTIONS, ARMS, InitReport, SiteReport, apply_init, resolve_options, site_generator
from .arms import haar_semi_orthogonal, mimetic_noise, mimetic_qk, mimetic_vo, rectangular_identity
from .sites import (
    ROLES,
    AttentionLayout,
    AttentionSite,
    Projection,
    find_attention,
    fused_qkv_layout,
    separate_qkv_layout,
    register_attention_adapter,
    select_sites,
    supported_layouts,
)

__all__ = [
    "ARMS",
    "ARM_OPTIONS",
    "ROLES",
    "AttentionLayout",
    "AttentionSite",
    "InitReport",
    "Projection",
    "SiteReport",
    "apply_init",
    "find_attention",
    "fused_qkv_layout",
    "haar_semi_orthogonal",
    "mimetic_noise",
    "mimetic_qk",
    "mimetic_vo",
    "rectangular_identity",
    "register_attention_adapter",
    "resolve_options",
    "select_sites",
    "separate_qkv_layout",
    "site_generator",
    "supported_layouts",
]
