"""The detection stage's keyed training data (condinit_det.engine.data): batch b depends on (seed, rank, b) alone,
whatever the start and the number of loader workers; the step's draws depend on the iteration; the writers' history
travels in the checkpoint, so that a resumed run writes the uninterrupted run's metrics.json."""

import json
import logging
import random

import numpy as np
import pytest
import torch
from detectron2.config import CfgNode, get_cfg
from detectron2.engine import TrainerBase, hooks
from detectron2.utils.events import EventStorage, JSONWriter

from condinit_det.engine.data import KeyedBatches, StepSeeds, build_train_loader
from condinit_det.engine.hooks import WriterHistory, continue_writers
from condinit_det.records.results import METRICS_FILENAME, truncate_metrics

# Ten images, three of them landscape; the mapper returns what the global RNGs draw for it.
DATASET = [{"image_id": i, "width": 64 + 32 * (i % 3 == 0), "height": 64} for i in range(10)]


def _drawing_mapper(d):
    return {"image_id": d["image_id"], "draws": (random.random(), float(np.random.rand()), float(torch.rand(())))}


def _batches(num, **kwargs):
    loader = build_train_loader(
        DATASET, mapper=_drawing_mapper, total_batch_size=kwargs.pop("batch", 3), seed=kwargs.pop("seed", 7), **kwargs
    )
    stream = iter(loader)
    return [next(stream) for _ in range(num)]


def test_batches_depend_on_the_seed_and_their_index_alone():
    whole = _batches(12)
    assert _batches(7, start=5) == whole[5:]  # a run resumed at iteration 5
    assert _batches(12, num_workers=2) == whole  # loader workers change no image and no draw
    assert _batches(12, seed=8) != whole
    torch.manual_seed(0)
    before = torch.get_rng_state()
    _batches(2)
    assert torch.equal(torch.get_rng_state(), before)  # mapping leaves the global RNGs where they were


def test_aspect_ratio_grouping_fills_batches_of_one_orientation():
    batches = _batches(12)
    for batch in batches:
        landscape = {DATASET[d["image_id"]]["width"] > 64 for d in batch}
        assert len(landscape) == 1 and len(batch) == 3
    ungrouped = _batches(12, aspect_ratio_grouping=False)
    assert any(len({DATASET[d["image_id"]]["width"] > 64 for d in b}) == 2 for b in ungrouped)
    # The sampler's stream is consumed in order: the first ten ungrouped images are one shuffle of the ten images.
    assert len({d["image_id"] for b in ungrouped[:3] for d in b} | {ungrouped[3][0]["image_id"]}) == 10


def test_an_image_the_mapper_rejects_is_replaced_the_same_way_every_time():
    def rejecting(d):
        return None if d["image_id"] % 2 else _drawing_mapper(d)

    loader = build_train_loader(DATASET, mapper=rejecting, total_batch_size=2, seed=0, aspect_ratio_grouping=False)
    batches = [b for b, _ in zip(loader, range(6))]
    assert all(d["image_id"] % 2 == 0 for b in batches for d in b)
    resumed = build_train_loader(
        DATASET, mapper=rejecting, total_batch_size=2, seed=0, aspect_ratio_grouping=False, start=4
    )
    assert [b for b, _ in zip(resumed, range(2))] == batches[4:]


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(DATASET)


def test_a_yacs_config_and_bad_input():
    cfg = get_cfg()
    cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_WORKERS = 2, 0
    assert isinstance(cfg, CfgNode)
    loader = build_train_loader(cfg, dataset=DATASET, mapper=_drawing_mapper, seed=1)  # detectron2's from_config
    assert isinstance(loader.dataset, KeyedBatches) and loader.dataset.batch_size == 2
    with pytest.raises(ValueError, match="total_batch_size=0: expected a multiple of 1"):
        build_train_loader(DATASET, mapper=_drawing_mapper, total_batch_size=0, seed=1)
    with pytest.raises(ValueError, match="IterableDataset: its stream cannot be keyed"):
        build_train_loader(_Stream(), mapper=_drawing_mapper, total_batch_size=2, seed=1)


class _Trainer(TrainerBase):
    """Draws from every global RNG at each step, and logs one smoothed scalar."""

    def __init__(self):
        super().__init__()
        self.draws = {}

    def run_step(self):
        self.draws[self.iter] = (random.random(), float(np.random.rand()), float(torch.rand(())))
        self.storage.put_scalar("loss", self.draws[self.iter][2])


