"""Attention sites: one attention module of a model and where its query, key, value and output projections live,
each a ``Linear``-style ``[out, in]`` weight (fused layouts: row blocks of one ``[3D, D_in]`` weight; head h owns rows
``h*dh ... (h+1)*dh - 1`` of each role's block). Roles are what a block does in the forward. Layouts are recognised by
class, the built-in ones by qualified name (no detectron2 or timm import; docs/arms.md#attention-layouts-recognized).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

__all__ = [
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
]

ROLES = ("q", "k", "v", "o")


@dataclass(frozen=True)
class Projection:
    """Where one projection lives in the attention module: the dotted names of its weight and bias (or None), and the
    role's rows of each (``bias_rows`` None: the same as ``rows``)."""

    weight: str
    rows: slice = field(default_factory=lambda: slice(None))
    bias: Optional[str] = None
    bias_rows: Optional[slice] = None


@dataclass(frozen=True)
class AttentionLayout:
    """What an adapter returns: the head count and the four projections (roles q, k, v, o)."""

    num_heads: int
    projections: Dict[str, Projection]


AdapterFn = Callable[[nn.Module], AttentionLayout]


def getattr_path(module: nn.Module, dotted: str):
    """The attribute at the dotted path ``dotted`` of ``module``; None where a part is missing or None."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _get_param(module: nn.Module, dotted: str) -> torch.Tensor:
    obj = getattr_path(module, dotted)
    if not isinstance(obj, torch.Tensor):
        raise TypeError(f"{dotted!r} of {type(module).__name__} is not a tensor")
    return obj


@dataclass
class AttentionSite:
    """One attention module and the location of its projections. Widths: ``dim_in`` / ``dim_k_in`` / ``dim_v_in`` the
    query / key / value inputs', ``dim`` the query/key width D = num_heads * head_dim, ``dim_v`` the value width and
    ``dim_out`` the output projection's."""

    name: str
    kind: str
    module: nn.Module
    num_heads: int
    projections: Dict[str, Projection]

    def weight(self, role: str) -> torch.Tensor:
        """The role's weight block, a view ``[out, in]`` into the module's parameter."""
        proj = self.projections[role]
        return _get_param(self.module, proj.weight)[proj.rows]

    def bias(self, role: str) -> Optional[torch.Tensor]:
        """The role's bias block (a view), or None when the projection has no bias."""
        proj = self.projections[role]
        if proj.bias is None:
            return None
        bias = getattr_path(self.module, proj.bias)
        if bias is None:
            return None
        return bias[proj.rows if proj.bias_rows is None else proj.bias_rows]

    @property
    def dim_in(self) -> int:
        return self.weight("q").shape[1]

    @property
    def dim(self) -> int:
        return self.weight("q").shape[0]

    @property
    def dim_k_in(self) -> int:
        return self.weight("k").shape[1]

    @property
    def dim_v_in(self) -> int:
        return self.weight("v").shape[1]

    @property
    def dim_v(self) -> int:
        return self.weight("v").shape[0]

    @property
    def dim_out(self) -> int:
        return self.weight("o").shape[0]

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def parameter_names(self, roles: Sequence[str] = ROLES, *, biases: bool = True) -> List[str]:
        """Qualified names (relative to the searched root) of the parameters of ``roles``."""
        names: List[str] = []
        for role in roles:
            proj = self.projections[role]
            candidates = [proj.weight] + ([proj.bias] if biases and proj.bias else [])
            for local in candidates:
                if local == proj.bias and getattr_path(self.module, local) is None:
                    continue
                full = f"{self.name}.{local}" if self.name else local
                if full not in names:
                    names.append(full)
        return names

    def describe(self) -> dict:
        """JSON-able summary of the site's kind and dimensions."""
        keys = ("name", "kind", "dim_in", "dim", "dim_v", "dim_out", "num_heads", "head_dim")
        return {key: getattr(self, key) for key in keys}

    def validate(self) -> None:
        """Check shapes; raise ValueError naming the site and what is accepted."""
        for role in ROLES:
            if role not in self.projections:
                raise ValueError(f"attention site {self.name!r} ({self.kind}) has no {role!r} projection")
            if self.weight(role).dim() != 2:
                raise ValueError(f"attention site {self.name!r}: the {role} weight must be 2-D [out, in]")
        if self.num_heads <= 0 or self.dim % self.num_heads != 0:
            raise ValueError(
                f"attention site {self.name!r} ({self.kind}): num_heads={self.num_heads} does not divide "
                f"the query/key width {self.dim}; the width must be a multiple of the head count"
            )
        if self.weight("k").shape[0] != self.dim:
            raise ValueError(
                f"attention site {self.name!r}: query width {self.dim} and key width "
                f"{self.weight('k').shape[0]} differ; they must be equal"
            )
        if self.dim_v % self.num_heads != 0:
            raise ValueError(
                f"attention site {self.name!r}: num_heads={self.num_heads} does not divide the value width {self.dim_v}"
            )
        if self.weight("o").shape[1] != self.dim_v:
            raise ValueError(
                f"attention site {self.name!r}: the output projection takes {self.weight('o').shape[1]} inputs "
                f"but the value width is {self.dim_v}"
            )


