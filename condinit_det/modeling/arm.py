"""The arm inside the model node of a lazy config, so that whatever calls ``instantiate(cfg.model)`` gets it:
:func:`armed` swaps the node's ``_target_`` for :func:`build_armed`, which builds the model as before, then applies the
config's ``condinit`` arm in place before any checkpoint is loaded (report: ``model.condinit_report``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import List, Mapping, Tuple

from omegaconf import DictConfig
from torch import nn

from ..init import InitReport
from ..init.spec import ArmSpec, apply_arm_spec, plain, resolve_arm_node

__all__ = ["armed", "armed_nodes", "build_armed", "check_arm_agrees", "is_armed", "rank0_computes_arm", "sites_only"]

_logger = logging.getLogger(__name__)

_ARM_NODE_REF = "${condinit}"
_TARGET_KEY = "_arm_target_"
_PREFIX_KEY = "_arm_site_prefix_"
_REFERENCE_KEY = "_arm_config_condinit_"
_REFERENCE = "${oc.select:condinit,null}"  # the config's top-level arm node, None without one

# What build_armed does once the module is built: "compute" the arm (outside any context below),
# "broadcast" (ranks other than 0 leave the arm's weights to DDP's broadcast from rank 0) or "sites"
# (check the arm's sites only, change no weight).
_build_mode = "compute"


@contextlib.contextmanager
def _building(mode: str):
    global _build_mode
    before, _build_mode = _build_mode, mode
    try:
        yield
    finally:
        _build_mode = before


def rank0_computes_arm():
    """Context: inside it, ranks other than 0 leave the arm's weights to DDP's broadcast from rank 0; only around a
    build whose model is wrapped in DistributedDataParallel before its first step."""
    return _building("broadcast")


def sites_only():
    """Context: inside it, armed nodes check the arm's attention sites as the default arm does and change no weight,
    a cheap check of a configuration before a launch."""
    return _building("sites")


def _target_name(target) -> str:
    return target if isinstance(target, str) else f"{target.__module__}.{target.__qualname__}"


def is_armed(node) -> bool:
    """Whether a lazy-config node builds through :func:`build_armed`."""
    try:
        target = node.get("_target_") if hasattr(node, "get") else None
    except Exception:  # an unresolved interpolation in a foreign node
        return False
    return target is build_armed or target == _target_name(build_armed)


def armed(node, *, condinit=_ARM_NODE_REF, site_prefix: str = ""):
    """Make a LazyCall node apply the arm node ``condinit`` (default: the config's top-level one) when instantiated,
    with ``site_prefix`` before site names (``"backbone."`` when arming ``model.backbone``); returns the node."""
    if is_armed(node):
        raise ValueError("this config node is armed already; arm a model once")
    if "_target_" not in node:
        raise ValueError("armed() takes a LazyCall node (one with _target_), e.g. model_zoo's model node")
    node[_TARGET_KEY] = node["_target_"]
    node["_target_"] = build_armed
    node["condinit"] = condinit
    node[_REFERENCE_KEY] = _REFERENCE
    if site_prefix:
        node[_PREFIX_KEY] = site_prefix
    return node


def armed_nodes(node, path: str = "model") -> List[Tuple[str, object]]:
    """``(dotted path, node)`` of every armed node at or below ``node`` (a lazy-config subtree)."""
    armed_here = is_armed(node)
    found = [(path, node)] if armed_here else []
    for key, value in node.items_ex(resolve=False):
        if armed_here and key in ("condinit", _TARGET_KEY, _REFERENCE_KEY):
            continue
        if isinstance(value, DictConfig):
            found += armed_nodes(value, f"{path}.{key}")
    return found


def check_arm_agrees(condinit, config_condinit, *, where: str = "the armed node's condinit") -> ArmSpec:
    """The validated arm of an armed node; raises ValueError when the config's top-level arm node
    ``config_condinit`` (None, or an unresolved reference, when there is none) says otherwise."""
    spec = resolve_arm_node(condinit)
    top = plain(config_condinit)
    if isinstance(top, Mapping):
        top_identity, identity = resolve_arm_node(top).identity(), spec.identity()
        if top_identity != identity:
            raise ValueError(
                f"the arm is set in two places that disagree: condinit ({top_identity}) and {where} ({identity}); "
                f"set it once, in condinit, and leave the armed node's condinit = '{_ARM_NODE_REF}'"
            )
    return spec


def build_armed(*, condinit=None, **kwargs) -> nn.Module:
    """Build ``_arm_target_(**kwargs)`` and apply the arm node ``condinit`` to it in place."""
    from detectron2.utils import comm
    from detectron2.utils.registry import locate

    target = kwargs.pop(_TARGET_KEY)
    site_prefix = kwargs.pop(_PREFIX_KEY, "")
    spec = check_arm_agrees(
        condinit, kwargs.pop(_REFERENCE_KEY, None), where=f"the condinit of the armed {_target_name(target)} node"
    )  # before the build
    target = locate(target) if isinstance(target, str) else target
    module = target(**kwargs)
    inner = [(name, m) for name, m in module.named_modules() if getattr(m, "condinit_report", None) is not None]
    if inner:
        where = ", ".join(f"{name or '<root>'} ({m.condinit_report.arm})" for name, m in inner)
        raise ValueError(
            f"the arm is applied in two places: an armed node inside {_target_name(target)} ({where}) and the "
            f"model node ({spec.arm}); arm the model once (armed() on one node, set condinit.arm)"
        )
    if _build_mode == "sites":
        report = apply_arm_spec(module, dataclasses.replace(spec, arm="default"), site_prefix=site_prefix)
    elif _build_mode == "broadcast" and comm.get_rank() != 0:
        report = InitReport(arm=spec.arm, seed=spec.seed, options=spec.identity()["options"], sites=[])
        _logger.info("Attention init %s: computed on rank 0 and broadcast by DistributedDataParallel", spec.arm)
    else:
        report = apply_arm_spec(module, spec, site_prefix=site_prefix)
        _logger.info("Attention init %s", report.summary())
    module.condinit_report = report
    return module
