"""The classifier: ``timm.create_model`` from random init, then the arm, before anything else touches it."""

from __future__ import annotations

import difflib
from typing import Dict, List, Tuple

from torch import nn

from ..init import InitReport, find_attention, select_sites
from ..init.spec import ArmSpec, apply_arm_spec
from ..utils.errors import UsageError

__all__ = ["build_armed_model", "check_arm_sites", "check_model_name", "create_classifier"]


def check_model_name(name) -> None:
    """Raise UsageError for a name timm does not know, suggesting close names from ``timm.list_models``."""
    import timm

    if not isinstance(name, str) or not name:
        raise UsageError(f"model.name must be a timm model name, e.g. vit_base_patch16_224; got {name!r}")
    if timm.is_model(name):
        return
    close = (
        difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        or timm.list_models(f"{name.split('_')[0]}*")[:5]
    )  # else the names of the same family
    hint = f"; close names: {', '.join(close)}" if close else ""
    raise UsageError(f"model.name={name!r} is not a timm model{hint} (timm.list_models() lists all)")


def create_classifier(model: Dict, num_classes: int) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=..., **kwargs)``; bad kwargs raise UsageError."""
    import timm

    check_model_name(model["name"])
    kwargs = dict(model.get("kwargs") or {})
    try:
        return timm.create_model(model["name"], pretrained=False, num_classes=int(num_classes), **kwargs)
    except TypeError as e:
        raise UsageError(f"model.kwargs {kwargs} rejected by timm.create_model({model['name']!r}): {e}") from None


def check_arm_sites(model: nn.Module, spec: ArmSpec) -> List[str]:
    """The attention sites the arm will touch; raises UsageError when there are none or a pattern matches nothing."""
    sites = find_attention(model)
    if not sites:
        from ..init import supported_layouts

        raise UsageError(
            f"{type(model).__name__} has no attention site the arms know; supported layouts: "
            f"{'; '.join(supported_layouts())}"
        )
    try:
        return [s.name for s in select_sites(sites, spec.include, spec.exclude)]
    except ValueError as e:
        raise UsageError(f"condinit.include/exclude: {e}") from None


def build_armed_model(model: Dict, num_classes: int, spec: ArmSpec) -> Tuple[nn.Module, InitReport]:
    """Build the classifier and apply the arm in place (its own generators: the global RNG does not move).

    Call it with the global RNG seeded by the training seed, identically on every process: every
    parameter outside the targeted projections then matches across arms and across processes.
    """
    net = create_classifier(model, num_classes)
    check_arm_sites(net, spec)
    report = apply_arm_spec(net, spec)
    return net, report
