"""kappa of the attention Jacobian during detectron2 training (main process only; no RNG advances). See
docs/conditioning.md#during-training.
"""

from __future__ import annotations

import itertools
import logging
from typing import Optional

from detectron2.engine import HookBase
from detectron2.utils import comm
from torch.utils.data import IterableDataset

from ..records.results import ResultsFile
from .training import analysis_options, conditioning_records, measure_conditioning, measurement_options

__all__ = ["ConditioningHook", "build_conditioning_hook", "fixed_batch"]

_logger = logging.getLogger(__name__)


class ConditioningHook(HookBase):
    """Measure kappa(J) of attention sites on a fixed batch at the initialization, every ``period`` iterations and
    after the last one (a resumed run: what the uninterrupted one would), into the event storage and
    ``"conditioning"`` records (:func:`.training.measure_conditioning`); main process only.

    Args:
        batch: detectron2 input dicts (what the model's forward takes), kept fixed.
        output_dir: where ``results.json`` lives (None: storage only); ``results``: an object with ``add(record)``
            in place of ``ResultsFile(output_dir)``.
        arm, seed, config: copied into every record.
        options: the measurement keys of ``ANALYSIS_DEFAULTS``; an unknown key raises a ValueError.
    """

    def __init__(
        self,
        batch,
        *,
        period: int,
        output_dir: Optional[str] = None,
        results=None,
        arm: Optional[str] = None,
        seed: Optional[int] = None,
        config: Optional[str] = None,
        **options,
    ):
        self.batch = list(batch)
        self.period = int(period)
        self.options = measurement_options(analysis_options(options))
        self.results = ResultsFile(output_dir) if results is None and output_dir else results
        self.arm, self.seed, self.config = arm, seed, config
        self._last_measured = None

    def measure(self, iteration: int):
        """Measure now; write storage scalars and records for ``iteration`` (completed iterations)."""
        if not comm.is_main_process() or self._last_measured == iteration:
            return []
        model = getattr(self.trainer.model, "module", self.trainer.model)  # unwrap DistributedDataParallel
        storage = getattr(self.trainer, "storage", None)
        at = f"iteration {iteration}"
        rows = measure_conditioning(model, self.batch, storage=storage, at=at, logger=_logger, **self.options)
        records = conditioning_records(rows, iteration=iteration, arm=self.arm, seed=self.seed, config=self.config)
        if self.results is not None:
            for rec in records:
                self.results.add(rec)
        self._last_measured = iteration
        return records

    def before_train(self):
        if self.trainer.iter == 0:
            self.measure(0)

    def after_step(self):
        # The last iteration too, whether or not it is a multiple of the period.
        done = self.trainer.iter + 1
        if done % self.period == 0 or done == self.trainer.max_iter:
            self.measure(done)


def fixed_batch(cfg, num_images: int, *, split: str = "test") -> list:
    """The first ``num_images`` inputs of ``cfg.dataloader[split]``, by index from its dataset where it has one (no
    sampler, no RNG), else from its first batches."""
    from detectron2.config import instantiate

    if "dataloader" not in cfg or split not in cfg.dataloader:
        raise KeyError(f"the config has no dataloader.{split} to take the batch from")
    node = cfg.dataloader[split]
    if "num_workers" in node:
        node = node.copy() if hasattr(node, "copy") else node
        node.num_workers = 0
    loader = instantiate(node)
    dataset = getattr(loader, "dataset", None)
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and not isinstance(dataset, IterableDataset):
        return [dataset[i] for i in range(min(num_images, len(dataset)))]
    batch = list(itertools.islice(itertools.chain.from_iterable(loader), num_images))
    if not batch:
        raise RuntimeError(f"dataloader.{split} gave no data")
    return batch


def build_conditioning_hook(cfg, batch=None, *, config_name: Optional[str] = None) -> Optional[ConditioningHook]:
    """The hook that ``cfg.condinit_analysis`` describes, or None when the node is missing or its ``period <= 0``; its
    records carry ``cfg.condinit``'s arm and seed and ``config_name``, and go to ``cfg.train.output_dir``. ``batch``
    defaults to :func:`fixed_batch` of the test loader (the training loader is not touched)."""
    opts = analysis_options(cfg.get("condinit_analysis"))
    if int(opts["period"] or 0) <= 0:
        return None
    if batch is None:
        batch = fixed_batch(cfg, int(opts["num_images"]))
    condinit = cfg.get("condinit", None) or {}
    output_dir = cfg.train.output_dir if "train" in cfg and "output_dir" in cfg.train else None
    return ConditioningHook(
        batch,
        period=int(opts["period"]),
        output_dir=output_dir,
        arm=condinit.get("arm", "default"),
        seed=condinit.get("seed", 0),
        config=config_name,
        **measurement_options(opts),
    )
