"""The interface a training stage implements, so that the launcher can plan, run, resume and submit its runs.

A stage knows its configs and how to train or evaluate one run; the launcher (:mod:`.experiment`,
:mod:`.cluster`, :mod:`.protocol`) owns everything else, once for every stage: the command line, the arm x seed x
lr-scale plan, one launch per run with failure records, resume and retry, the run's ownership, Slurm arrays and
elements, preemption, the report at the end. The two stages are :class:`condinit_det.engine.DetectionStage`
(detectron2 detectors) and :class:`condinit_det.pretrain.PretrainStage` (timm classification pretraining); a third
(e.g. DETR pretraining, segmentation) is one more subclass, with nothing to change in the launcher.

Stages import this module and nothing else of the launcher. A stage object holds no state: it is pickled into every
training process and Slurm element. Configs are loaded again in every process (:meth:`Stage.load_config`, then
:meth:`Stage.configure_run`), never sent.

Bad input found by a stage raises :class:`~condinit_det.utils.errors.UsageError` (or ``ValueError`` /
``FileNotFoundError``, which the launcher reports the same way: one line, exit status 2).
"""
from __future__ import annotations

import abc
import argparse
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..records.layout import RunSpec

__all__ = ["ConfigDefaults", "Stage"]


@dataclass(frozen=True)
class ConfigDefaults:
    """What a config says about the runs when the command line does not: where they go, the arm, the seed."""

    output_dir: str
    arm: str
    seed: int


class Stage(abc.ABC):
    """One training stage. Subclasses set the class attributes and implement the methods.

    Attributes:
        name: the stage's name in plans and reports (``"detection"``, ``"pretrain"``).
        unit: what :meth:`length` counts: ``"iteration"`` or ``"epoch"``.
        description: the command's one-line description.
        examples: the command's ``--help`` epilog.
        config_help: what ``--config-file`` accepts.
    """

    name: str = ""
    unit: str = "iteration"
    description: str = ""
    examples: str = ""
    config_help: str = ""

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
        """How long one run trains, in :attr:`unit` (iterations / epochs, warm-up and cool-down included)."""

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
    def check(self, args: argparse.Namespace, runs: List[Tuple[RunSpec, object]], *,
              upstream: Optional[str] = None) -> None:
        """Everything that can be checked before a process starts (datasets, checkpoints, the arm's attention
        sites, batch splits, ...) for the planned ``(spec, configured cfg)`` runs; nothing is written. The launcher
        checks the run identities of a resume itself. ``upstream``: the earlier stage's experiment directory the
        runs start from (its runs may not have finished yet)."""

    # ------------------------------------------------------------------ runs
    @abc.abstractmethod
    def finished(self, run_dir: str, length: int) -> bool:
        """Whether the run in ``run_dir`` trained ``length`` units and recorded its final evaluation."""

    @abc.abstractmethod
    def train(self, args: argparse.Namespace, cfg, run_dir: str) -> None:
        """Train (or resume, with ``args.resume``) one run; called in every process of the run. A failure
        raises; a requeue raises :class:`~condinit_det.utils.preemption.Preempted`."""

    @abc.abstractmethod
    def evaluate(self, args: argparse.Namespace, cfg, run_dir: str) -> None:
        """``--eval-only``: evaluate a checkpoint of the run and record it; called in every process."""

    def loader_workers(self, cfg) -> Optional[int]:
        """The data-loader worker processes per training process the config asks for (None: unknown)."""
        return None

    def set_loader_workers(self, cfg, workers: int) -> None:
        """Set the data-loader workers per training process (the launcher's share of a job's CPUs).

        The default does nothing: a stage that cannot set its loader workers keeps the config's own.
        """
        return None

    def stale_files(self, run_dir: str) -> List[str]:
        """Files of an earlier run in ``run_dir`` that a fresh (not resumed) run must not find: they are
        deleted before it starts (its results and metrics are set aside, never deleted)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
