"""Applying an arm from a config: the detectron2-facing entry to :mod:`condinit_det.init`.

Lazy configs carry a top-level ``condinit`` node (``configs/common/condinit.py``)::

    condinit = dict(arm="default", seed=0, include=None, exclude=None, options={})

``tools/train_net.py`` calls :func:`apply_arm_config` right after ``instantiate(cfg.model)`` and
before any checkpoint is loaded. The model's modules are changed in place, so state_dict keys
stay as they were and every checkpoint still loads (and then overrides the arm for the weights
it holds). Every rank applies the same arm with the same seed, so DDP replicas start identical.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping, Optional, Sequence

from torch import nn

from ..init import InitReport, apply_init

__all__ = ["ARM_REPORT_FILE", "apply_arm_config", "init_arm"]

ARM_REPORT_FILE = "condinit_arm_report.json"

_logger = logging.getLogger(__name__)
_KEYS = ("arm", "seed", "include", "exclude", "options")


def _plain(value):
    """OmegaConf containers -> plain Python (lists/dicts), anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with detectron2
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def apply_arm_config(model: nn.Module, condinit: Optional[Mapping], *, output_dir: Optional[str] = None,
                     is_main_process: bool = True) -> InitReport:
    """Apply the arm described by a config's ``condinit`` node to ``model``; return the report.

    condinit: mapping with ``arm`` (required), ``seed`` (default 0), ``include`` / ``exclude``
    (fnmatch patterns on site names, default None) and ``options`` (the arm's options).
    A missing node means the default arm. The report is logged and, when ``output_dir`` is given
    and this is the main process, saved as ``<output_dir>/condinit_arm_report.json``.
    """
    node = dict(_plain(condinit) or {"arm": "default"})
    unknown = sorted(set(node) - set(_KEYS))
    if unknown:
        raise ValueError(f"condinit has unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_KEYS)}")
    if "arm" not in node:
        raise ValueError("condinit.arm is missing; set it to one of default, mimetic, conditioned")
    report = apply_init(
        model,
        node["arm"],
        seed=int(node.get("seed", 0) or 0),
        include=node.get("include"),
        exclude=node.get("exclude"),
        **dict(node.get("options") or {}),
    )
    _logger.info("Attention init %s", report.summary())
    for site in report.sites:
        _logger.debug("  %s (%s): %s", site.name, site.kind, ", ".join(site.changed) or "unchanged")
        if site.note:
            _logger.warning("  %s: %s", site.name, site.note)
    if output_dir and is_main_process:
        report.save(os.path.join(output_dir, ARM_REPORT_FILE))
    return report


def init_arm(module: nn.Module, *, arm: str, seed: int = 0, include: Optional[Sequence[str]] = None,
             exclude: Optional[Sequence[str]] = None, **options) -> nn.Module:
    """Apply an arm to ``module`` and return it: a builder for lazy configs.

    Example (arm applied to the backbone when it is built)::

        model.backbone.net = L(init_arm)(module=L(ViT)(...), arm="conditioned", seed=0)

    The report is kept on ``module.condinit_report``.
    """
    report = apply_init(module, arm, seed=seed, include=_plain(include), exclude=_plain(exclude), **options)
    _logger.info("Attention init of %s: %s", type(module).__name__, report.summary())
    module.condinit_report = report
    return module
