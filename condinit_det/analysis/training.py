"""kappa(J) along training, for the detection hook (:mod:`.hooks`) and the pretraining loop: the ``condinit_analysis``
node (:data:`ANALYSIS_DEFAULTS`; ``period <= 0``: off), measuring, and the ``"conditioning"`` records.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import nn

from .measure import KAPPA_COLUMNS, SiteMeasurement, measure_sites, resolve_sites
from .options import ANALYSIS_DEFAULTS

__all__ = ["analysis_options", "conditioning_records", "measure_conditioning", "measurement_options"]

_logger = logging.getLogger(__name__)

_RECORD_KEYS = (
    *KAPPA_COLUMNS,
    "converged",
    "rank_deficient",
    "rows",
    "cols",
    "tokens",
    "method",
    "include_output_proj",
    "reduction",
    "structure",
    "num_heads",
    "sigma_max_heads",
    "sigma_min_heads",
    "kappa_heads",
)


def analysis_options(node: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``node`` (a ``condinit_analysis`` mapping, or None) with :data:`ANALYSIS_DEFAULTS` filled in; ValueError on
    unknown keys."""
    node = dict(node or {})
    unknown = sorted(set(node) - set(ANALYSIS_DEFAULTS))
    if unknown:
        raise ValueError(f"condinit_analysis has unknown key(s) {unknown}; accepted: {sorted(ANALYSIS_DEFAULTS)}")
    return {**ANALYSIS_DEFAULTS, **node}


def measurement_options(opts: Mapping[str, Any]) -> Dict[str, Any]:
    """The keywords of :func:`measure_conditioning` in ``opts`` (:func:`analysis_options`): every key but ``period``
    and ``num_images`` (how often, on how many images: the caller's)."""
    return {key: value for key, value in opts.items() if key not in ("period", "num_images")}


def conditioning_records(
    measurements: Sequence[SiteMeasurement], *, iteration: int, arm=None, seed=None, config=None, **fields
) -> List[dict]:
    """One ``"conditioning"`` results record per measurement at ``iteration`` (completed optimizer steps), with
    ``arm``, ``seed``, ``config`` and ``fields`` (e.g. ``epoch=3, stage="pretrain"``)."""
    return [
        {
            "kind": "conditioning",
            "iteration": int(iteration),
            "site": m.site,
            **{key: getattr(m, key) for key in _RECORD_KEYS},
            "site_kind": m.kind,
            "iterations_lanczos": m.iterations,
            "arm": arm,
            "seed": seed,
            "config": config,
            **fields,
        }
        for m in measurements
    ]


def measure_conditioning(
    model: nn.Module,
    batch,
    *,
    sites: Optional[Sequence[str]] = None,
    storage=None,
    at: str = "",
    logger: Optional[logging.Logger] = None,
    max_batch: Optional[int] = 1,
    max_tokens: Optional[int] = 16,
    **kwargs,
) -> List[SiteMeasurement]:
    """Measure kappa(J) of ``model``'s sites on ``batch`` (what its forward takes) with its current weights, which are
    only read (no global RNG advances); one :class:`.measure.SiteMeasurement` per site, in model order.

    Args:
        sites: fnmatch patterns on site names, or None for the first, middle and last site.
        storage: an event storage receiving ``conditioning/<site>/{kappa,sigma_max,sigma_min,bound}`` (the finite
            ones), or None.
        at, logger: where in training (e.g. ``"iteration 500"``) and the logger, for the warning about an
            unconverged estimate.
        max_batch, max_tokens: how the captured inputs are reduced (:func:`.capture.capture_site_inputs`).
        kwargs: the other keywords of :func:`.measure.measure_site`.
    """
    chosen = resolve_sites(model, sites, default="ends")
    rows = measure_sites(model, batch, chosen, max_batch=max_batch, max_tokens=max_tokens, **kwargs)
    for m in rows:
        if storage is not None:
            for key in ("kappa", "sigma_max", "sigma_min", "bound"):
                value = getattr(m, key)
                if math.isfinite(value):
                    storage.put_scalar(f"conditioning/{m.site}/{key}", value, smoothing_hint=False)
        if not m.converged:
            (logger or _logger).warning(
                "conditioning of %s at %s did not converge in %d steps: kappa %.4g is a lower estimate",
                m.site,
                at or "this point",
                m.iterations,
                m.kappa,
            )
    return rows
