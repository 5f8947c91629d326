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
from typing import Any, Mapping, Optional, Sequence

from detectron2.engine import HookBase
from detectron2.utils import comm

from .training import (
    ANALYSIS_DEFAULTS,
    analysis_options,
    conditioning_records,
    measure_conditioning,
    measurement_options,
)

__all__ = ["ConditioningHook", "build_conditioning_hook", "ANALYSIS_DEFAULTS", "conditioning_records"]

_logger = logging.getLogger(__name__)


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


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
        storage = getattr(self.trainer, "storage", None)
        rows = measure_conditioning(model, self.batch, sites=self.patterns, storage=storage,
                                    at=f"iteration {iteration}", logger=_logger, **self.capture_kwargs,
                                    **self.measure_kwargs)
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
    opts = analysis_options(node)
    if int(opts["period"] or 0) <= 0:
        return None
    if batch is None:
        batch = _fixed_batch(cfg, int(opts["num_images"]))
    condinit = cfg.get("condinit", None) or {}
    output_dir = cfg.train.output_dir if "train" in cfg and "output_dir" in cfg.train else None
    return ConditioningHook(batch, period=int(opts["period"]), output_dir=output_dir,
                            arm=condinit.get("arm", "default"), seed=condinit.get("seed", 0), config=config_name,
                            **measurement_options(opts))
