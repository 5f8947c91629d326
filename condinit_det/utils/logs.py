"""Logging of the training processes: detectron2's logger setup, into each run's own ``log.txt``."""
from __future__ import annotations

import logging
from typing import Optional

__all__ = ["LOGGER_NAMES", "console_logging", "run_logging"]

# Loggers whose handlers a run sets up: detectron2's own, fvcore's (checkpointers) and the project's.
LOGGER_NAMES = ("detectron2", "fvcore", "condinit_det")


def _reset() -> None:
    from detectron2.utils.logger import setup_logger

    for name in LOGGER_NAMES:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
    setup_logger.cache_clear()


def run_logging(output_dir: Optional[str], *, rank: int) -> None:
    """Log to the console (rank 0) and to ``<output_dir>/log.txt`` (``log.txt.rank<k>`` on other ranks),
    dropping the handlers of an earlier run in the same process so that each run logs into its own folder."""
    from detectron2.utils.logger import setup_logger

    _reset()
    # Called exactly as detectron2's default_setup calls it (setup_logger's cache tells calls apart by how their
    # arguments are passed), so that default_setup afterwards adds no second handler.
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    setup_logger(output_dir, distributed_rank=rank)
    setup_logger(output_dir, distributed_rank=rank, name="condinit_det")


def console_logging() -> None:
    """The launcher's logging between runs: the console only."""
    run_logging(None, rank=0)
