"""The classifier: ``timm.create_model`` from random init, then the arm, before anything else touches it."""

from __future__ import annotations

import difflib
from typing import Dict, Tuple

from torch import nn

from ..init import InitReport
from ..init.spec import ArmSpec, apply_arm_spec
from ..utils.errors import UsageError


def create_classifier(model: Dict, num_classes: int) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=..., **kwargs)``; a name timm does not know (with the
    close names ``timm.list_models`` has) and bad kwargs raise UsageError."""
    import timm

    name, kwargs = model["name"], dict(model.get("kwargs") or {})
    if not isinstance(name, str) or not name:
        raise UsageError(f"model.name must be a timm model name, e.g. vit_base_patch16_224; got {name!r}")
    if not timm.is_model(name):
        close = (
            difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
            or timm.list_models(f"{name.split('_')[0]}*")[:5]
        )  # else the names of the same family
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise UsageError(f"model.name={name!r} is not a timm model{hint} (timm.list_models() lists all)")
    try:
        return timm.create_model(name, pretrained=False, num_classes=int(num_classes), **kwargs)
    except TypeError as e:
        raise UsageError(f"model.kwargs {kwargs} rejected by timm.create_model({name!r}): {e}") from None


def build_armed_model(model: Dict, num_classes: int, spec: ArmSpec) -> Tuple[nn.Module, InitReport]:
    """Build the classifier and apply the arm in place (the global RNG does not move): seeded alike, every parameter
    outside the targeted projections matches across arms and processes."""
    net = create_classifier(model, num_classes)
    return net, apply_arm_spec(net, spec)  # a model without attention or a pattern that matches nothing: ArmError
