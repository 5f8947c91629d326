"""kappa of the attention Jacobian along pretraining (the ``condinit_analysis`` node, its period in epochs): the main
process measures a fixed batch of evaluation images at the start, after every ``period``-th epoch and after the last,
into ``"conditioning"`` records; no RNG advances. See docs/pretraining.md#κ-of-the-attention-jacobian-along-pretraining.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional

import torch
from torch import nn

from ..analysis.training import analysis_options, conditioning_records, measure_conditioning, measurement_options
from ..init.spec import plain
from ..utils.errors import UsageError

logger = logging.getLogger("condinit_det.pretrain")


def conditioning_options(cfg) -> Optional[Dict]:
    """``cfg.condinit_analysis`` with its defaults, or None when absent or ``period <= 0``; bad keys or values raise."""
    opts = analysis_options(plain(cfg.get("condinit_analysis")))
    if int(opts["period"] or 0) <= 0:
        return None
    if int(opts["num_images"]) < 1:
        raise UsageError(f"condinit_analysis.num_images={opts['num_images']}; it must be at least 1")
    return opts


def fixed_batch(dataset, num_images: int) -> torch.Tensor:
    """The first ``num_images`` images of ``dataset``, read by index (no random draw), as ``[N, 3, H, W]``."""
    return torch.stack([dataset[i][0] for i in range(min(int(num_images), len(dataset)))])


class EpochConditioning:
    """Measures kappa(J) at the start of training and after due epochs; main process only.

    Args:
        batch: the fixed input on the model's device; opts: :func:`conditioning_options`.
        meta: fields copied into every record (``stage``, ``arm``, ``seed``, ``lr_scale``, ``config``).
    """

    def __init__(self, batch: torch.Tensor, opts: Dict, *, num_epochs: int, meta: Dict):
        self.batch = batch
        self.period = int(opts["period"])
        self.num_epochs = int(num_epochs)
        self.options = measurement_options(opts)
        self.meta = dict(meta)
        self.last_epoch: Optional[int] = None

    def due(self, epoch: int) -> bool:
        """Whether ``epoch`` (completed epochs) is measured after it ends."""
        return epoch != self.last_epoch and (epoch % self.period == 0 or epoch == self.num_epochs)

    def start(self, model: nn.Module, *, epoch: int, step: int, storage=None, results=None) -> List[dict]:
        """The measurement of the initialization (epoch 0): a resumed run's predecessor made it, and every due one up
        to the checkpoint it resumes from, so a resumed run measures where the uninterrupted run does."""
        return self.measure(model, epoch=epoch, step=step, storage=storage, results=results) if epoch == 0 else []

    def measure(self, model: nn.Module, *, epoch: int, step: int, storage=None, results=None) -> List[dict]:
        """Measure now; add the records to ``results`` (a ``ResultsFile``) and the scalars to ``storage``."""
        if epoch == self.last_epoch:
            return []
        start = time.perf_counter()
        rows = measure_conditioning(
            model, self.batch, storage=storage, at=f"epoch {epoch} (step {step})", logger=logger, **self.options
        )
        records = conditioning_records(rows, iteration=step, epoch=epoch, **self.meta)
        if results is not None:
            results.extend(records)
        self.last_epoch = epoch
        kappas = ", ".join(f"{m.site} {m.kappa:.4g}" for m in rows)
        logger.info(f"kappa at epoch {epoch} (step {step}): {kappas} ({time.perf_counter() - start:.2f} s)")
        return records
