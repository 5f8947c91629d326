"""Logging of the training processes: detectron2's logger setup into each run's own ``log.txt`` (colours on a
terminal only), the console line's ETA of both stages, which counts the evaluations to come, and the scalar history
a checkpoint carries so that a resumed run's writers smooth as the uninterrupted run's."""

from __future__ import annotations

import datetime
import logging
import sys
import warnings
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from detectron2.utils.events import CommonMetricPrinter

__all__ = ["ETAPrinter", "LOGGER_NAMES", "restore_scalar_history", "run_logging", "scalar_history"]

# Loggers whose handlers a run sets up: detectron2's own, fvcore's (checkpointers) and the project's.
LOGGER_NAMES = ("detectron2", "fvcore", "condinit_det")


def run_logging(output_dir: Optional[str], *, rank: int) -> None:
    """Log to the console (rank 0) and to ``<output_dir>/log.txt`` (``.rank<k>`` on other ranks; None: no file),
    instead of an earlier run's folder; and keep third-party notices off the run's console."""
    from detectron2.utils.logger import setup_logger

    # Notices of third-party code about its own coming changes (detectron2's torch.meshgrid and is_fx_tracing calls,
    # numpy 1 copy semantics, torch scripting forward-mode rules) or about a read-only array fvcore's flips only read,
    # on every run of either stage; the data loader's workers fork from this process and keep the filters.
    warnings.filterwarnings("ignore", message="torch.meshgrid: in an upcoming release", category=UserWarning)
    warnings.filterwarnings("ignore", message="__array__ implementation doesn't", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

    setup_logger.cache_clear()
    color = sys.stdout.isatty()  # log.txt is always plain; a piped console too
    for name in LOGGER_NAMES:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        setup_logger(output_dir, distributed_rank=rank, name=name, color=color)


class ETAPrinter(CommonMetricPrinter):
    """detectron2's console printer whose ETA (and the ``eta_seconds`` it stores) adds the evaluations to come.

    Args:
        max_iter: the run's length in the storage's iterations.
        seconds_left: iteration -> seconds the evaluations after it will take.
    """

    def __init__(self, max_iter: int, seconds_left: Callable[[int], float]):
        super().__init__(max_iter)
        self._seconds_left = seconds_left

    def _get_eta(self, storage) -> Optional[str]:
        try:
            step = storage.history("time").median(1000)
        except KeyError:  # no step timed yet: detectron2's own estimate
            return super()._get_eta(storage)
        eta = step * (self._max_iter - storage.iter - 1) + self._seconds_left(storage.iter)
        storage.put_scalar("eta_seconds", eta, smoothing_hint=False)
        return str(datetime.timedelta(seconds=int(eta)))


def scalar_history(storage, window: int = 20) -> Dict[str, List[Tuple[float, int]]]:
    """The last ``window`` ``(value, iteration)`` of each scalar of a detectron2 ``EventStorage``: what its writers
    smooth over (the median of 20)."""
    return {name: buffer.values()[-window:] for name, buffer in storage.histories().items()}


def restore_scalar_history(storage, history: Mapping[str, Sequence[Tuple[float, int]]]) -> None:
    """Put :func:`scalar_history`'s values back into a new ``storage``, not as its latest values (nothing to write)."""
    for name, values in history.items():
        for value, iteration in values:  # histories() is the storage's own table: it creates the buffer
            storage.histories()[name].update(value, iteration)
