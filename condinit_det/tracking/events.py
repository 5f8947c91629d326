"""detectron2's event writers, once more: the scalars of the event storage sent to the run's trackers.

Both stages write their scalars through detectron2's :class:`~detectron2.utils.events.EventStorage` (losses, learning
rate, timings, the AP of every evaluation, the conditioning hook's κ, ...), and their writers (``metrics.json``,
TensorBoard, the console) write them every log period. :class:`TrackerWriter` is one more such writer: each
:meth:`~TrackerWriter.write` sends the scalars not sent yet, smoothed as ``metrics.json`` has them, with their
iteration as the step.
"""
from __future__ import annotations

from collections import defaultdict
from typing import List, Optional, Sequence

from detectron2.utils.events import EventWriter, get_event_storage

from .runs import RunTracking, active_run

__all__ = ["TrackerWriter", "tracker_writers"]


class TrackerWriter(EventWriter):
    """Send the event storage's scalars to ``tracking`` (a :class:`~condinit_det.tracking.runs.RunTracking`).

    Args:
        tracking: the run's tracker runs.
        step_offset: added to the storage's iteration to give the step: 1 for detectron2's trainers (whose storage
            counts the iteration being run, from 0), 0 where the storage counts completed steps (pretraining).
        max_step: the largest step (detectron2's trainers: ``max_iter``, where the evaluation after the last
            iteration is stored at iteration ``max_iter``, already a count).
        exclude: prefixes of scalars left out (e.g. pretraining's ``eval/``, sent per epoch by the stage itself).
        window_size: the smoothing window of scalars that ask for smoothing (detectron2's default, 20).
    """

    def __init__(self, tracking: RunTracking, *, step_offset: int = 0, max_step: Optional[int] = None,
                 exclude: Sequence[str] = (), window_size: int = 20):
        self._tracking = tracking
        self._offset, self._exclude, self._window = int(step_offset), tuple(exclude), int(window_size)
        self._max = None if max_step is None else int(max_step)
        self._last = None

    def write(self):
        storage = get_event_storage()
        by_iteration = defaultdict(dict)
        for key, (value, iteration) in storage.latest_with_smoothing_hint(self._window).items():
            if (self._last is not None and iteration <= self._last) or key.startswith(self._exclude):
                continue
            by_iteration[iteration][key] = value
        for iteration in sorted(by_iteration):
            step = iteration + self._offset
            self._tracking.log_metrics(by_iteration[iteration], step if self._max is None else min(step, self._max),
                                       "iteration")
        if by_iteration:
            self._last = max(by_iteration)


def tracker_writers(*, step_offset: int = 0, max_step: Optional[int] = None, exclude: Sequence[str] = (),
                    tracking: Optional[RunTracking] = None) -> List[TrackerWriter]:
    """``[TrackerWriter]`` for the run this process tracks (``tracking``, else :func:`active_run`), or ``[]``
    when it tracks none (another process of the run, no tracker enabled): add it to a stage's writers."""
    tracking = tracking if tracking is not None else active_run()
    return [TrackerWriter(tracking, step_offset=step_offset, max_step=max_step, exclude=exclude)] if tracking else []
