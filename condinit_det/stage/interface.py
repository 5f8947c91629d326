"""The interface a training stage implements, so that one launcher plans, runs, resumes and submits its runs.

A stage knows its configs and how to train or evaluate one run; the launcher (:mod:`condinit_det.launch`) owns the
rest once for every stage. A stage object holds no state: it is pickled into every training process and Slurm
element, and configs are loaded again in each process (:meth:`Stage.load_config`, then :meth:`Stage.configure_run`).
Bad input found by a stage raises :class:`~condinit_det.utils.errors.UsageError` (or ``ValueError`` /
``FileNotFoundError``): the launcher reports it in one line with exit status 2. How to add a stage:
docs/development.md.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..records.layout import RunSpec
from .descriptor import StageDescriptor

__all__ = ["ConfigDefaults", "RunOptions", "Stage"]


@dataclass(frozen=True)
class ConfigDefaults:
    """What a config says about the runs when the command line does not: where they go, the arm, the seed."""

    output_dir: str
    arm: str
    seed: int


@dataclass(frozen=True)
class RunOptions:
    """What a stage needs to know of the command line to check, train or evaluate a run.

    Args:
        config_file: the config as given (a path or ``zoo:<name>``), recorded with the results.
        resume: continue the run from its last checkpoint.
        eval_only: evaluate a checkpoint instead of training.
        trust_pickle: load checkpoints that need full unpickling.
        allow_shared_checkpoint: let several arms start from the same weights (detection).
        processes: training processes of one run, on all its machines together.
        submitted: the runs go to a cluster (the devices are checked where they run, not here).
    """

    config_file: str = ""
    resume: bool = False
    eval_only: bool = False
    trust_pickle: bool = False
    allow_shared_checkpoint: bool = False
    processes: int = 1
    submitted: bool = False


class Stage(abc.ABC):
    """One training stage. Subclasses set :attr:`descriptor` and the command's texts, and implement the methods.

    Attributes:
        descriptor: what the stage's runs record and how they are read (its name and unit among them).
        description: the command's one-line description.
        examples: the command's ``--help`` epilog.
        config_help: what ``--config-file`` accepts.
    """

    descriptor: StageDescriptor
    description: str = ""
    examples: str = ""
    config_help: str = ""

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def unit(self) -> str:
        return self.descriptor.unit

    # ------------------------------------------------------------------ configs
    @abc.abstractmethod
    def load_config(self, config_file: str, opts: Sequence[str]):
        """The config file (a path or ``zoo:<name>``) with the ``key=value`` overrides applied."""

    @abc.abstractmethod
    def defaults(self, cfg) -> ConfigDefaults:
        """The output directory, arm and seed a config gives."""

    @abc.abstractmethod
    def configure_run(self, cfg, spec: RunSpec, run_dir: str, *, init_from: Optional[str] = None):
        """``cfg`` set up for one run (in place; returned): arm, training seed, lr scale, output directory
        ``run_dir``. ``init_from``: a run directory of an earlier stage whose final weights this run starts from."""

    @abc.abstractmethod
    def length(self, cfg) -> int:
        """How long one run trains, in the descriptor's unit (warm-up and cool-down included)."""

    @abc.abstractmethod
    def steps(self, cfg) -> int:
        """Optimizer steps one run takes (what a cost estimate multiplies by the step time)."""

    @abc.abstractmethod
    def device(self, cfg) -> str:
        """``"cpu"`` or ``"cuda"``: where the run trains."""

    @abc.abstractmethod
    def identity(self, cfg) -> dict:
        """What a resumed run must share with the run it continues
        (:data:`condinit_det.records.identity.IDENTITY_KEYS`)."""

    # ------------------------------------------------------------------ checks
    @abc.abstractmethod
    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]], *,
              upstream: Optional[str] = None) -> None:
        """Everything that can be checked before a process starts (datasets, checkpoints, the arm's attention
        sites, batch splits, ...) for the planned ``(spec, configured cfg)`` runs; nothing is written. ``upstream``:
        the earlier stage's experiment directory the runs start from (its runs may not have finished yet)."""

    # ------------------------------------------------------------------ runs
    @abc.abstractmethod
    def finished(self, run_dir: str, length: int) -> bool:
        """Whether the run in ``run_dir`` trained ``length`` units and recorded its final evaluation."""

    @abc.abstractmethod
    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        """Train (or resume, with ``options.resume``) one run; called in every process of the run. A failure
        raises; a requeue raises :class:`~condinit_det.utils.preemption.Preempted`."""

    @abc.abstractmethod
    def evaluate(self, options: RunOptions, cfg, run_dir: str) -> None:
        """``--eval-only``: evaluate a checkpoint of the run and record it; called in every process."""

    def loader_workers(self, cfg) -> Optional[int]:
        """The data-loader worker processes per training process the config asks for (None: unknown)."""
        return None

    def set_loader_workers(self, cfg, workers: int) -> None:
        """Set the data-loader workers per training process (the launcher's share of a job's CPUs); a stage that
        cannot keeps the config's own."""
        return None

    def stale_files(self, run_dir: str) -> List[str]:
        """Files of an earlier run in ``run_dir`` that a fresh (not resumed) run must not find: they are
        deleted before it starts (its results and metrics are set aside, never deleted)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
