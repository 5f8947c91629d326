"""The interface a training stage implements, so that one launcher plans, runs, resumes and submits its runs
(docs/development.md#adding-a-third-stage). A stage object holds no state: it is pickled into every training process
and Slurm element. Bad input raises :class:`~condinit_det.utils.errors.UsageError`, ``ValueError`` or
``FileNotFoundError``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..records.layout import RunSpec
from .descriptor import StageDescriptor

__all__ = ["ConfigDefaults", "RunOptions", "Stage", "flat_config"]


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
        resume, eval_only, trust_pickle, allow_shared_checkpoint: the command's flags of these names.
        processes: training processes of one run, on all its machines together.
        submitted: the runs go to a cluster (the devices are checked where they run, not here).
        dry_run: only planned and priced: missing data, devices and earlier runs' weights are no error.
    """

    config_file: str = ""
    resume: bool = False
    eval_only: bool = False
    trust_pickle: bool = False
    allow_shared_checkpoint: bool = False
    processes: int = 1
    submitted: bool = False
    dry_run: bool = False


def _text(value) -> str:
    """A config value as stable text: objects by their qualified name, never by their address."""
    func = getattr(value, "func", None)
    if func is not None and hasattr(value, "keywords"):  # functools.partial
        args = ", ".join([_text(a) for a in value.args] + [f"{k}={_text(v)}" for k, v in value.keywords.items()])
        return f"partial({_text(func)}, {args})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return repr(value)


def flat_config(cfg, prefix: str = "") -> Dict[str, str]:
    """Every leaf of a config (OmegaConf, or nested dicts and lists) as ``{dotted key: text}``, interpolations kept."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    items = cfg.items() if isinstance(cfg, dict) else enumerate(cfg) if isinstance(cfg, list) else None
    if items is None:
        return {prefix.rstrip("."): _text(cfg)}
    flat = {}
    for key, value in items:
        flat.update(flat_config(value, f"{prefix}{key}."))
    return flat


class Stage(abc.ABC):
    """One training stage: subclasses set ``descriptor`` (what its runs record and how they are read) and ``run_keys``
    (the config keys a run sets for itself, left out of :meth:`setup`), and implement the methods."""

    descriptor: StageDescriptor
    run_keys: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.descriptor.name

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
        """What a resumed run must share with the run it continues (``records.identity.IDENTITY_KEYS``)."""

    def dataset(self, cfg) -> Optional[str]:
        """The name of the training data (a registered dataset, a folder), for the plan and the report."""
        return None

    def evaluation_data(self, cfg) -> Optional[str]:
        """The name of the data the headline metrics are measured on, for the plan and the report's titles."""
        return None

    def setup(self, cfg) -> Dict[str, str]:
        """What every run of an experiment shares: the loaded config without :attr:`run_keys`, as text
        (:func:`flat_config`); runs pool into one arm only when their setups match."""
        return {
            key: value
            for key, value in flat_config(cfg).items()
            if not any(key == k or key.startswith(k + ".") for k in self.run_keys)
        }

    @abc.abstractmethod
    def check(self, options: RunOptions, runs: List[Tuple[RunSpec, object]], *, upstream: Optional[str] = None) -> None:
        """Check all that can be before a process starts (datasets, checkpoints, the arm's sites, ...) for the planned
        ``(spec, configured cfg)`` runs, writing nothing; ``upstream``: the earlier stage's (maybe unfinished) runs."""

    @abc.abstractmethod
    def finished(self, run_dir: str, length: int) -> bool:
        """Whether the run in ``run_dir`` trained ``length`` units and recorded its final evaluation."""

    @abc.abstractmethod
    def train(self, options: RunOptions, cfg, run_dir: str) -> None:
        """Train (or resume) one run, in every process of the run; a requeue raises :class:`Preempted`."""

    @abc.abstractmethod
    def evaluate(self, options: RunOptions, cfg, run_dir: str) -> None:
        """``--eval-only``: evaluate a checkpoint of the run and record it; called in every process."""

    def waits_for(self, cfg, upstream: Optional[str] = None) -> Optional[str]:
        """The earlier run a configured run starts from (under ``upstream``, an earlier stage's experiment, or
        planned there), when its weights do not exist yet; None when they exist, the run starts from none, or the
        path names no run. A dry run plans such a run and names what it waits for."""
        return None

    def loader_workers(self, cfg) -> Optional[int]:
        """The data-loader workers per training process the config asks for (None: unknown)."""
        return None

    def set_loader_workers(self, cfg, workers: int) -> None:
        """Set the data-loader workers per training process (the launcher's share of a job's CPUs)."""
        return None