def _train(start, max_iter, state=None):
    trainer = _Trainer()
    history = WriterHistory(window=3)
    trainer.register_hooks([StepSeeds(5), history])
    if state is not None:
        history.load_state_dict(state)
    trainer.train(start, max_iter)
    with EventStorage(max_iter) as trainer.storage:
        pass
    return trainer


def test_step_draws_and_smoothed_history_continue_across_a_resume(caplog):
    whole = _train(0, 8)
    first = _Trainer()
    first.register_hooks([StepSeeds(5), WriterHistory(window=3)])
    first.train(0, 4)
    saved = first.state_dict()["hooks"]["WriterHistory"]
    assert [it for _, it in saved["history"]["loss"]] == [1, 2, 3]  # the window's last values
    resumed = _train(4, 8, state=saved)
    assert resumed.draws == {k: v for k, v in whole.draws.items() if k >= 4}
    assert _train(0, 8).draws == whole.draws
    with caplog.at_level(logging.WARNING):
        _train(4, 5)  # a checkpoint without the history: an earlier version's
    assert "written by an earlier version" in caplog.text


class _Sporadic(hooks.HookBase):
    """Scalars not put at every step: "kappa" before the step, from the first one on (so before the loss in the
    storage's order), every 5 iterations; "ap" after the step every 4."""

    def before_step(self):
        if self.trainer.iter % 5 == 0:
            self.trainer.storage.put_scalar("kappa", self.trainer.iter / 10, smoothing_hint=False)

    def after_step(self):
        if self.trainer.iter % 4 == 2:
            self.trainer.storage.put_scalar("ap", self.trainer.iter * 1.5, smoothing_hint=False)


class _Stop(hooks.HookBase):
    """Keeps the checkpoint state after iteration ``checkpoint``, then fails after iteration ``stop``."""

    def __init__(self, checkpoint, stop):
        self.checkpoint, self.stop, self.state = checkpoint, stop, None

    def after_step(self):
        if self.trainer.iter == self.checkpoint:
            self.state = self.trainer.state_dict()["hooks"]["WriterHistory"]
        if self.trainer.iter == self.stop:
            raise KeyboardInterrupt  # detectron2 still runs after_train: the writers flush


def _write_metrics(run_dir, start, *, state=None, stop=None):
    """A 16-iteration run writing metrics.json every 3 iterations, from ``start`` with a checkpoint's ``state``."""
    trainer = _Trainer()
    history = WriterHistory(str(run_dir / METRICS_FILENAME))
    trainer.register_hooks([StepSeeds(5), history])
    if state is not None:
        history.load_state_dict(state)
    written = truncate_metrics(str(run_dir), max_iteration=start - 1, size=history.metrics_size)
    writers = [JSONWriter(str(run_dir / METRICS_FILENAME))]
    continue_writers(writers, written)
    stopper = _Stop(*stop) if stop else None
    trainer.register_hooks([_Sporadic(), hooks.PeriodicWriter(writers, period=3), stopper])
    try:
        trainer.train(start, 16)
    except KeyboardInterrupt:
        pass
    return (run_dir / METRICS_FILENAME).read_text(), stopper and stopper.state


@pytest.mark.parametrize("checkpoint, stop", [(6, 6), (6, 9), (7, 12), (10, 10), (11, 13)])
def test_a_run_stopped_after_any_checkpoint_writes_the_uninterrupted_metrics(tmp_path, checkpoint, stop):
    (tmp_path / "whole").mkdir(), (tmp_path / "stopped").mkdir()
    whole, _ = _write_metrics(tmp_path / "whole", 0)
    # a write's lines in the storage's order: "kappa" came first; "ap" of 6 waits for the write of 8
    assert [json.loads(line)["iteration"] for line in whole.splitlines()] == [0, 2, 5, 8, 6, 10, 11, 14, 15]
    stopped, state = _write_metrics(tmp_path / "stopped", 0, stop=(checkpoint, stop))
    assert stopped != whole[: len(stopped)]  # the stop wrote a line the whole run does not (or not there)
    resumed, _ = _write_metrics(tmp_path / "stopped", checkpoint + 1, state=state)
    assert resumed == whole
