"""Plan an experiment of any stage, check it, and say what it would do and cost before anything is written.

An experiment is the arm x seed x lr-scale runs of one config, laid out as :mod:`condinit_det.records.layout` says.
:func:`plan_experiment` loads the config and checks every run: the stage's checks, the trackers, the resume identity,
that a fresh run does not start over an earlier one, and that an experiment it extends has the same setup.
:func:`run_actions` says what each run needs (train, resume, skip, or nothing while its Slurm job is in flight);
:func:`describe_plan` prints it with the cost (``--dry-run``): a run of ``steps`` optimizer steps at ``seconds``
per step of all its devices takes ``steps x seconds`` and costs that times its devices in device-hours (GPU-hours,
or CPU-hours for CPU runs); stage and total times are the runs one after another. Operational detail:
docs/training.md and docs/reproducing.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..init.options import CONTROLS
from ..records.failures import describe_failure, failure_of
from ..records.identity import check_resume_identity
from ..records.jobs import read_jobs
from ..records.layout import (
    RunSpec,
    parse_arms,
    parse_lr_scales,
    parse_seeds,
    plan_runs,
    read_plan,
    write_plan,
)
from ..records.lock import LOCK_FILENAME
from ..records.results import ResultsFile
from ..stage import RunOptions, Stage
from ..utils.errors import UsageError
from ..utils.squeue import query_jobs, still_runs

__all__ = [
    "STEP_BENCH_FORMAT",
    "Experiment",
    "RunCost",
    "StepTime",
    "describe_plan",
    "format_cost",
    "in_flight",
    "load_step_times",
    "plan_costs",
    "plan_experiment",
    "resolve_step_time",
    "run_actions",
]

STEP_BENCH_FORMAT = "condinit_det.step_bench/1"  # what bench/bench_gpu_step.py writes


@dataclass
class Experiment:
    """The planned runs of one config in one stage.

    Attributes:
        stage: the training stage.
        args: the command's flags (:func:`condinit_det.launch.arguments.build_parser`).
        base: the experiment directory; run ``spec`` lives in ``spec.path(base)``.
        runs: the planned runs, in training order.
        length: how long each run trains, in ``stage.descriptor.unit``.
        device: ``"cpu"`` or ``"cuda"``.
        upstream: an earlier stage's experiment directory: each run starts from the final weights of the run with
            the same arm and seed there (the paper's protocol: detection fine-tuned from each arm's pretraining).
        element: one run of a Slurm array (no plan written, no report at its end).
        trackers: the config's W&B / MLflow settings (:mod:`condinit_det.tracking`).
        setup, dataset, evaluation: what the runs share (:meth:`condinit_det.stage.Stage.setup`), their training
            data and the data their metrics are measured on.
        unreadable: runs whose records cannot be read, with why: they are not touched, the others go on.
        waiting: with ``--dry-run``, runs whose starting weights do not exist yet, with those weights' path
            (:meth:`condinit_det.stage.Stage.waits_for`).
    """

    stage: Stage
    args: argparse.Namespace
    base: str
    runs: List[RunSpec]
    length: int
    device: str
    upstream: Optional[str] = None
    element: bool = False
    trackers: Optional[dict] = None
    setup: Optional[dict] = None
    dataset: Optional[str] = None
    evaluation: Optional[str] = None
    unreadable: Dict[RunSpec, str] = field(default_factory=dict)
    waiting: Dict[RunSpec, str] = field(default_factory=dict)

    @property
    def options(self) -> RunOptions:
        """What the stage gets of the command line."""
        args = self.args
        return RunOptions(
            config_file=args.config_file or "",
            resume=bool(args.resume),
            eval_only=bool(args.eval_only),
            trust_pickle=bool(args.trust_pickle),
            allow_shared_checkpoint=bool(args.allow_shared_checkpoint),
            processes=int(args.num_gpus) * int(args.num_machines),
            submitted=bool(args.slurm),
            dry_run=bool(args.dry_run),
        )

    def run_dir(self, spec: RunSpec) -> str:
        return spec.path(self.base)

    def init_from(self, spec: RunSpec) -> Optional[str]:
        """The upstream run this run starts from (same arm and seed, the upstream's own learning rate)."""
        return RunSpec(spec.arm, spec.seed).path(self.upstream) if self.upstream else None

    def config(self, spec: RunSpec):
        """The run's config, loaded and set up afresh (every process calls this)."""
        cfg = self.stage.load_config(self.args.config_file, self.args.opts)
        return self.stage.configure_run(cfg, spec, self.run_dir(spec), init_from=self.init_from(spec))

    def finished(self, spec: RunSpec) -> bool:
        return self.stage.finished(self.run_dir(spec), self.length)

    def only(self, spec: RunSpec) -> "Experiment":
        """This experiment reduced to one of its planned runs, as a Slurm element runs it."""
        return dataclasses.replace(self, runs=[spec], element=True)

    def write_plan(self) -> str:
        """``<base>/experiment.json``: the runs the report and the status command expect. A plan only grows: the runs
        an earlier command planned there stay in it."""
        earlier = read_plan(self.base)
        runs = list(earlier.runs) if earlier is not None else []
        runs += [spec for spec in self.runs if spec not in runs]
        return write_plan(
            self.base,
            runs,
            stage=self.stage.descriptor,
            config=self.args.config_file or None,
            length=self.length,
            setup=self.setup,
            dataset=self.dataset,
            evaluation=self.evaluation,
        )


def plan_experiment(
    stage: Stage,
    args: argparse.Namespace,
    *,
    output_dir: Optional[str] = None,
    upstream: Optional[str] = None,
) -> Experiment:
    """Plan the runs ``args`` asks for and check everything that can be checked before a process starts (the
    stage's checks and those of every run's directory); nothing is written. Raises :class:`UsageError` (one line)
    on bad input.

    Args:
        stage: the training stage.
        args: the parsed flags (``--retry-failed`` and ``--slurm`` set ``args.resume``).
        output_dir: the experiment directory instead of the config's output directory.
        upstream: see :attr:`Experiment.upstream`.
    """
    try:
        return _plan(stage, args, output_dir=output_dir, upstream=upstream)
    except (ValueError, FileNotFoundError, KeyError) as e:  # the stages' checks: bad input, said in one line
        raise UsageError(" ".join(str(e).split())) from None


def _plan(stage: Stage, args, *, output_dir, upstream) -> Experiment:
    if args.retry_failed or args.slurm:
        args.resume = True  # a submission continues what exists: resubmitting is always safe
    if args.slurm and args.eval_only:
        raise UsageError("--slurm submits training runs; run --eval-only directly")
    if args.slurm and not args.dry_run and not (shutil.which("sbatch") and shutil.which("srun")):
        raise UsageError(
            "--slurm: sbatch/srun are not on PATH; run on a Slurm login node (or start tools/slurm_local.sh)"
        )
    if args.num_machines > 1 and args.dist_url == "auto" and not args.slurm:
        raise UsageError(
            f"--num-machines {args.num_machines} needs --dist-url tcp://HOST:PORT, the first machine's address, the "
            "same on every machine (auto picks a port of this machine only)"
        )
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap {args.bootstrap}: expected a number of resamples >= 0 (0: no intervals)")
    cfg = stage.load_config(args.config_file, args.opts)
    defaults = stage.defaults(cfg)
    base = output_dir or defaults.output_dir
    if not base:
        raise UsageError(
            "the config has no output directory (train.output_dir); runs go to <output_dir>/<arm>/seed<k>/"
        )
    arms = parse_arms(args.arm) if args.arm else [defaults.arm]
    seeds = parse_seeds(args.seeds) if args.seeds is not None else [defaults.seed]
    scales = parse_lr_scales(args.lr_scale) if args.lr_scale is not None else [1.0]
    if args.slurm:  # each array element runs with its allocation's processes
        args.num_machines = args.nodes
        args.num_gpus = args.gpus_per_node or args.num_gpus
    from ..tracking import check_trackers, tracker_settings

    experiment = Experiment(
        stage=stage,
        args=args,
        base=base,
        runs=plan_runs(arms, seeds, scales),
        length=stage.length(cfg),
        device=stage.device(cfg),
        upstream=upstream,
        trackers=tracker_settings(cfg),
        setup=stage.setup(cfg),
        dataset=stage.dataset(cfg),
        evaluation=stage.evaluation_data(cfg),
    )
    configured = [(spec, experiment.config(spec)) for spec in experiment.runs]
    stage.check(experiment.options, configured, upstream=upstream)
    norms = {stage.identity(run_cfg)["options"]["norm"] for spec, run_cfg in configured if spec.arm in CONTROLS}
    if len(norms) > 1:  # the report would compute no structure x scale effect from these runs
        raise UsageError(
            f"scale_matched and structured would match different norms ({', '.join(sorted(norms))}): set "
            "condinit.options.scale_matched.norm and condinit.options.structured.norm alike"
        )
    if args.dry_run:
        waits = {spec: stage.waits_for(run_cfg, upstream) for spec, run_cfg in configured}
        experiment.waiting = {spec: path for spec, path in waits.items() if path}
    if args.eval_only:
        return experiment
    check_trackers(experiment.trackers, base)
    _check_same_setup(experiment)
    for spec, run_cfg in configured:
        run_dir = experiment.run_dir(spec)
        if not args.resume:
            _check_empty(run_dir)
            continue
        try:
            ResultsFile(run_dir).records()
        except ValueError as e:  # a corrupt results file stays as it is; the other runs go on
            experiment.unreadable[spec] = str(e)
            continue
        check_resume_identity(run_dir, stage.identity(run_cfg), allow_change=args.allow_changed_run)
    return experiment


def _check_empty(run_dir: str) -> None:
    """One output directory, one run: a fresh run never starts over an earlier one's files."""
    held = sorted(set(os.listdir(run_dir)) - {LOCK_FILENAME}) if os.path.isdir(run_dir) else []
    if held:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UsageError(
            f"{run_dir} holds a run ({shown}): continue it with --resume (--retry-failed trains a "
            "failed run afresh), or choose another train.output_dir"
        )


def _check_same_setup(experiment: Experiment) -> None:
    """Runs added to an experiment (more seeds, arms, scales) have the setup of the runs it holds; resuming its own
    runs with another config (a longer schedule) changes the setup of them all."""
    earlier = read_plan(experiment.base)
    if earlier is None:
        return
    if earlier.stage and earlier.stage != experiment.stage.name:
        raise UsageError(
            f"{experiment.base} holds {earlier.stage} runs, not {experiment.stage.name} runs: use "
            "another train.output_dir"
        )
    if earlier.setup is None or experiment.setup is None:
        return
    keys = sorted(set(earlier.setup) | set(experiment.setup))
    differ = [k for k in keys if earlier.setup.get(k) != experiment.setup.get(k)]
    left_out = [spec for spec in earlier.runs if spec not in experiment.runs]
    if differ and (left_out or len(experiment.runs) > len(earlier.runs)):
        shown = "; ".join(
            f"{k}: {earlier.setup.get(k, '(none)')} vs {experiment.setup.get(k, '(none)')}" for k in differ[:5]
        )
        raise UsageError(
            f"{experiment.base} holds runs of another setup ({shown}{'; ...' if len(differ) > 5 else ''})"
            ": runs of two setups would not pool; change the setup of all its runs at once, or use "
            "another train.output_dir"
        )


# ---------------------------------------------------------------------------------------------
# What each run needs
# ---------------------------------------------------------------------------------------------
def in_flight(experiment: Experiment) -> Dict[RunSpec, str]:
    """The runs whose current Slurm job (``<base>/slurm.json``) may still run, with that job's id."""
    current = read_jobs(experiment.base)
    jobs = {spec: current[spec.dir] for spec in experiment.runs if spec.dir in current}
    states = query_jobs(list(jobs.values())).states
    return {spec: job for spec, job in jobs.items() if still_runs(states.get(job))}


def run_actions(experiment: Experiment, flying: Optional[Dict[RunSpec, str]] = None) -> List[Tuple[RunSpec, str, bool]]:
    """Per planned run: what running the command would do with it, and whether that trains (the resume rules of
    :mod:`condinit_det.launch.run`; with ``--slurm``, a run in ``flying`` keeps its job; default: :func:`in_flight`)."""
    if flying is None:
        flying = in_flight(experiment) if experiment.args.slurm else {}
    return [(spec, *_action(experiment, spec, flying)) for spec in experiment.runs]


def _action(experiment: Experiment, spec: RunSpec, flying: Dict[RunSpec, str]) -> Tuple[str, bool]:
    args, run_dir = experiment.args, experiment.run_dir(spec)
    if spec in experiment.unreadable:
        return f"skip: {experiment.unreadable[spec]}", False
    if spec in flying:
        return f"in flight as job {flying[spec]}: not resubmitted", False
    if not args.resume:
        return "train", True
    failure = failure_of(run_dir)
    if failure is not None and args.retry_failed:
        return f"train afresh ({describe_failure(failure)} earlier; moved aside)", True
    if failure is not None and failure.get("reason") == "diverged":
        return f"skip: {describe_failure(failure)} earlier (--retry-failed trains it afresh)", False
    if failure is not None:
        return f"resume ({describe_failure(failure)} earlier)", True
    if experiment.finished(spec):
        return "skip: finished", False
    if os.path.isdir(run_dir) and set(os.listdir(run_dir)) - {LOCK_FILENAME}:
        return "resume from its last checkpoint", True
    return "train", True


# ---------------------------------------------------------------------------------------------
# What it costs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTime:
    """Seconds per step of a run's whole group (None: unknown) and where they came from (the plan prints it)."""

    seconds: Optional[float] = None
    source: str = "unknown: pass --step-time or --step-bench"


@dataclass(frozen=True)
class RunCost:
    """One planned run: its stage, name, optimizer steps, devices (GPUs, or CPUs), their kind and the step time."""

    stage: str
    name: str
    steps: int
    devices: int
    step: StepTime
    device: str = "cuda"

    @property
    def wall(self) -> Optional[float]:
        return None if self.step.seconds is None else self.steps * self.step.seconds


def _same_config(query: str, key: str) -> bool:
    """One path's components end the other's, or ``query`` is ``key``'s file name, with or without ``.py``."""
    q, k = (
        [p for p in os.path.normpath(s.removeprefix("zoo:")).split(os.sep) if p not in ("", ".")] for s in (query, key)
    )
    if len(q) == 1 and k:
        return q[0] in (k[-1], os.path.splitext(k[-1])[0])
    n = min(len(q), len(k))
    return n > 0 and q[-n:] == k[-n:]


def load_step_times(path: str) -> Tuple[Dict[str, float], Dict[str, str], str]:
    """The file of ``bench/bench_gpu_step.py --output PATH``: ``({config: the default arm's median seconds per
    step}, {config: why its bench failed}, the device it was measured on)``. A file of another format, or measured
    with ``--tiny`` (not the recipes' sizes), is refused."""
    try:
        with open(path) as f:
            payload = json.load(f)
    except FileNotFoundError:
        raise UsageError(
            f"step bench file {path} does not exist (write it with bench/bench_gpu_step.py --output PATH)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path} is not a step bench file: {str(e).splitlines()[0]}") from None
    found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
    if found != STEP_BENCH_FORMAT:
        raise UsageError(f"{path} is not a step bench file: format {found!r}, expected {STEP_BENCH_FORMAT!r}")
    if payload.get("tiny"):
        raise UsageError(
            f"{path} was measured with --tiny: its step times are not the recipes'; measure at full size "
            "on a GPU (bench/bench_gpu_step.py --output PATH)"
        )
    # The bench always measures the default arm, and a recipe whose bench failed holds its error.
    configs = payload["configs"]
    failed = {key: entry["error"] for key, entry in configs.items() if entry["error"]}
    seconds = {key: entry["arms"]["default"]["median_step_s"] for key, entry in configs.items() if key not in failed}
    device = payload["device"]
    return seconds, failed, device["name"] if device["type"] == "cuda" else f"CPU {device['name']}"


def resolve_step_time(config: str, *, step_time: Optional[float] = None, step_bench: Optional[str] = None) -> StepTime:
    """``--step-time`` when given, else ``config``'s time in the ``--step-bench`` file (its path, a shorter one, a
    ``zoo:`` name or its file name), else unknown."""
    if step_time is not None and step_bench is not None:
        raise UsageError("--step-time and --step-bench both given; pass one")
    if step_time is not None:
        if not (math.isfinite(step_time) and step_time > 0):
            raise UsageError(f"--step-time must be a positive number, got {step_time!r}")
        return StepTime(step_time, f"given: --step-time {step_time:g}")
    if step_bench is None:
        return StepTime()
    seconds, failed, device = load_step_times(step_bench)
    matches = [k for k in list(seconds) + list(failed) if _same_config(config, k)]
    if len(matches) != 1:
        held = ", ".join(matches or list(seconds) + list(failed)) or "(none)"
        raise UsageError(
            f"config {config} {'matches several configs' if matches else 'is not'} in bench file "
            f"{step_bench}: {held}; give its path"
        )
    if matches[0] in failed:
        raise UsageError(
            f"bench file {step_bench} has no step time for {matches[0]}: its run failed ({failed[matches[0]]})"
        )
    return StepTime(
        seconds[matches[0]], f"measured: bench file {step_bench} on device {device} (default arm's median step)"
    )


def plan_costs(experiment: Experiment) -> List[RunCost]:
    """What each run that would train costs at the step time of ``--step-time`` or ``--step-bench``
    (:func:`resolve_step_time`); a stage priced at 0 steps is an error."""
    args = experiment.args
    step_time = resolve_step_time(args.config_file, step_time=args.step_time, step_bench=args.step_bench)
    trains = [spec for spec, _, trains in run_actions(experiment) if trains]
    if not trains:
        return []
    steps = experiment.stage.steps(experiment.config(experiment.runs[0]))
    if steps <= 0:
        raise UsageError(
            f"the {experiment.stage.name} runs would take {steps} optimizer steps: nothing to price "
            "(check the config's length and data)"
        )
    if experiment.device.startswith("cuda"):
        devices = int(args.num_gpus) * int(args.num_machines)
    else:
        devices = int(args.cpus_per_task or os.cpu_count() or 1) * int(args.num_machines)
    return [RunCost(experiment.stage.name, spec.dir, steps, devices, step_time, experiment.device) for spec in trains]


def _duration(seconds: float) -> str:
    """``h:mm`` rounded to the minute (``"151:05"``); ``"<0:01"`` under half a minute."""
    if 0 < seconds < 30:
        return "<0:01"
    hours, minutes = divmod(int(round(seconds / 60.0)), 60)
    return f"{hours}:{minutes:02d}"


def _row(label: str, stage: str, runs: Sequence[RunCost], devices: str = "") -> List[str]:
    """Wall time and device-hours of ``runs`` one after another: ``?`` when none has a step time, ``>= x`` when some
    have none."""
    known = [r for r in runs if r.wall is not None]
    steps = str(sum(r.steps for r in runs))
    if not known:
        return [label, stage, steps, devices, "?", "?"]
    prefix = ">= " if len(known) < len(runs) else ""
    hours = sum(r.wall * r.devices for r in known) / 3600.0
    wall = prefix + _duration(sum(r.wall for r in known))
    return [label, stage, steps, devices, wall, prefix + (f"{hours:.1f}" if hours >= 10 else f"{hours:.2f}")]


def format_cost(runs: Sequence[RunCost]) -> str:
    """The plan's cost: one row per run, a subtotal per stage (in the order stages first appear), the total; then
    how the times were computed and where each stage's step times came from."""
    from tabulate import tabulate

    if not runs:
        raise UsageError("no run to estimate: the plan is empty")
    kinds = {"GPU" if r.device.startswith("cuda") else "CPU" for r in runs}
    unit = kinds.pop() if len(kinds) == 1 else "device"
    stages: Dict[str, List[RunCost]] = {}
    for run in runs:
        stages.setdefault(run.stage, []).append(run)
    body, sources = [], []
    for stage, group in stages.items():
        body += [_row(r.name, stage, [r], str(r.devices)) for r in group]
        body.append(_row(f"subtotal {stage} ({len(group)} run{'s' * (len(group) != 1)})", stage, group))
        sources += [f"step time ({stage}): {source}" for source in dict.fromkeys(r.step.source for r in group)]
    body.append(_row(f"total ({len(runs)} run{'s' * (len(runs) != 1)})", "", runs))
    lines = [
        tabulate(
            body,
            ["run", "stage", "steps", f"{unit}s", "wall h:mm", f"{unit}-hours"],
            tablefmt="github",
            disable_numparse=True,
            colalign=("left", "left") + ("right",) * 4,
        ),
        f"wall time: steps x step time; subtotals and total: the runs one after another. {unit}-hours: wall time "
        f"x {unit}s. Evaluations are not included.",
        *sources,
    ]
    unknown = sum(r.wall is None for r in runs)
    if unknown:
        lines.append(f"{unknown} run(s) without a step time are not summed (>=): pass --step-time or --step-bench")
    return "\n".join(lines)


def describe_plan(experiment: Experiment, *, cost: bool = True) -> str:
    """The plan as text: a header (stage, config, length, processes per run), one line per run and, with ``cost``,
    the cost of the runs that would train."""
    from tabulate import tabulate

    args, stage = experiment.args, experiment.stage
    where = f"{experiment.options.processes} process(es) per run on {experiment.device}"
    where = ("Slurm: one job per run, " if args.slurm else "") + where
    steps = stage.steps(experiment.config(experiment.runs[0]))
    lines = [
        f"Plan of {experiment.base} ({stage.name}, {args.config_file}): {len(experiment.runs)} run(s) of "
        f"{experiment.length} {stage.descriptor.unit}s ({steps} optimizer steps) each; {where}"
    ]
    actions = run_actions(experiment)
    table = tabulate([(spec.dir, action) for spec, action, _ in actions], tablefmt="plain", disable_numparse=True)
    lines += ["  " + line.rstrip() for line in table.splitlines()]
    to_train = sum(trains for _, _, trains in actions)
    written = "nothing was written" + (" or submitted" if args.slurm else "")
    lines.append(f"{to_train} of {len(actions)} run(s) would train; {written}")
    for path in dict.fromkeys(experiment.waiting.values()):
        lines.append(f"waits for {path} ({'not finished yet' if os.path.isdir(path) else 'not trained yet'})")
    if cost and to_train:
        lines += ["", format_cost(plan_costs(experiment))]
    return "\n".join(lines)
