"""Building blocks for submitting runs to Slurm with submitit; stage-agnostic (no detectron2/timm import).

- :func:`add_slurm_arguments` / :func:`make_executor`: the command-line flags of a submission and the
  :class:`submitit.SlurmExecutor` they configure (``--signal=USR2@<signal delay>`` before the time
  limit, array parallelism ``--max-parallel``, ``--slurm-extra`` passed to sbatch as is).
- :func:`submit`: a list of picklable callables as ONE job array (one callable: a plain job),
  optionally depending on earlier jobs through :func:`after` (``afterany:``/``afterok:`` on each
  listed job) or :func:`after_each` (element ``i`` of the new array waits for element ``i`` of an
  earlier array to succeed: Slurm's ``aftercorr:``).
- :func:`slurm_rendezvous`: ``(num_machines, machine_rank, num_gpus_per_machine, dist_url)`` for
  detectron2's ``launch`` inside an allocation; :func:`restart_count`: how often this job was requeued.

Job states come from ``squeue`` (:mod:`condinit_det.utils.squeue`), not ``sacct``: clusters without accounting
have none. What a job sees on the time-limit signal, on ``scancel`` and on ``scontrol requeue``, as observed with
submitit 1.5 on Slurm 22.05, and why the elements checkpoint the way they do: docs/slurm.md.
"""
import argparse
import os
import re
import shutil
import subprocess
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import submitit
from submitit.slurm.slurm import SlurmInfoWatcher

from ..utils.squeue import squeue_command

__all__ = [
    "add_slurm_arguments",
    "make_executor",
    "slurm_folder",
    "submit",
    "after",
    "after_each",
    "SqueueWatcher",
    "slurm_rendezvous",
    "first_hostname",
    "restart_count",
    "cancel_job",
    "parse_time_minutes",
]

# Sbatch option names accepted by --slurm-extra (e.g. "exclusive=true", "mail-type=END", "reservation=x").
_EXTRA_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")
_MEM = re.compile(r"^[0-9]+[KMGT]?$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_time_minutes(value: str) -> int:
    """A time limit as whole minutes: ``"90"`` (minutes), ``"HH:MM:SS"`` or ``"D-HH:MM:SS"`` (seconds round up)."""
    text = str(value).strip()
    if text.isdigit():
        minutes = int(text)
    else:
        m = _TIME.match(text)
        if m is None:
            raise argparse.ArgumentTypeError(
                f"invalid time {value!r}: give minutes (e.g. 90), HH:MM:SS (e.g. 01:30:00) or D-HH:MM:SS"
            )
        days, hours, mins, secs = (int(g) if g else 0 for g in m.groups())
        if mins >= 60 or secs >= 60:
            raise argparse.ArgumentTypeError(f"invalid time {value!r}: minutes and seconds must be below 60")
        minutes = (((days * 24 + hours) * 60 + mins) * 60 + secs + 59) // 60
    if minutes <= 0:
        raise argparse.ArgumentTypeError(f"invalid time {value!r}: the time limit must be at least one minute")
    return minutes


def _positive_int(name: str, minimum: int = 1) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"invalid {name} {value!r}: expected an integer >= {minimum}")
        return number

    return parse


def _mem(value: str) -> str:
    text = value.strip().upper()
    if text.endswith("B"):  # "64GB" is sbatch's "64G"
        text = text[:-1]
    if not _MEM.match(text):
        raise argparse.ArgumentTypeError(
            f"invalid memory {value!r}: expected a number with an optional unit K, M, G or T "
            "(e.g. 64G; 0 = all of the node's)"
        )
    return text


def _extra(value: str) -> Tuple[str, str]:
    key, sep, val = value.partition("=")
    key = key.strip().lstrip("-")
    if not sep or not _EXTRA_KEY.match(key) or not val:
        raise argparse.ArgumentTypeError(
            f"invalid --slurm-extra {value!r}: expected KEY=VALUE with an sbatch option name as KEY "
            "(e.g. reservation=mine, exclusive=true)"
        )
    return key.replace("_", "-"), val


