"""The detection stage's training data and random draws, keyed so that a resumed run continues exactly.

:func:`build_train_loader` takes ``build_detection_train_loader``'s arguments (detectron2's samplers, mappers and
datasets) and returns a loader whose batch ``b`` is a function of ``(seed, rank, b)`` alone: the sampler's index
stream, grouped by aspect ratio on the dataset's own ``width`` / ``height``, and each image mapped with every global
RNG seeded from its position in the stream. :class:`StepSeeds` seeds the step's RNGs from ``(seed, rank,
iteration)``. A run started at iteration ``i`` therefore trains on what the uninterrupted run trained on from ``i``
on, whatever the number of loader workers. Detail: docs/training.md#exact-resume.
"""

import contextlib
import logging
import random
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.utils.data as torchdata
from detectron2.config import configurable, instantiate
from detectron2.data import DatasetFromList, build_detection_train_loader
from detectron2.data.build import trivial_batch_collator
from detectron2.data.samplers import TrainingSampler
from detectron2.engine import HookBase
from detectron2.utils import comm
from detectron2.utils.registry import locate

__all__ = ["KeyedBatches", "StepSeeds", "build_train_loader", "instantiate_train_loader"]

logger = logging.getLogger("detectron2")

_IMAGE, _STEP = 0, 1  # the two kinds of keys: an image's position in the stream, an iteration


def _seed(key: Tuple[int, ...]) -> int:
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0])


@contextlib.contextmanager
def _seeded(*key: int):
    """Python's, NumPy's and torch's global CPU RNGs seeded from ``key`` inside, restored on the way out."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    seed = _seed(key)
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


class KeyedBatches(torchdata.IterableDataset):
    """The batches of this process from batch ``start`` on (the iteration a run starts from): lists of mapped
    dataset dicts.

    The sampler's stream (this process's share) is cut into batches of ``batch_size`` in order, or, given
    ``landscape`` (per dataset index, width > height), as detectron2's ``AspectRatioGroupedDataset`` does: landscape
    and portrait images fill separate batches. Image ``k`` of the stream is mapped with every global RNG
    seeded from ``(seed, rank, k)``; loader worker ``w`` of ``n`` maps the batches ``b`` with ``b % n == w``, which a
    ``DataLoader`` yields in order.
    """

    def __init__(
        self,
        dataset,
        mapper,
        sampler,
        batch_size: int,
        *,
        landscape: Optional[List[bool]],
        seed: int,
        rank: int,
        start: int = 0,
    ):
        self.dataset, self.mapper, self.sampler = dataset, mapper, sampler
        self.batch_size, self.landscape, self.seed, self.rank, self.start = batch_size, landscape, seed, rank, start

    def index_batches(self) -> Iterator[List[Tuple[int, int]]]:
        """Every batch of the stream from its beginning, as (position in the stream, dataset index) pairs."""
        buckets = {False: [], True: []}
        for position, index in enumerate(self.sampler):
            bucket = buckets[self.landscape is not None and self.landscape[index]]
            bucket.append((position, index))
            if len(bucket) == self.batch_size:
                yield bucket[:]
                bucket.clear()

    def _map(self, position: int, index: int):
        with _seeded(self.seed, _IMAGE, self.rank, position):
            while (mapped := self.mapper(self.dataset[index])) is None:  # as detectron2's MapDataset: another image
                index = random.randrange(len(self.dataset))
        return mapped

    def __iter__(self):
        worker = torchdata.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker else (0, 1)
        for b, batch in enumerate(self.index_batches()):
            if b >= self.start and (b - self.start) % workers == worker_id:
                yield [self._map(position, index) for position, index in batch]


@configurable(from_config=build_detection_train_loader.from_config)
def build_train_loader(
    dataset,
    *,
    mapper,
    sampler=None,
    total_batch_size: int,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    collate_fn=None,
    seed: int,
    start: int = 0,
    **kwargs,
) -> torchdata.DataLoader:
    """``build_detection_train_loader`` with batches keyed by ``seed`` (:class:`KeyedBatches`); the same arguments
    (a yacs ``cfg`` too), plus the first batch ``start``. ``sampler`` None: a ``TrainingSampler`` shuffled with
    ``seed``. ``kwargs`` go to the ``DataLoader``."""
    if isinstance(dataset, torchdata.IterableDataset):
        raise ValueError(
            "dataloader.train.dataset is an IterableDataset: its stream cannot be keyed by position; give a list of "
            "dataset dicts or a map-style dataset"
        )
    dicts = dataset if isinstance(dataset, list) else (dataset[i] for i in range(len(dataset)))
    landscape = [d["width"] > d["height"] for d in dicts] if aspect_ratio_grouping else None
    world = comm.get_world_size()
    if total_batch_size <= 0 or total_batch_size % world:
        raise ValueError(f"dataloader.train.total_batch_size={total_batch_size}: expected a multiple of {world} > 0")
    batches = KeyedBatches(
        DatasetFromList(dataset, copy=False) if isinstance(dataset, list) else dataset,
        mapper,
        TrainingSampler(len(dataset), seed=seed) if sampler is None else sampler,
        total_batch_size // world,
        landscape=landscape,
        seed=seed,
        rank=comm.get_rank(),
        start=start,
    )
    collate = trivial_batch_collator if collate_fn is None else collate_fn
    # A generator of its own: the loader draws its workers' base seed when it starts, which must not move the step's
    # RNG (the run resumed at iteration i starts its loader there).
    return torchdata.DataLoader(
        batches, batch_size=None, num_workers=num_workers, collate_fn=collate, generator=torch.Generator(), **kwargs
    )


def instantiate_train_loader(cfg, *, start: int = 0) -> torchdata.DataLoader:
    """``cfg.dataloader.train`` from batch ``start`` on: built by :func:`build_train_loader`, keyed by
    ``train.seed``, where it calls detectron2's ``build_detection_train_loader``; any other loader as it is (a
    resumed run then starts its data stream again, which a warning says)."""
    node = cfg.dataloader.train
    target = locate(node._target_) if isinstance(node._target_, str) else node._target_
    if target is build_detection_train_loader:
        arguments = {key: instantiate(value) for key, value in node.items() if key != "_target_"}
        return build_train_loader(**arguments, seed=int(cfg.train.seed), start=start)
    if start:
        logger.warning(
            f"dataloader.train calls {getattr(target, '__qualname__', target)}, not detectron2's "
            "build_detection_train_loader: this resumed run starts its data stream again"
        )
    return instantiate(node)


class StepSeeds(HookBase):
    """Before every step, every global RNG (dropout, drop-path, the detector's sampling of anchors and proposals)
    seeded from ``(seed, rank, iteration)``: the step draws the same whether the run was resumed or not."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def before_step(self):
        seed = _seed((self.seed, _STEP, comm.get_rank(), self.trainer.iter))
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # every device's generator
