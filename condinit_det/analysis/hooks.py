"""Track kappa of the attention Jacobian during detectron2 training.

``ConditioningHook`` measures chosen attention sites (default: first, middle and last) on a fixed
batch at the start of training (the initialization, or the resumed iteration), every ``period``
iterations, and after the last iteration, on X captured from the fixed batch with the current
weights. ``method="auto"`` (default) takes the exact per-head method when one head's factor fits
(:mod:`condinit_det.analysis.heads`; at the default 16 tokens it does at ViT-B width) and the
matrix-free estimate (block Lanczos on jvp/vjp products) otherwise. It writes

- event storage scalars ``conditioning/<site>/{kappa,sigma_max,sigma_min,bound}``, and
- one results record per site (``condinit_det.records.results.ResultsFile(output_dir).add``)::

    {"kind": "conditioning", "iteration": <completed iterations>, "site": <name>, "kappa",
     "sigma_max", "sigma_min", "bound", "kappa_wq", "kappa_wk", "kappa_wv", "kappa_x",
     "kappa_softmax", "kappa_lambda", "converged", "iterations_lanczos", "rows", "cols",
     "tokens", "method", "include_output_proj", "reduction", "arm", "seed", "config", "structure",
     "num_heads", "sigma_max_heads", "sigma_min_heads", "kappa_heads"}

  (the ``*_heads`` lists hold one value per head for the exact method without W_O; the site's
  sigma_max / sigma_min are their max / min, and its kappa their ratio).

Measurement does not advance any global RNG and does not change parameters or their gradients.
Only the main process measures.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Optional, Sequence

from detectron2.engine import HookBase
from detectron2.utils import comm

from .measure import measure_sites, resolve_sites

__all__ = ["ConditioningHook", "build_conditioning_hook", "ANALYSIS_DEFAULTS", "conditioning_records"]

_logger = logging.getLogger(__name__)

# Keys of the config node ``condinit_analysis`` (``period <= 0`` turns the hook off).
# With max_tokens tokens of width D_v the Gram operator has n = max_tokens * D_v rows; the block
# Lanczos run is exact once max_iter * block_size >= n, and sigma_min rarely converges much sooner.
ANALYSIS_DEFAULTS = dict(period=0, sites=None, method="auto", max_iter=100, block_size=16, tol=1e-3, max_batch=1,
                         max_tokens=16, include_output_proj=False, bound=True, num_images=1)


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


def conditioning_records(measurements, *, iteration: int, arm=None, seed=None, config=None):
    """Results records (dicts) of ``SiteMeasurement`` objects; see the module doc for the keys."""
    records = []
    for m in measurements:
        d = m.to_dict()
        rec = {"kind": "conditioning", "iteration": int(iteration), "site": m.site}
        for key in ("kappa", "sigma_max", "sigma_min", "bound", "kappa_wq", "kappa_wk", "kappa_wv", "kappa_x",
                    "kappa_softmax", "kappa_lambda", "converged", "rank_deficient", "rows", "cols", "tokens",
                    "method", "include_output_proj", "reduction", "structure", "num_heads", "sigma_max_heads",
                    "sigma_min_heads", "kappa_heads"):
            rec[key] = d[key]
        rec["site_kind"] = m.kind
        rec["iterations_lanczos"] = m.iterations
        rec.update(arm=arm, seed=seed, config=config)
        records.append(rec)
    return records


class ConditioningHook(HookBase):
    """Measure kappa(J) of attention sites on a fixed batch during training (see module doc).

    batch: list of detectron2 input dicts (what the model's forward takes), kept fixed.
    sites: fnmatch patterns on site names, or None for first / middle / last site.
    period: measure every ``period`` iterations (and at the start and end); must be positive.
    output_dir: where results.json lives (None: storage only). results: an object with ``add(record)``
        replacing the default ``ResultsFile(output_dir)``.
    arm / seed / config: copied into every record.
    Remaining keywords go to :func:`condinit_det.analysis.measure.measure_site`.
    """

    def __init__(self, batch, *, period: int, sites: Optional[Sequence[str]] = None, output_dir: Optional[str] = None,
                 results=None, arm: Optional[str] = None, seed: Optional[int] = None, config: Optional[str] = None,
                 method: str = "auto", max_batch: Optional[int] = 1, max_tokens: Optional[int] = 16,
                 max_iter: int = 100, block_size: int = 16, tol: float = 1e-3, include_output_proj: bool = False,
                 bound: bool = True):
        if int(period) <= 0:
            raise ValueError(f"period must be a positive number of iterations, got {period}")
        if not isinstance(batch, (list, tuple)) or not batch:
            raise ValueError("batch must be a non-empty list of model inputs (e.g. one data-loader batch)")
        self.batch = list(batch)
        self.period = int(period)
        self.patterns = [sites] if isinstance(sites, str) else (list(sites) if sites else None)
        self.output_dir = output_dir
        self._results = results
        self.arm, self.seed, self.config = arm, seed, config
        self.capture_kwargs = dict(max_batch=max_batch, max_tokens=max_tokens)
        self.measure_kwargs = dict(method=method, max_iter=max_iter, block_size=block_size, tol=tol,
                                   include_output_proj=include_output_proj, bound=bound)
        self._last_measured = None

    @property
    def results(self):
        if self._results is None and self.output_dir:
            from condinit_det.records.results import ResultsFile

            self._results = ResultsFile(self.output_dir)
        return self._results

    def measure(self, iteration: int):
        """Measure now; write storage scalars and records for ``iteration`` (completed iterations)."""
        if not comm.is_main_process() or self._last_measured == iteration:
            return []
        model = _unwrap(self.trainer.model)
        sites = resolve_sites(model, self.patterns, default="ends")
        rows = measure_sites(model, self.batch, sites, **self.capture_kwargs, **self.measure_kwargs)
        storage = getattr(self.trainer, "storage", None)
        for m in rows:
            if storage is not None:
                for key in ("kappa", "sigma_max", "sigma_min", "bound"):
                    value = getattr(m, key)
                    if math.isfinite(value):
                        storage.put_scalar(f"conditioning/{m.site}/{key}", value, smoothing_hint=False)
            if not m.converged:
                _logger.warning("conditioning of %s at iteration %d did not converge in %d steps: kappa %.4g is a "
                                "lower estimate", m.site, iteration, m.iterations, m.kappa)
        records = conditioning_records(rows, iteration=iteration, arm=self.arm, seed=self.seed, config=self.config)
        if self.results is not None:
            for rec in records:
                self.results.add(rec)
        self._last_measured = iteration
        return records

    def before_train(self):
        self.measure(self.trainer.iter)

    def after_step(self):
        done = self.trainer.iter + 1
        if done % self.period == 0 or done == self.trainer.max_iter:
            self.measure(done)

    def after_train(self):
        # Also covers a run whose last iteration is not a multiple of the period.
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self.measure(self.trainer.max_iter)


def _fixed_batch(cfg, num_images: int):
    """``num_images`` inputs from the test loader's dataset (deterministic; no sampler RNG is used)."""
    from detectron2.config import instantiate

    node = cfg.dataloader.test
    if "num_workers" in node:
        node = node.copy() if hasattr(node, "copy") else node
        node.num_workers = 0
    loader = instantiate(node)
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return [dataset[i] for i in range(min(num_images, len(dataset)))]
    return list(next(iter(loader)))[:num_images]


def build_conditioning_hook(cfg, batch=None, *, config_name: Optional[str] = None) -> Optional[
        ConditioningHook]:
    """The hook described by ``cfg.condinit_analysis`` (keys: ``ANALYSIS_DEFAULTS``), or None when
    the node is missing or ``period <= 0``.

    batch: fixed inputs; default: the first ``num_images`` images of ``cfg.dataloader.test``'s
    dataset (the training loader is not touched, so data order and RNG state are unchanged).
    Records carry ``cfg.condinit.arm`` / ``.seed``, ``config_name`` and go to ``cfg.train.output_dir``.
    """
    node: Mapping[str, Any] = cfg.get("condinit_analysis", None) if hasattr(cfg, "get") else None
    if not node:
        return None
    node = dict(node)
    unknown = sorted(set(node) - set(ANALYSIS_DEFAULTS))
    if unknown:
        raise ValueError(f"condinit_analysis has unknown key(s) {unknown}; accepted: {sorted(ANALYSIS_DEFAULTS)}")
    opts = {**ANALYSIS_DEFAULTS, **node}
    if int(opts["period"] or 0) <= 0:
        return None
    if batch is None:
        batch = _fixed_batch(cfg, int(opts["num_images"]))
    condinit = cfg.get("condinit", None) or {}
    output_dir = cfg.train.output_dir if "train" in cfg and "output_dir" in cfg.train else None
    return ConditioningHook(
        batch, period=int(opts["period"]), sites=opts["sites"], output_dir=output_dir,
        arm=condinit.get("arm", "default"), seed=condinit.get("seed", 0), config=config_name,
        method=str(opts["method"]), max_batch=opts["max_batch"], max_tokens=opts["max_tokens"],
        max_iter=int(opts["max_iter"]), block_size=int(opts["block_size"]), tol=float(opts["tol"]),
        include_output_proj=bool(opts["include_output_proj"]), bound=bool(opts["bound"]))