def _name(kind: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise argparse.ArgumentTypeError(f"invalid {kind} {value!r}: expected a non-empty name without spaces")
        return value

    return parse


def add_slurm_arguments(parser: argparse.ArgumentParser, *, switch: bool = True) -> argparse.ArgumentParser:
    """Add the submission flags to ``parser`` (one argument group); returns the parser. ``switch``: with the
    ``--slurm`` flag itself (a command that always submits has only the resource flags).

    Each array element is one run with ``--nodes`` nodes, one Slurm task per node holding
    ``--gpus-per-node`` GPUs and ``--cpus-per-task`` CPUs. ``--slurm-folder`` defaults to ``None``:
    :func:`slurm_folder` puts it at ``<output_dir>/slurm``.
    """
    g = parser.add_argument_group("Slurm (submit the runs as a job array instead of running them here)")
    if switch:
        g.add_argument("--slurm", action="store_true", help="submit to Slurm with submitit and return")
    g.add_argument("--nodes", type=_positive_int("node count"), default=1, help="nodes per run (default 1)")
    g.add_argument(
        "--gpus-per-node", type=_positive_int("GPU count", 0), default=0, help="GPUs per node (default 0: CPU, gloo)"
    )
    g.add_argument(
        "--cpus-per-task", type=_positive_int("CPU count"), default=None,
        help="CPUs per node (one task per node); the run's processes on a node divide them into threads and "
        "data-loader workers (also for a run on this machine when given)")
    g.add_argument("--mem", type=_mem, default=None, help="memory per node, e.g. 64G (0: all of it)")
    g.add_argument(
        "--time", type=parse_time_minutes, default=60, help="time limit per job: minutes or HH:MM:SS (default 60)"
    )
    g.add_argument(
        "--signal-delay",
        type=_positive_int("signal delay"),
        default=120,
        help="seconds before the time limit at which the job gets USR2, checkpoints and requeues itself (default 120)",
    )
    g.add_argument(
        "--partition", type=_name("partition"), default=None, help="Slurm partition (default: the cluster's)"
    )
    g.add_argument("--account", type=_name("account"), default=None)
    g.add_argument("--qos", type=_name("QOS"), default=None)
    g.add_argument("--constraint", type=str, default=None, help="node features, sbatch syntax (e.g. 'a100|h100')")
    g.add_argument(
        "--slurm-extra",
        type=_extra,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other sbatch option, repeatable (e.g. --slurm-extra reservation=mine)",
    )
    g.add_argument(
        "--max-parallel", type=_positive_int("--max-parallel"), default=None, help="array elements running at once"
    )
    g.add_argument("--slurm-folder", default=None, help="submitit's scripts and logs (default <output_dir>/slurm/)")
    return parser


def slurm_folder(args: argparse.Namespace, output_dir: str) -> str:
    """Where submitit writes: ``--slurm-folder``, else ``<output_dir>/slurm``."""
    return args.slurm_folder or os.path.join(output_dir, "slurm")


def make_executor(args: argparse.Namespace, folder: str, name: str) -> submitit.SlurmExecutor:
    """A :class:`submitit.SlurmExecutor` writing into ``folder``, configured from :func:`add_slurm_arguments`'s flags.

    ``folder`` must be on a file system the compute nodes share. It holds one subfolder per job id:
    ``<job>/`` (a plain job: ``<job>_submission.sh``, ``<job>_0_log.out``/``.err``, pickles) or, for an
    array, ``<array>/<array>_submission.sh`` and ``<array>_<i>/<array>_<i>_0_log.out``/``.err`` per element.
    """
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        raise RuntimeError(
            "--slurm: sbatch/srun are not on PATH; run on a Slurm login node (or start tools/slurm_local.sh)"
        )
    executor = submitit.SlurmExecutor(folder=os.path.join(folder, "%j"))
    params: Dict[str, Any] = dict(
        job_name=name,
        nodes=args.nodes,
        ntasks_per_node=1,  # one process per node starts the run's workers (detectron2's launch)
        time=args.time,
        signal_delay_s=args.signal_delay,
    )
    if args.gpus_per_node:
        params["gpus_per_node"] = args.gpus_per_node
    optional = dict(
        cpus_per_task=args.cpus_per_task,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        constraint=args.constraint,
        array_parallelism=args.max_parallel,
    )
    params.update({k: v for k, v in optional.items() if v is not None})
    if args.mem is not None:
        params["mem"] = args.mem
    if args.slurm_extra:
        params["additional_parameters"] = dict(args.slurm_extra)
    executor.update_parameters(**params)
    return executor


def after(kind: str, jobs: Sequence[Union[submitit.Job, str]]) -> str:
    """Dependency on every job in ``jobs`` (submitit jobs or job ids): ``kind`` is ``"afterany"`` (ended in any
    way), ``"afterok"`` (succeeded) or ``"afternotok"``."""
    if kind not in ("afterany", "afterok", "afternotok"):
        raise ValueError(f"dependency kind {kind!r}: expected afterany, afterok or afternotok")
    if not jobs:
        raise ValueError("a dependency needs at least one job")
    return kind + ":" + ":".join(str(getattr(j, "job_id", j)) for j in jobs)


def cancel_job(job_id: str) -> None:
    """``scancel <job_id>``; raises RuntimeError when scancel refuses."""
    proc = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"scancel {job_id} failed: {proc.stderr.strip()}")


