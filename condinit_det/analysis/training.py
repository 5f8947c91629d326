"""kappa(J) measured along training, shared by every training loop that tracks it.

A ``condinit_analysis`` config node (keys and defaults: :data:`ANALYSIS_DEFAULTS`; ``period <= 0``: off) is read
with :func:`analysis_options`; :func:`measure_conditioning` measures the chosen sites of a model on a fixed batch
now, puts ``conditioning/<site>/{kappa,sigma_max,sigma_min,bound}`` scalars into an event storage and warns about
unconverged estimates; :func:`conditioning_records` turns the measurements into ``"conditioning"`` results records.
The detectron2 hook (:mod:`.hooks`, period in iterations) and the pretraining loop (:mod:`condinit_det.pretrain`,
period in epochs) both build on these. No detectron2 import.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import nn

from .measure import SiteMeasurement, measure_sites, resolve_sites

__all__ = ["ANALYSIS_DEFAULTS", "analysis_options", "conditioning_records", "measure_conditioning",
           "measurement_options"]

_logger = logging.getLogger(__name__)

# Keys of the config node ``condinit_analysis`` (``period <= 0`` turns the measurement off).
# With max_tokens tokens of width D_v the Gram operator has n = max_tokens * D_v rows; the block
# Lanczos run is exact once max_iter * block_size >= n, and sigma_min rarely converges much sooner.
ANALYSIS_DEFAULTS = dict(period=0, sites=None, method="auto", max_iter=100, block_size=16, tol=1e-3, max_batch=1,
                         max_tokens=16, include_output_proj=False, bound=True, num_images=1)

_RECORD_KEYS = ("kappa", "sigma_max", "sigma_min", "bound", "kappa_wq", "kappa_wk", "kappa_wv", "kappa_x",
                "kappa_softmax", "kappa_lambda", "converged", "rank_deficient", "rows", "cols", "tokens", "method",
                "include_output_proj", "reduction", "structure", "num_heads", "sigma_max_heads", "sigma_min_heads",
                "kappa_heads")


def analysis_options(node: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``node`` (a ``condinit_analysis`` mapping, or None) with :data:`ANALYSIS_DEFAULTS` filled in.

    Raises ValueError naming the unknown keys and the accepted ones.
    """
    node = dict(node or {})
    unknown = sorted(set(node) - set(ANALYSIS_DEFAULTS))
    if unknown:
        raise ValueError(f"condinit_analysis has unknown key(s) {unknown}; accepted: {sorted(ANALYSIS_DEFAULTS)}")
    return {**ANALYSIS_DEFAULTS, **node}


def measurement_options(opts: Mapping[str, Any]) -> Dict[str, Any]:
    """The keywords of :func:`measure_conditioning` in ``opts`` (:func:`analysis_options`), typed; ``period``
    and ``num_images`` (how often, on how many images) are the caller's."""
    return dict(sites=opts["sites"], method=str(opts["method"]), max_batch=opts["max_batch"],
                max_tokens=opts["max_tokens"], max_iter=int(opts["max_iter"]), block_size=int(opts["block_size"]),
                tol=float(opts["tol"]), include_output_proj=bool(opts["include_output_proj"]),
                bound=bool(opts["bound"]))


def conditioning_records(measurements: Sequence[SiteMeasurement], *, iteration: int, arm=None, seed=None,
                         config=None, **fields) -> List[dict]:
    """Results records (dicts) of ``SiteMeasurement`` objects, one per site::

        {"kind": "conditioning", "iteration": <completed optimizer steps>, "site", "kappa", "sigma_max",
         "sigma_min", "bound", ..., "kappa_heads", "site_kind", "iterations_lanczos", "arm", "seed", "config"}

    ``fields`` (e.g. ``epoch=3, stage="pretrain"``) are added to every record.
    """
    records = []
    for m in measurements:
        d = m.to_dict()
        rec = {"kind": "conditioning", "iteration": int(iteration), "site": m.site}
        for key in _RECORD_KEYS:
            rec[key] = d[key]
        rec["site_kind"] = m.kind
        rec["iterations_lanczos"] = m.iterations
        rec.update(arm=arm, seed=seed, config=config)
        rec.update(fields)
        records.append(rec)
    return records


def measure_conditioning(model: nn.Module, batch, *, sites: Optional[Sequence[str]] = None, storage=None,
                         at: str = "", logger: Optional[logging.Logger] = None, max_batch: Optional[int] = 1,
                         max_tokens: Optional[int] = 16, **kwargs) -> List[SiteMeasurement]:
    """Measure kappa(J) of ``model``'s sites on ``batch`` (what ``model``'s forward takes) with its current weights.

    sites: fnmatch patterns on site names, or None for the first, middle and last site.
    storage: an event storage (``put_scalar``) receiving ``conditioning/<site>/{kappa,sigma_max,sigma_min,bound}``
        at its current iteration (non-finite values are left out), or None.
    at / logger: where in training and the logger, for the warning about an unconverged estimate
        (``"iteration 500"``; default logger: this module's).
    Remaining keywords go to :func:`condinit_det.analysis.measure.measure_site`.
    No global RNG is advanced and parameters and their gradients are only read.
    """
    patterns = [sites] if isinstance(sites, str) else (list(sites) if sites else None)
    chosen = resolve_sites(model, patterns, default="ends")
    rows = measure_sites(model, batch, chosen, max_batch=max_batch, max_tokens=max_tokens, **kwargs)
    for m in rows:
        if storage is not None:
            for key in ("kappa", "sigma_max", "sigma_min", "bound"):
                value = getattr(m, key)
                if math.isfinite(value):
                    storage.put_scalar(f"conditioning/{m.site}/{key}", value, smoothing_hint=False)
        if not m.converged:
            (logger or _logger).warning("conditioning of %s at %s did not converge in %d steps: kappa %.4g is a lower "
                                        "estimate", m.site, at or "this point", m.iterations, m.kappa)
    return rows