def fused_qkv_layout(module: nn.Module, *, num_heads: int, qkv: str = "qkv", proj: str = "proj") -> AttentionLayout:
    """Layout of a module with one fused ``qkv`` Linear ``[3D, D_in]`` and an output Linear ``proj``."""
    weight = getattr_path(module, f"{qkv}.weight")
    if weight is None or weight.shape[0] % 3 != 0:
        raise ValueError(f"{type(module).__name__}.{qkv}.weight must have 3*D rows (fused q, k, v)")
    d = weight.shape[0] // 3
    bias = f"{qkv}.bias" if getattr_path(module, f"{qkv}.bias") is not None else None
    out_bias = f"{proj}.bias" if getattr_path(module, f"{proj}.bias") is not None else None
    return AttentionLayout(
        num_heads=num_heads,
        projections={
            "q": Projection(f"{qkv}.weight", slice(0, d), bias),
            "k": Projection(f"{qkv}.weight", slice(d, 2 * d), bias),
            "v": Projection(f"{qkv}.weight", slice(2 * d, 3 * d), bias),
            "o": Projection(f"{proj}.weight", slice(None), out_bias),
        },
    )


def separate_qkv_layout(
    module: nn.Module, *, num_heads: int, q: str = "q", k: str = "k", v: str = "v", proj: str = "proj"
) -> AttentionLayout:
    """Layout of a module with one Linear per projection (``q``, ``k``, ``v``, output ``proj``)."""
    projections = {}
    for role, name in zip(ROLES, (q, k, v, proj)):
        has_bias = getattr_path(module, f"{name}.bias") is not None
        projections[role] = Projection(f"{name}.weight", bias=f"{name}.bias" if has_bias else None)
    return AttentionLayout(num_heads=num_heads, projections=projections)


def _multihead_attention_layout(module: nn.MultiheadAttention) -> AttentionLayout:
    e = module.embed_dim
    bias = "in_proj_bias" if module.in_proj_bias is not None else None
    out_bias = "out_proj.bias" if module.out_proj.bias is not None else None
    if module.in_proj_weight is not None:
        weights = ("in_proj_weight",) * 3
        rows = (slice(0, e), slice(e, 2 * e), slice(2 * e, 3 * e))
    else:
        weights = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        rows = (slice(None),) * 3
    # The packed bias covers q, k, v in that order even when the weights are separate tensors.
    bias_rows = (slice(0, e), slice(e, 2 * e), slice(2 * e, 3 * e))
    projections = {
        role: Projection(weight, row, bias, bias_row)
        for role, weight, row, bias_row in zip("qkv", weights, rows, bias_rows)
    }
    projections["o"] = Projection("out_proj.weight", slice(None), out_bias)
    return AttentionLayout(num_heads=module.num_heads, projections=projections)


_ADAPTERS: List[Tuple[str, Union[type, str], AdapterFn]] = []


def register_attention_adapter(kind: str, cls: Union[type, str], adapter: AdapterFn) -> None:
    """Teach :func:`find_attention` a new attention class.

    kind: short name reported for its sites (e.g. ``"my_attn"``).
    cls: the class, or its qualified name ``"package.module.ClassName"`` (subclasses match too).
    adapter: ``module -> AttentionLayout`` giving the head count and the q/k/v/o projections.
    Adapters registered later take precedence over earlier ones for the same class.
    """
    if not isinstance(cls, (type, str)):
        raise TypeError(f"cls must be a class or a qualified class name, got {type(cls).__name__}")
    _ADAPTERS.insert(0, (kind, cls, adapter))


def supported_layouts() -> List[str]:
    """``"kind (class)"`` for every registered adapter, for error messages and docs."""
    return [f"{kind} ({cls if isinstance(cls, str) else _qualname(cls)})" for kind, cls, _ in _ADAPTERS]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _match_adapter(module: nn.Module) -> Optional[Tuple[str, AdapterFn]]:
    mro = type(module).__mro__
    names = {_qualname(c) for c in mro}
    for kind, cls, adapter in _ADAPTERS:
        if (isinstance(cls, str) and cls in names) or (isinstance(cls, type) and cls in mro):
            return kind, adapter
    return None