def after_each(jobs: Sequence[submitit.Job]) -> str:
    """Per-element dependency on the array ``jobs`` (as returned by :func:`submit`): element ``i`` of
    the next array starts once element ``i`` of ``jobs`` succeeded (Slurm's ``aftercorr``). An element
    whose predecessor failed or was cancelled stays pending (reason ``DependencyNeverSatisfied``)."""
    if len(jobs) == 1 and "_" not in str(jobs[0].job_id):
        return after("afterok", jobs)  # submit() sends one callable as a plain job, not an array
    array_ids = {str(j.job_id).split("_")[0] for j in jobs}
    if len(array_ids) != 1:
        raise ValueError(f"after_each needs the elements of one array, got jobs {[j.job_id for j in jobs]}")
    return "aftercorr:" + array_ids.pop()


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher reading this user's jobs from ``squeue`` instead of ``sacct``."""

    def _make_command(self) -> Optional[List[str]]:
        if not self._registered - self._finished:
            return None
        return squeue_command(fields="%i|%T|%N")

    def read_info(self, string) -> Dict[str, Dict[str, str]]:
        if not isinstance(string, str):
            string = string.decode()
        # submitit's parser expects sacct's header and expands array ranges such as 12_[1-3%1].
        return super().read_info("JobID|State|NodeList\n" + string)


# One watcher for all jobs: one squeue call per poll, at most every 10 s.
_WATCHER = SqueueWatcher(delay_s=10)


def submit(
    executor: submitit.SlurmExecutor, callables: Sequence[Callable[[], Any]], dependency: Optional[str] = None
) -> List[submitit.Job]:
    """Submit ``callables`` as one job array (a single callable: one plain job), after ``dependency``.

    ``dependency`` is sbatch's ``--dependency`` value, e.g. from :func:`after` or :func:`after_each`.
    The jobs' ``done()``, ``state``, ``wait()`` and ``result()`` work without ``sacct`` (:class:`SqueueWatcher`).
    """
    if not callables:
        raise ValueError("nothing to submit: the list of callables is empty")
    saved = dict(executor.parameters)
    if dependency:
        executor.update_parameters(dependency=dependency)
    try:
        with executor.batch():
            jobs = [executor.submit(fn) for fn in callables]
    finally:
        executor.parameters.clear()
        executor.parameters.update(saved)
    for job in jobs:
        job.watcher = _WATCHER
    return jobs


def first_hostname(nodelist: str) -> str:
    """First host of a Slurm node list (``"gpu[07-09,12],cpu1"`` -> ``"gpu07"``): ``scontrol show
    hostnames`` where it answers, else the same expansion here (zero padding kept)."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
            if out:
                return out[0]
        except (subprocess.SubprocessError, OSError):
            pass
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    # Each bracket contributes its first range's lower bound, as written ("07" stays "07").
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], nodelist[:end])


def _gpus_on_node(env) -> int:
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = env.get(var, "")
        if value:
            # SLURM_GPUS_PER_NODE may name the type ("a100:4"); the count is the last field.
            return int(value.split(":")[-1].split("(")[0])
    return 0


def slurm_rendezvous(cpu_processes_per_machine: int = 1, environ=None) -> Tuple[int, int, int, str]:
    """``(num_machines, machine_rank, num_gpus_per_machine, dist_url)`` for detectron2's ``launch``
    from Slurm's environment, in the one task per node of a job made by :func:`make_executor`.

    ``num_gpus_per_machine`` is the node's GPUs (``SLURM_GPUS_ON_NODE``), or
    ``cpu_processes_per_machine`` gloo processes on a node without GPUs. ``dist_url`` is
    ``tcp://<first node of SLURM_JOB_NODELIST>:<port>`` with the port derived from ``SLURM_JOB_ID``
    (10000-29999, below Linux's ephemeral range): every node computes the same one, two jobs on a
    node differ, and a requeued job keeps it.
    """
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        raise RuntimeError("slurm_rendezvous: not inside a Slurm job (SLURM_JOB_ID/SLURM_JOB_NODELIST are not set)")
    num_machines = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    machine_rank = int(env.get("SLURM_NODEID") or 0)
    gpus = _gpus_on_node(env)
    per_machine = gpus if gpus > 0 else cpu_processes_per_machine
    port = 10000 + int(env["SLURM_JOB_ID"]) % 20000
    return num_machines, machine_rank, per_machine, f"tcp://{first_hostname(env['SLURM_JOB_NODELIST'])}:{port}"


def restart_count(environ=None) -> int:
    """How many times this Slurm job was requeued (0 on its first run or outside Slurm)."""
    env = os.environ if environ is None else environ
    return int(env.get("SLURM_RESTART_COUNT") or 0)