def find_attention(module: nn.Module) -> List[AttentionSite]:
    """Every attention site in ``module``'s tree, in module order (a matched module is not searched further). Raises
    ValueError when a site's shapes are inconsistent (e.g. heads not dividing the width)."""
    sites: List[AttentionSite] = []
    skip_prefixes: List[str] = []
    for name, sub in module.named_modules():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        match = _match_adapter(sub)
        if match is None:
            continue
        kind, adapter = match
        layout = adapter(sub)
        site = AttentionSite(
            name=name, kind=kind, module=sub, num_heads=layout.num_heads, projections=dict(layout.projections)
        )
        site.validate()
        sites.append(site)
        skip_prefixes.append(name + "." if name else "")
    return sites


def select_sites(
    sites: Sequence[AttentionSite],
    include: Optional[Sequence[str]] = None,
    exclude: Optional[Sequence[str]] = None,
) -> List[AttentionSite]:
    """The sites whose names match any ``include`` pattern (fnmatch; None: all), less those matching ``exclude``.
    Raises ValueError for a pattern that matches no site, listing the site names available."""
    include = _as_patterns(include, "include")
    exclude = _as_patterns(exclude, "exclude")
    names = [s.name for s in sites]
    for label, patterns in (("include", include), ("exclude", exclude)):
        for pattern in patterns or ():
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
                raise ValueError(
                    f"{label} pattern {pattern!r} matches no attention site; patterns are fnmatch patterns "
                    f"on qualified module names, e.g. 'backbone.net.blocks.*'. Sites found: {shown or 'none'}"
                )
    chosen = [s for s in sites if include is None or any(fnmatch.fnmatchcase(s.name, p) for p in include)]
    return [s for s in chosen if not any(fnmatch.fnmatchcase(s.name, p) for p in exclude or ())]


def _as_patterns(patterns, label: str) -> Optional[List[str]]:
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [patterns]
    patterns = list(patterns)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{label} must be a string or a list of strings (fnmatch patterns), got {patterns!r}")
    return patterns


# Built-in layouts. Order: later registrations win, so the generic ones come first.
register_attention_adapter("mha", nn.MultiheadAttention, _multihead_attention_layout)
for _kind, _cls in (
    ("d2_vit", "detectron2.modeling.backbone.vit.Attention"),
    ("d2_swin", "detectron2.modeling.backbone.swin.WindowAttention"),
    ("d2_mvit", "detectron2.modeling.backbone.mvit.MultiScaleAttention"),
    ("timm_vit", "timm.layers.attention.Attention"),  # re-exported by timm.models.vision_transformer
    ("timm_xcit", "timm.models.xcit.XCA"),
    ("timm_swin", "timm.models.swin_transformer.WindowAttention"),
):
    register_attention_adapter(_kind, _cls, lambda m: fused_qkv_layout(m, num_heads=m.num_heads))
# Class attention of CaiT / XCiT classifiers (the class token attends to the patch tokens).
register_attention_adapter(
    "timm_class_attn", "timm.models.cait.ClassAttn", lambda m: separate_qkv_layout(m, num_heads=m.num_heads)
)


def _davit_channel_layout(module: nn.Module) -> AttentionLayout:
    """DaViT's channel attention: its head's dh x dh map is ``softmax(scale * k^T v)`` and its output ``map @ q^T``,
    so the chunk it calls q is the value role (what the map mixes), k the query role (the map's rows) and v the key
    role (the softmax axis)."""
    fused = fused_qkv_layout(module, num_heads=module.num_heads)
    p = fused.projections
    return AttentionLayout(num_heads=module.num_heads, projections={"q": p["k"], "k": p["v"], "v": p["q"], "o": p["o"]})


# DaViT (timm.models.davit): spatial window attention (standard fused layout), and channel
# attention: ChannelAttention (davit_tiny ... davit_giant) with the roles above, ChannelAttentionV2
# (the Florence-2 towers, davit_*_fl) in the standard order, its head count named `groups`.
register_attention_adapter(
    "timm_davit_window", "timm.models.davit.WindowAttention", lambda m: fused_qkv_layout(m, num_heads=m.num_heads)
)
register_attention_adapter("timm_davit_channel", "timm.models.davit.ChannelAttention", _davit_channel_layout)
register_attention_adapter(
    "timm_davit_channel_v2", "timm.models.davit.ChannelAttentionV2", lambda m: fused_qkv_layout(m, num_heads=m.groups)
)
